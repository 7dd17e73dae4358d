"""Real servers on loopback for tests: the platform under uvicorn, started as a subprocess.

To take PostgreSQL or Redis away from a process under test, point it at a
``tests.support.forwarder.Forwarder`` and cut that: never stop the machine's own servers,
which other test runs share.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
from cryptography.fernet import Fernet

from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


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
        # Shedding on event-loop lag reacts to how busy the machine is; no test may. A
        # test of it sets a value (and injects the lag).
        REACH_GATEWAY_MAX_LOOP_LAG_MS="0",
        # Words only unless a test asks for the sentence encoder (2 s and 80 MB a process).
        REACH_INTENT_EMBEDDER="lexical",
    )
    env.update(overrides)
    return env


def worker_env(data_dir: Path, **overrides: str) -> dict[str, str]:
    """``platform_env`` for a Celery worker on this test run's PostgreSQL and Redis, with
    the test process's secret and credential keys (so it reads what the test wrote)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    return platform_env(
        data_dir,
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        REDIS_URL=settings.REDIS_URL, REACH_REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX,
        CELERY_BROKER_URL=settings.REDIS_URL, REACH_SECRET_KEY=settings.SECRET_KEY,
        REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS), **overrides,
    )


def wait_until_serving(base_url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Poll /healthz until it answers; fail fast if the process died."""

    def serving() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            return httpx.get(f"{base_url}/healthz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(serving, timeout=timeout, interval=0.05, message=f"{base_url} to start")


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


ALL_IN_ONE = "reach_platform.asgi:application"
GATEWAY_ONLY = "reach_platform.gateway_asgi:application"


def uvicorn_args(port: int, app: str = ALL_IN_ONE) -> list[str]:
    return [
        "-m", "uvicorn", app, "--host", "127.0.0.1",
        "--port", str(port), "--lifespan", "on", "--log-level", "warning",
        "--http", "reach_platform.http_protocol:GuardedHttpToolsProtocol",
        "--no-proxy-headers",
    ]
