"""A real Celery worker consuming the usage stream is SIGKILLed mid-way; a new one finishes.

Exactly-once end to end: every appended event becomes one row, none twice, none lost,
with real PostgreSQL, Redis and worker processes.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db.models import Count, Sum

from metering.ingest import GROUP, STREAM, usage_stream_append
from metering.models import UsageEvent
from reach_platform.celery import app
from tests import factories
from tests.support.servers import ROOT, worker_env

pytestmark = pytest.mark.skipif(
    not (settings.DATABASES["default"]["ENGINE"].endswith("postgresql") and settings.REDIS_URL),
    reason="needs a real worker on PostgreSQL and Redis (set DATABASE_URL and REDIS_URL; CI does)",
)

EVENTS = 10_000
# Small per task, so the first worker is surely killed with work left and entries in hand.
TASK_KWARGS = {"batch": 250, "max_batches": 2, "block_ms": 200,
               # A dead worker's entries are claimed after this long instead of 60 s.
               "claim_idle_ms": 2_000}
TIMEOUT_S = 120.0


class Worker:
    def __init__(self, name: str, queue: str, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "reach_platform", "worker", "-Q", queue,
                 "--pool=solo", "--concurrency=1", "-n", f"{name}@%h", "--loglevel=WARNING",
                 # A shared Redis: no chatter with whatever other workers use it.
                 "--without-mingle", "--without-gossip", "--without-heartbeat"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited with {self.proc.returncode}:\n"
                                 f"{self.log.read_text()[-4000:]}")


def _pending(client: redis.Redis) -> int:
    try:
        return client.xpending(STREAM(), GROUP)["pending"]
    except redis.ResponseError:  # no group yet: the worker has not started consuming
        return 0


@pytest.fixture
def isolated(settings, tmp_path):
    """This test's own stream prefix and Celery queue; both removed afterwards."""
    settings.REDIS_KEY_PREFIX = f"{settings.REDIS_KEY_PREFIX}crash-{uuid.uuid4().hex[:8]}:"
    queue = f"reach-test-metering-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    stream = STREAM()
    try:
        yield client, queue
    finally:
        client.delete(stream, f"_kombu.binding.{queue}")
        # The queue's list and its priority sub-lists are named after it.
        for key in client.scan_iter(match=f"{queue}*", count=1000):
            client.delete(key)
        # The killed worker's task (acks_late) waits in kombu's shared unacked hash, to be
        # requeued in an hour; only this queue's entries are removed.
        for tag, payload in client.hscan_iter("unacked"):
            if queue.encode() in payload:
                client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)
        client.close()


def test_a_killed_worker_neither_loses_nor_duplicates_usage(transactional_db, isolated,
                                                            tmp_path):
    client, queue = isolated
    tenant = factories.tenant()
    sent: dict[str, tuple[int, int]] = {}
    pipe = client.pipeline(transaction=False)
    for n in range(EVENTS):
        request_id = f"crash-{n}-{uuid.uuid4().hex[:6]}"
        sent[request_id] = (n % 97, n % 13 + 1)
        usage_stream_append(pipe, {
            "request_id": request_id, "tenant": tenant.pk, "agent": None, "capability": None,
            "instance": None, "outcome": "success", "input_tokens": n % 97,
            "output_tokens": n % 13 + 1, "cost": 0.001, "latency_ms": 5,
            "occurred_at": time.time(),
        })
        if n % 1000 == 999:
            pipe.execute()
    pipe.execute()
    assert client.xlen(STREAM()) == EVENTS

    env = worker_env(tmp_path / "data")
    log = tmp_path / "workers.log"
    workers: list[Worker] = []
    broker = app.connection_for_write(settings.REDIS_URL)

    def feed() -> None:
        """Keep a couple of consume tasks queued, as beat would, without piling them up."""
        if client.llen(queue) < 2:
            app.send_task("metering.consume_usage", kwargs=TASK_KWARGS, queue=queue,
                          connection=broker)

    started = time.monotonic()
    deadline = started + TIMEOUT_S
    try:
        workers.append(Worker(f"crash-a-{uuid.uuid4().hex[:6]}", queue, env, log))
        # Kill while the worker holds entries it has read and not acknowledged.
        killed_at = None
        while time.monotonic() < deadline:
            workers[0].check_alive()
            feed()
            rows = UsageEvent.objects.count()
            if rows >= 2_000 and (_pending(client) > 0 or rows >= EVENTS // 2):
                workers[0].kill()
                killed_at = (rows, _pending(client))
                break
            time.sleep(0.005)
        assert killed_at is not None, "the first worker never got going"
        rows_at_kill, pending_at_kill = killed_at
        assert rows_at_kill < EVENTS, "the first worker finished before it could be killed"

        workers.append(Worker(f"crash-b-{uuid.uuid4().hex[:6]}", queue, env, log))
        while time.monotonic() < deadline:
            workers[1].check_alive()
            feed()
            if (UsageEvent.objects.count() >= EVENTS and client.xlen(STREAM()) == 0
                    and _pending(client) == 0):
                break
            time.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        for worker in workers:
            worker.kill()
        broker.release()

    assert client.xlen(STREAM()) == 0 and _pending(client) == 0, (
        f"stream not drained within {TIMEOUT_S}s; log:\n{log.read_text()[-4000:]}")
    totals = UsageEvent.objects.aggregate(
        rows=Count("id"), ids=Count("request_id", distinct=True),
        input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"))
    assert totals == {
        "rows": EVENTS, "ids": EVENTS,
        "input_tokens": sum(i for i, _ in sent.values()),
        "output_tokens": sum(o for _, o in sent.values()),
    }
    assert set(UsageEvent.objects.values_list("request_id", flat=True)) == set(sent)
    # For the record (pytest -s): how the crash went and how long the whole run took.
    print(f"\nkilled at {rows_at_kill} rows with {pending_at_kill} entries unacknowledged; "
          f"{EVENTS} events stored exactly once in {elapsed:.1f}s", file=sys.stderr)
