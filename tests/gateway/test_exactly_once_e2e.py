"""Money and exactly-once across two real gateway processes on PostgreSQL and Redis:
budgets that hold under concurrency, limits shared exactly, idempotency keys that survive
a SIGKILL, and keyed calls that get a clear answer while Redis is away."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import sys
import threading
import time
import uuid
from decimal import Decimal

import httpx
import pytest
from django.conf import settings

from registry.models import Agent
from registry.snapshot import current_version
from tenants.models import Quota
from tests.gateway.conftest import another_gateway, gateway_env, wait_for_table
from tests.support.servers import ROOT, free_port, uvicorn_args, wait_until_serving
from tests.support.waiting import wait_for

# Every outage here is Redis refusing connections (a cut forwarder), never Redis hung:
# so the gateways may wait long on a working Redis. With the default second, a saturated
# machine (a late event loop) made a working Redis look hung, and the gateways ran the
# limits per process: 171 admitted where 75 may (tests/gateway/test_redis_gate.py owns
# the hung case).
PATIENT = {"REACH_REDIS_TIMEOUT_S": "30"}

pytestmark = [
    pytest.mark.skipif(
        not (settings.REDIS_URL
             and settings.DATABASES["default"]["ENGINE"].endswith("postgresql")),
        reason="needs the machine's PostgreSQL and Redis (.ci/run sets them)"),
    pytest.mark.gateway_env(**PATIENT),
]

ECHO = {"capability": "echo.all", "input": {}}


def clients(bases, key):
    return [httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {key}"})
            for base in bases]


def fire(pool_clients, n: int, body=ECHO, headers=None) -> list[int]:
    """``n`` concurrent calls spread over the clients' gateways; their statuses. Each thread
    calls through clients of its own, made like ``pool_clients``: one httpx client shared
    by 50 threads once failed a run with the client's own EBADF (no gateway answer)."""
    local = threading.local()
    made: list[httpx.Client] = []
    lock = threading.Lock()

    def client_for(i: int) -> httpx.Client:
        if not hasattr(local, "clients"):
            local.clients = [httpx.Client(base_url=c.base_url, timeout=c.timeout,
                                          headers=c.headers) for c in pool_clients]
            with lock:
                made.extend(local.clients)
        return local.clients[i % len(pool_clients)]

    def one(i: int) -> int:
        return client_for(i).post("/v1/invoke", json=body,
                                  headers=headers(i) if headers else None).status_code

    try:
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            return list(pool.map(one, range(n)))
    finally:
        for client in made:
            client.close()


def test_budgets_hold_under_concurrency_over_two_gateways(gateway, tmp_path):
    agent = Agent.objects.get(name="scripted")
    agent.price_per_call = Decimal("0.1")
    agent.save()
    quota = Quota.objects.create(tenant=gateway.tenant, monthly_cost=Decimal("1.0"))
    with another_gateway(tmp_path, "second", **PATIENT) as second:
        bases = (gateway.base, second)
        both = clients(bases, gateway.key)
        try:
            spent = Decimal(0)
            for round_ in range(5):
                if round_:
                    quota.monthly_cost = spent + Decimal("1.0")  # Q = 1.0 left again
                    quota.save()
                wait_for_table(bases, current_version())
                if round_ == 2:  # failing calls (a refused redirect) reserve, then release
                    # One after another: concurrently, more than ten would rightly be
                    # refused while the first ten hold their reservations.
                    failing = [both[i % 2].post("/v1/invoke", json={
                        "capability": "redirect.op", "input": {}}).status_code
                        for i in range(20)]
                    assert set(failing) == {502}
                statuses = fire(both, 100)
                assert set(statuses) <= {200, 429}
                admitted = statuses.count(200)
                # At 0.1 a call, Q = 1.0 admits exactly ten, whatever the interleaving.
                assert admitted == 10, (round_, admitted)
                spent += Decimal("0.1") * admitted
            quota.delete()
            requests = Quota.objects.create(tenant=gateway.tenant, monthly_requests=57)
            wait_for_table(bases, current_version())
            statuses = fire(both, 100)  # 50 requests used so far: 7 left
            assert statuses.count(200) == 7 and statuses.count(429) == 93
            requests.delete()
        finally:
            for client in both:
                client.close()


