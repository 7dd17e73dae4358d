"""Real servers on loopback for tests: the platform under uvicorn, started as a subprocess."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from cryptography.fernet import Fernet

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def platform_env(data_dir: Path, **overrides: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")
        and not k.startswith("REACH_")
    }
    env.update(
        DJANGO_SETTINGS_MODULE="reach_platform.settings",
        REACH_DATA_DIR=str(data_dir),
        REACH_SECRET_KEY="test-server-secret-" + os.urandom(8).hex(),
        REACH_CREDENTIAL_KEYS=Fernet.generate_key().decode(),
        PYTHONUNBUFFERED="1",
    )
    env.update(overrides)
    return env


def wait_until_serving(base_url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Poll /healthz until it answers; fail fast if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{base_url} did not start within {timeout}s")


@contextlib.contextmanager
def running(args: list[str], *, env: dict[str, str], port: int, log: Path) -> Iterator[str]:
    """Run ``python <args>`` until the block ends; yields the base URL."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_serving(base_url, proc)
        except Exception as exc:
            raise RuntimeError(f"{exc}; log:\n{log.read_text()[-4000:]}") from exc
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def uvicorn_args(port: int) -> list[str]:
    return [
        "-m", "uvicorn", "reach_platform.asgi:application", "--host", "127.0.0.1",
        "--port", str(port), "--lifespan", "off", "--log-level", "warning",
    ]


def _pg_cluster() -> str:
    return sorted(os.listdir("/etc/postgresql"))[-1]


def _pg_ready() -> bool:
    return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"],
                          check=False).returncode == 0


@contextlib.contextmanager
def postgres_stopped() -> Iterator[None]:
    """Stop the machine's PostgreSQL for the block; always start it again and wait for it.

    Callers must close Django's connections afterwards (they point at the old server).
    """
    cluster = ["pg_ctlcluster", "--skip-systemctl-redirect", _pg_cluster(), "main"]
    subprocess.run([*cluster, "stop", "-m", "fast"], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*cluster, "start"], check=False, capture_output=True)
        deadline = time.monotonic() + 60
        while not _pg_ready() and time.monotonic() < deadline:
            time.sleep(0.2)


@contextlib.contextmanager
def redis_stopped() -> Iterator[None]:
    """Stop the machine's Redis for the block; always start it again and wait for it."""
    subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", "6379", "shutdown", "nosave"],
                   check=False, capture_output=True)
    try:
        yield
    finally:
        subprocess.run(["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1",
                        "--port", "6379", "--save", "", "--appendonly", "no",
                        "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"],
                       check=False, capture_output=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "ping"], capture_output=True, check=False
        ).stdout.strip() != b"PONG":
            time.sleep(0.1)
