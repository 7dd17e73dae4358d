"""10,000 calls through a real gateway while the Celery consumer is killed and restarted:
every call is stored once, and the rows add up to the gateway's own counters."""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid

import httpx
import pytest
import redis
from django.conf import settings
from django.db.models import Sum

from metering.ingest import GROUP, STREAM
from metering.models import UsageEvent
from reach_platform.celery import app
from tests.metering.test_consumer_crash import Worker
from tests.support.metrics import metric_value
from tests.support.servers import worker_env

pytestmark = pytest.mark.skipif(
    not (settings.DATABASES["default"]["ENGINE"].endswith("postgresql") and settings.REDIS_URL),
    reason="needs a real worker on PostgreSQL and Redis (.ci/run sets both)",
)

CALLS = 10_000
TASK_KWARGS = {"batch": 250, "max_batches": 4, "block_ms": 200, "claim_idle_ms": 2_000}


def test_a_killed_consumer_loses_and_duplicates_nothing_of_10000_calls(gateway, tmp_path):
    client = redis.Redis.from_url(settings.REDIS_URL)
    queue = f"reach-test-metering-{uuid.uuid4().hex[:8]}"
    env = worker_env(tmp_path / "data")
    broker = app.connection_for_write(settings.REDIS_URL)
    log = tmp_path / "workers.log"
    workers = [Worker(f"e2e-a-{uuid.uuid4().hex[:6]}", queue, env, log)]
    mine = UsageEvent.objects.filter(tenant=gateway.tenant)
    done = threading.Event()
    statuses: list[int] = []

    def call_all() -> None:
        limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
        with httpx.Client(base_url=gateway.base, timeout=30, limits=limits, headers={
                "Authorization": f"Bearer {gateway.key}"}) as http:

            def one(n: int) -> int:
                return http.post("/v1/invoke", json={
                    "capability": "chat.scripted", "input": {"text": "a b c"}}).status_code

            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                statuses.extend(pool.map(one, range(CALLS)))
        done.set()

    def feed() -> None:
        if client.llen(queue) < 2:
            app.send_task("metering.consume_usage", kwargs=TASK_KWARGS, queue=queue,
                          connection=broker)

    caller = threading.Thread(target=call_all, daemon=True)
    deadline = time.monotonic() + 240
    try:
        caller.start()
        while mine.count() < 2_000:  # first worker under way, calls still coming
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            workers[0].check_alive()
            feed()
            time.sleep(0.02)
        workers[0].kill()
        assert not done.is_set(), "all calls finished before the consumer could be killed"
        workers.append(Worker(f"e2e-b-{uuid.uuid4().hex[:6]}", queue, env, log))
        while not (done.is_set() and mine.count() >= statuses.count(200)
                   and client.xlen(STREAM()) == 0):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            workers[1].check_alive()
            feed()
            time.sleep(0.05)
    finally:
        for worker in workers:
            worker.kill()
        broker.release()
        client.delete(f"_kombu.binding.{queue}", queue)
        client.close()

    assert statuses.count(200) == CALLS
    metrics = httpx.get(f"{gateway.base}/metrics").text
    gateway_calls = metric_value(metrics, "reach_calls_total",
                                 {"endpoint": "invoke", "outcome": "success"})
    gateway_in = metric_value(metrics, "reach_tokens_total", {"direction": "input"})
    gateway_out = metric_value(metrics, "reach_tokens_total", {"direction": "output"})
    sums = mine.aggregate(i=Sum("input_tokens"), o=Sum("output_tokens"))
    assert mine.count() == mine.values("request_id").distinct().count() == CALLS
    assert gateway_calls == CALLS
    assert (sums["i"], sums["o"]) == (gateway_in, gateway_out) == (3 * CALLS, 4 * CALLS)
    assert not client.__class__.from_url(settings.REDIS_URL).xpending(
        STREAM(), GROUP)["pending"]