@pytest.mark.gateway_via_forwarders
def test_a_limit_is_exact_over_two_gateways_and_bounded_without_redis(gateway, tmp_path):
    """L = 60 a minute with a burst of 60: ten times L in one window admits the burst plus
    what refilled meanwhile (one a second), never more; without Redis each process keeps
    its own bucket, so at most twice that."""
    Quota.objects.create(tenant=gateway.tenant, requests_per_minute=60, burst=60)
    redis_url = gateway.redis.url(settings.REDIS_URL)
    with another_gateway(tmp_path, "second", redis_url=redis_url, **PATIENT) as second:
        bases = (gateway.base, second)
        wait_for_table(bases, current_version())
        both = clients(bases, gateway.key)
        try:
            started = time.monotonic()
            statuses = fire(both, 600)
            elapsed = time.monotonic() - started
            admitted = statuses.count(200)
            assert 60 <= admitted <= 60 + int(elapsed), (admitted, elapsed)
            print(f"limit L=60: admitted {admitted} of 600 in {elapsed:.2f} s "
                  f"({admitted / 60:.3f} L)")
            with gateway.redis.outage():
                started = time.monotonic()
                statuses = fire(both, 600)
                elapsed = time.monotonic() - started
            assert set(statuses) <= {200, 429}
            fallback = statuses.count(200)
            assert 60 <= fallback <= 2 * (60 + int(elapsed)), (fallback, elapsed)
            print(f"without Redis: admitted {fallback} of 600 in {elapsed:.2f} s")
        finally:
            for client in both:
                client.close()


def test_keys_in_flight_when_a_gateway_is_killed_run_again_once_their_lease_lapses(
        gateway, tmp_path):
    run_id = uuid.uuid4().hex
    keys = [f"{run_id}-{i}" for i in range(40)]
    port = free_port()
    log = tmp_path / "doomed.log"
    with log.open("wb") as out:
        doomed = subprocess.Popen([sys.executable, *uvicorn_args(port)], cwd=ROOT,
                                  env=gateway_env(tmp_path, **PATIENT), stdout=out,
                                  stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base, doomed)
        [client] = clients([base], gateway.key)

        def send(key: str):
            try:
                return client.post("/v1/invoke", headers={"Idempotency-Key": key},
                                   json={"capability": "slow.op", "input": {"k": key}})
            except httpx.TransportError:
                return None

        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            pending = [pool.submit(send, key) for key in keys]
            wait_for(lambda: sum(1 for e in gateway.seen() if run_id in repr(e.get("body")))
                     >= 40, timeout=20, interval=0.05, message="all 40 calls at the agent")
            doomed.send_signal(signal.SIGKILL)
            lost = [f.result() for f in pending]
        client.close()
    finally:
        if doomed.poll() is None:
            doomed.kill()
        doomed.wait()
    assert all(r is None for r in lost)  # every caller lost its reply with the gateway
    with another_gateway(tmp_path, "restarted", **PATIENT) as restarted:
        [client] = clients([restarted], gateway.key)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            replies = list(pool.map(
                lambda key: client.post("/v1/invoke", headers={"Idempotency-Key": key},
                                        json={"capability": "slow.op", "input": {"k": key}}),
                keys))
        elapsed = time.monotonic() - started
        client.close()
    assert [r.status_code for r in replies] == [200] * 40, [r.text for r in replies[:3]]
    lease_s = 5.0 + 5.0  # slow.op's 5 s timeout, plus the margin
    assert elapsed <= lease_s + 5, elapsed
    runs = [e for e in gateway.seen() if run_id in repr(e.get("body"))]
    for key in keys:
        mine = [e for e in runs if e["body"] == {"k": key}]
        assert 1 <= len(mine) <= 2, (key, len(mine))
        assert {e["idempotency_key"] for e in mine} == {key}


@pytest.mark.gateway_via_forwarders
def test_keyed_calls_get_a_clear_503_while_redis_is_away_and_no_500_after(gateway):
    run_id = uuid.uuid4().hex
    with gateway.client() as client:
        def keyed(i: int, tag: str) -> httpx.Response:
            return client.post("/v1/invoke", json={"capability": "echo.all",
                                                   "input": {"n": i}},
                               headers={"Idempotency-Key": f"{run_id}-{tag}-{i}"})

        assert keyed(0, "before").status_code == 200
        with gateway.redis.outage():
            during = [keyed(i, "during") for i in range(20)]
        assert {r.status_code for r in during} == {503}
        assert during[0].json()["error"]["code"] == "idempotency_unavailable"
        assert during[0].headers["retry-after"] == "1"
        after = [keyed(i, "after") for i in range(100)]
        # Idle pooled connections dropped under the client (as by CLIENT KILL or a
        # Redis restart): the next calls must not see them as errors.
        gateway.redis.cut()
        gateway.redis.restore()
        after += [keyed(i, "after-kill") for i in range(100)]
    assert [r.status_code for r in after] == [200] * 200


