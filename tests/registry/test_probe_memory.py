"""Acceptance (issue 11): an agent whose /healthz streams 1 GiB costs a real Celery worker
less than 50 MB of peak memory, and the agent gets to send only what the socket buffers
hold before the probe hangs up (``registry.probe``: at most 4 KiB are read)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from celery.backends.redis import RedisBackend
from celery.result import AsyncResult
from django.conf import settings

from reach_platform.celery import app
from registry.choices import InstanceState
from registry.models import Instance
from tests import factories
from tests.support.servers import ROOT, worker_env

pytestmark = pytest.mark.skipif(
    not (settings.DATABASES["default"]["ENGINE"].endswith("postgresql") and settings.REDIS_URL),
    reason="needs a real worker on PostgreSQL and Redis (set DATABASE_URL and REDIS_URL; CI does)",
)

ONE_GIB = 1024 ** 3
CHUNK = b"x" * 65536
PEAK_GROWTH_LIMIT = 50_000_000  # bytes: "< 50 MB"
TASK_TIMEOUT_S = 120.0


class StreamingAgent:
    """Loopback agent: ``/healthz`` answers 200 with a 1 GiB body written from one 64 KiB
    chunk over and over (never held in memory), counting what it managed to write;
    ``/small`` answers a proper health reply."""

    def __init__(self) -> None:
        self.sent = 0
        self.hung_up = threading.Event()  # /healthz's writer saw the client go away
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                if self.path == "/small":
                    body = b'{"ok": true}'
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(ONE_GIB))
                self.end_headers()
                try:
                    while outer.sent < ONE_GIB:
                        self.wfile.write(CHUNK)
                        outer.sent += len(CHUNK)
                except OSError:
                    pass  # the probe hung up, as it should
                finally:
                    outer.hung_up.set()
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of ``pid``, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


@pytest.fixture
def queue():
    """This test's own Celery queue and result keys, removed afterwards."""
    name = f"reach-test-probe-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    task_ids: list[str] = []
    try:
        yield name, task_ids
    finally:
        client.delete(f"_kombu.binding.{name}", f"_kombu.binding_permanent.{name}",
                      *(f"celery-task-meta-{t}" for t in task_ids))
        for key in client.scan_iter(match=f"{name}*", count=1000):
            client.delete(key)
        client.close()


def test_a_1_gib_health_answer_costs_the_worker_under_50_mb(transactional_db, queue,
                                                               tmp_path):
    queue_name, task_ids = queue
    agent_server = StreamingAgent()
    tenant = factories.tenant()
    agent = factories.agent(owner=tenant, probe_path="/small")
    instance = factories.instance(agent=agent, endpoint=agent_server.base,
                                  state=InstanceState.OFFLINE)

    # The registry tasks ignore results; the test asks for this one's (below).
    env = worker_env(tmp_path / "data", CELERY_RESULT_BACKEND=settings.REDIS_URL)
    log = tmp_path / "worker.log"
    broker = app.connection_for_write(settings.REDIS_URL)
    results = RedisBackend(app=app, url=settings.REDIS_URL)

    def probe() -> dict[str, int]:
        """Run the real probe task in the worker and return what it returned."""
        sent = app.send_task("registry.probe_instances", queue=queue_name,
                             ignore_result=False, connection=broker)
        task_ids.append(sent.id)
        try:
            return AsyncResult(sent.id, backend=results, app=app).get(
                timeout=TASK_TIMEOUT_S, interval=0.05)
        except Exception as exc:
            raise AssertionError(f"the probe task failed: {exc!r}; worker log:\n"
                                 f"{log.read_text()[-4000:]}") from exc

    with log.open("ab") as out:
        # Solo pool: the task runs in the worker process itself, whose peak RSS is read.
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "reach_platform", "worker", "-Q", queue_name,
             "--pool=solo", "--concurrency=1", "-n", f"{queue_name}@%h", "--loglevel=WARNING",
             "--without-mingle", "--without-gossip", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        # Warm-up through the same path with a proper health answer: imports, the database
        # connection and the HTTP client are all paid for before the baseline is taken.
        assert probe() == {"probed": 1, "recovered": 1}
        Instance.objects.filter(pk=instance.pk).update(state=InstanceState.OFFLINE)
        agent.probe_path = "/healthz"
        agent.save(update_fields=["probe_path"])

        # Reset the kernel's peak-RSS mark (VmHWM) to the current RSS, so the peak read
        # afterwards is the probe's own; without it, compare against start-up's peak.
        with contextlib.suppress(OSError):
            Path(f"/proc/{worker.pid}/clear_refs").write_text("5")
        before = _memory(worker.pid)

        assert probe() == {"probed": 1, "recovered": 0}  # too big an answer: unhealthy
        after = _memory(worker.pid)
        assert agent_server.hung_up.wait(30), "the agent never saw the probe hang up"
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        broker.release()
        agent_server.close()

    growth = after["VmHWM"] - before["VmRSS"]
    print(f"\nworker RSS before {before['VmRSS'] / 1e6:.1f} MB (peak mark "
          f"{before['VmHWM'] / 1e6:.1f} MB), peak after the probe {after['VmHWM'] / 1e6:.1f} MB: "
          f"growth {growth / 1e6:.2f} MB; the agent wrote {agent_server.sent:,} of "
          f"{ONE_GIB:,} bytes", file=sys.stderr)
    assert growth < PEAK_GROWTH_LIMIT, (before, after)
    # Only what the loopback socket buffers absorbed before the hang-up, not the gigabyte.
    assert agent_server.sent < ONE_GIB // 16, agent_server.sent
    assert Instance.objects.get(pk=instance.pk).state == InstanceState.OFFLINE
