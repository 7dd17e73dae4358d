"""The documented production layout, started from the Procfile's very lines: two gateway
processes, one API process, a Celery worker and beat, on a PostgreSQL database and a
Redis server of the test's own. One call through each gateway, an asynchronous task run
by the worker, and the calls' usage stored by the jobs beat schedules."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
from cryptography.fernet import Fernet
from django.conf import settings

from tests.support.inprocess import start_scripted_agent, stop_process
from tests.support.servers import free_port
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
                       reason="the production layout runs on PostgreSQL"),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


def wait_port(port: int, proc: subprocess.Popen, name: str) -> None:
    import socket

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, timeout=60, interval=0.1, message=f"{name} to listen on {port}")


@contextlib.contextmanager
def stopped_at_the_end(procs: list[subprocess.Popen]):
    """The processes stop (SIGTERM, as a process manager stops them) before the database
    and Redis they use go away."""
    try:
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
        stuck = []
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stuck.append(proc.name)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=10)
        assert not stuck, f"still running 30 s after SIGTERM: {stuck}"


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))


@contextlib.contextmanager
def own_redis(tmp_path: Path):
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc, "redis")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_process(proc)


@contextlib.contextmanager
def own_database():
    db = settings.DATABASES["default"]
    admin = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/postgres"
    name = f"reach_layout_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def start(name: str, command: str, env: dict, log: Path) -> subprocess.Popen:
    """One Procfile line, as a process manager runs it: through the shell."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**env, "PATH": f"{bin_dir}:{env.get('PATH', '')}"}
    with log.open("ab") as output:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=ROOT, env=env,
                                stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)
    proc.name = name
    return proc


def manage(env: dict, code: str) -> str:
    out = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_the_procfile_layout_serves_calls_through_both_gateways(tmp_path):
    lines = procfile()
    assert {"release", "api", "gateway-a", "gateway-b", "worker", "beat"} <= set(lines)
    agent_port = free_port()
    agent = start_scripted_agent(agent_port).proc
    procs: list[subprocess.Popen] = []
    log = tmp_path / "layout.log"
    try:
        with own_database() as database_url, own_redis(tmp_path) as redis_url, \
                stopped_at_the_end(procs):
            ports = {"API_PORT": free_port(), "GATEWAY_A_PORT": free_port(),
                     "GATEWAY_B_PORT": free_port()}
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("REACH_", "DATABASE_URL", "REDIS_URL",
                                        "DJANGO_SETTINGS_MODULE", "CELERY_"))}
            env.update(DATABASE_URL=database_url, REDIS_URL=redis_url,
                       REACH_SECRET_KEY="layout-" + uuid.uuid4().hex,
                       REACH_CREDENTIAL_KEYS=Fernet.generate_key().decode(),
                       REACH_DATA_DIR=str(tmp_path / "var"), REACH_LOG_LEVEL="INFO",
                       REACH_INTENT_EMBEDDER="lexical", API_WORKERS="1",
                       REACH_METRICS_NETWORKS="10.0.0.0/8", REACH_METRICS_TOKEN="scrape-me",
                       WORKER_CONCURRENCY="4", PYTHONUNBUFFERED="1",
                       REACH_OWN_PORTS=",".join(str(p) for p in ports.values()),
                       **{k: str(v) for k, v in ports.items()})
            (tmp_path / "var").mkdir()
            release = subprocess.run(["bash", "-c", lines["release"]], cwd=ROOT, env={
                **env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"},
                capture_output=True, text=True, timeout=300)
            assert release.returncode == 0, release.stderr
            key = manage(env, (
                "from tenants.models import Tenant; from tenants.services import "
                "api_key_create; t = Tenant.objects.create(slug='prod', name='Prod'); "
                "print(api_key_create(tenant=t, name='ops', scopes=['invoke', 'register', "
                "'read', 'manage']).plaintext)"))
            for name in ("api", "gateway-a", "gateway-b", "worker", "beat"):
                procs.append(start(name, lines[name], env, log))
            for name, port in (("api", ports["API_PORT"]),
                               ("gateway-a", ports["GATEWAY_A_PORT"]),
                               ("gateway-b", ports["GATEWAY_B_PORT"])):
                wait_port(port, next(p for p in procs if p.name == name), name)
            api = f"http://127.0.0.1:{ports['API_PORT']}"
            headers = {"Authorization": f"Bearer {key}"}
            registered = httpx.post(f"{api}/api/v1/agents/register", headers=headers,
                                    timeout=30, json={
                "agent_id": "layout-echo", "reach": {
                    "protocol": "http", "endpoint": f"http://127.0.0.1:{agent_port}/"},
                "capabilities": [{"id": "layout.echo", "path": "/echo"}]})
            assert registered.status_code == 201, registered.text
            gateways = [f"http://127.0.0.1:{ports[p]}" for p in ("GATEWAY_A_PORT",
                                                                 "GATEWAY_B_PORT")]
            request_ids = []
            for base in gateways:
                assert httpx.get(f"{base}/readyz", timeout=10).status_code == 200
                wait_for(lambda base=base: httpx.get(
                    f"{base}/v1/route", params={"capability": "layout.echo"},
                    headers=headers, timeout=5).status_code == 200,
                    timeout=30, interval=0.1, message=f"{base} to route layout.echo")
                rid = uuid.uuid4().hex
                reply = httpx.post(f"{base}/v1/invoke", headers={**headers, "X-Request-ID": rid},
                                   json={"capability": "layout.echo", "input": {"via": base}},
                                   timeout=30)
                assert reply.status_code == 200, reply.text
                assert reply.json()["output"]["echo"]["via"] == base
                request_ids.append(rid)
            # Metrics: not to a local process posing as the metrics network (uvicorn's
            # default believes X-Forwarded-For from 127.0.0.1); to the token.
            spoofed = httpx.get(f"{gateways[0]}/metrics", timeout=10,
                                headers={"X-Forwarded-For": "10.1.2.3"})
            assert spoofed.status_code == 403, spoofed.text[:300]
            assert httpx.get(f"{gateways[0]}/metrics", timeout=10, headers={
                "Authorization": "Bearer scrape-me"}).status_code == 200
            # The API process serves no gateway, and the gateways no API.
            assert httpx.post(f"{api}/v1/invoke", headers=headers, json={},
                              timeout=10).status_code == 404
            assert httpx.get(f"{gateways[0]}/api/v1/agents/", headers=headers,
                             timeout=10).status_code == 404
            # The worker runs an asynchronous task to its end.
            task = httpx.post(f"{gateways[1]}/v1/invoke", headers=headers, timeout=30, json={
                "capability": "layout.echo", "input": {"task": True}, "mode": "async"})
            assert task.status_code == 202, task.text
            task_url = f"{gateways[1]}{task.json()['links']['self']}"
            wait_for(lambda: httpx.get(task_url, headers=headers, timeout=10)
                     .json()["state"] == "completed", timeout=60, interval=0.2,
                     message="the worker to complete the task")
            # Beat schedules the usage consumer; the worker stores both calls' rows.
            wait_for(lambda: all(httpx.get(f"{api}/api/v1/usage/events/{rid}/",
                                           headers=headers, timeout=10).status_code == 200
                                 for rid in request_ids),
                     timeout=60, interval=0.5, message="the calls' usage rows")
    finally:
        stop_process(agent)
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    assert re.search(r"celery@\S+ ready", text), text[-3000:]