def test_a_mixed_workload_over_two_gateways_stores_one_row_per_call_with_its_outcome(
        gateway, tmp_path):
    """Successes, agent 500s, time-outs, rate-limited, over-budget, invalid input and a
    client that goes away mid-stream, over two gateways; the rows come from the Redis
    stream through the metering consumer into PostgreSQL."""
    import redis as redis_sync

    from metering.ingest import usage_stream_consume
    from metering.models import UsageEvent
    from registry.services import agent_register
    from registry.spec import AgentSpec, CapabilitySpec

    endpoint = f"http://127.0.0.1:{gateway.agent_port}/"
    mixed = agent_register(tenant=gateway.tenant, spec=AgentSpec(
        name="mixed", endpoint=endpoint, capabilities=(
            CapabilitySpec(capability_id="mixed.fail", path="/fail"),
            CapabilitySpec(capability_id="mixed.limited", path="/echo", qps=1, burst=2),
        ))).agent
    budgeted = agent_register(tenant=gateway.tenant, spec=AgentSpec(
        name="budgeted", endpoint=endpoint, capabilities=(
            CapabilitySpec(capability_id="budgeted.echo", path="/echo"),))).agent
    Quota.objects.create(tenant=gateway.tenant, agent=budgeted, monthly_requests=1)
    chat = Agent.objects.get(name="scripted-chat")
    mine = UsageEvent.objects.filter(tenant=gateway.tenant)
    with another_gateway(tmp_path, "second", **PATIENT) as second:
        bases = (gateway.base, second)
        wait_for_table(bases, current_version())
        first, other = clients(bases, gateway.key)
        sent: dict[str, str] = {}  # request id -> expected outcome
        usage: dict[str, int] = {}  # request id -> tokens the agent reported

        def call(client, body, expected, **headers):
            rid = uuid.uuid4().hex
            reply = client.post("/v1/invoke", json=body, headers={"X-Request-ID": rid,
                                                                   **headers})
            sent[rid] = expected
            return rid, reply

        try:
            for i in range(3):
                rid, reply = call((first, other)[i % 2], {
                    "capability": "chat.scripted", "input": {"text": f"one two {i}"}},
                    "success")
                body = reply.json()["usage"]
                usage[rid] = body["input_tokens"] + body["output_tokens"]
            for expected in ("success", "quota_exceeded"):  # a budget of one request
                call(other, {"capability": "budgeted.echo", "input": {}}, expected)
            call(first, {"capability": "mixed.fail", "input": {}}, "upstream_error")
            call(other, {"capability": "slow.op", "input": {}}, "deadline_exceeded",
                 **{"X-Reach-Deadline-Ms": "300"})
            for expected in ("success", "success", "rate_limited"):
                call(first, {"capability": "mixed.limited", "input": {}}, expected)
            call(other, {"capability": "echo.all", "input": {"x": 1},
                         "params": {"unknown": []}} | {"stream": "yes"}, "invalid_input")
            rid = uuid.uuid4().hex
            with first.stream("POST", "/v1/invoke", headers={"X-Request-ID": rid}, json={
                    "capability": "chat.scripted", "stream": True,
                    "input": {"text": "slowly " + "word " * 60}}) as stream:
                next(stream.iter_bytes())  # the first event, then the caller goes away
            sent[rid] = "client_cancelled"
        finally:
            first.close()
            other.close()
    client = redis_sync.Redis.from_url(settings.REDIS_URL)
    try:
        def stored() -> bool:
            usage_stream_consume(client=client, consumer="mixed-test", block_ms=100,
                                 max_batches=10)
            return mine.filter(request_id__in=list(sent)).count() >= len(sent)

        wait_for(stored, timeout=30, interval=0.1, message="every call's usage row")
    finally:
        client.close()
    rows = {e.request_id: e for e in mine.filter(request_id__in=list(sent))}
    assert {rid: row.outcome for rid, row in rows.items()} == sent  # one row each
    for rid, tokens in usage.items():
        assert rows[rid].input_tokens + rows[rid].output_tokens == tokens
    assert all(row.cost == 0 for row in rows.values() if row.outcome != "success")
    assert rows[rid].agent_id == chat.pk  # the cancelled stream: metered to its agent
    assert mixed.pk in {row.agent_id for row in rows.values()}
