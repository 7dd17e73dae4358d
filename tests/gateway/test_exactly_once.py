"""Money and exactly-once, in process: budgets that cannot overshoot, idempotency claims
that lapse, the key carried to the agent, and one usage event per call.

Real loopback agents; the gateway runs around hand-built route tables. The same
guarantees across two gateway processes on PostgreSQL and Redis are in
tests/gateway/test_exactly_once_e2e.py.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from gateway import idempotency
from gateway.breaker import CircuitBreakers
from gateway.budgets import Amount, MemoryBudgets, RedisBudgets, ScopeLimit
from gateway.idempotency import MemoryStore, Outcome, RedisStore, Stored
from tests.support.clock import FakeClock
from tests.support.inprocess import (
    in_process,
    quota,
    route_table,
    scripted_agents,
    with_instances,
)
from tests.support.lossy import LossyProxy
from tests.support.servers import free_port

needs_redis = pytest.mark.skipif(not settings.REDIS_URL,
                                 reason="needs the machine's Redis (.ci/run sets REDIS_URL)")



def run(coroutine):
    return asyncio.run(coroutine)


def invoke(capability: str, **input_) -> dict:
    return {"capability": capability, "input": input_}


# ---- budgets ----------------------------------------------------------------------------------


def test_concurrent_calls_cannot_overshoot_a_cost_or_request_budget(scripted):
    agents = scripted_agents(scripted.endpoint)  # echo.all costs 0.5 a call
    by_cost, key = route_table(agents, quotas=(quota(monthly_cost=5.0),))
    by_requests, key2 = route_table(agents, quotas=(quota(monthly_requests=7),))

    async def burst(table, key) -> list[int]:
        async with in_process(table, key) as gw:
            replies = await asyncio.gather(*(gw.post("/v1/invoke", invoke("echo.all", n=i))
                                             for i in range(100)))
            return [r.status_code for r in replies]

    cost_statuses = run(burst(by_cost, key))
    request_statuses = run(burst(by_requests, key2))
    assert cost_statuses.count(200) == 10 and cost_statuses.count(429) == 90
    assert request_statuses.count(200) == 7 and request_statuses.count(429) == 93


def test_a_failing_agent_consumes_no_budget(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint),
                             quotas=(quota(monthly_cost=5.0, monthly_requests=10),))

    async def scenario():
        # The failing and the working capability share an instance: keep its breaker shut.
        async with in_process(table, key, breakers=CircuitBreakers(min_volume=1000)) as gw:
            failed = [await gw.post("/v1/invoke", invoke("fail.op")) for _ in range(20)]
            served = [await gw.post("/v1/invoke", invoke("echo.all")) for _ in range(11)]
            return failed, served, gw.usage.drain()

    failed, served, events = run(scenario())
    assert {r.status_code for r in failed} == {502}
    assert [r.status_code for r in served] == [200] * 10 + [429]
    assert sum(e["cost"] for e in events) == 5.0  # the failures cost nothing


def test_a_reservation_that_lapses_counts_its_request_and_hands_back_its_ceilings():
    """Its gateway died with the call: the lease lapses, and the call counts as one
    request used, since the agent may have run it (helper-39: a budget of 20 requests ran
    40 calls across a kill -9, each lapsed reservation handed back whole). Its token and
    cost ceilings go back. A late settlement adds its usage, not the request again."""
    clock = FakeClock(now=1_800_000_000.0)
    ledger = MemoryBudgets(clock=clock)
    limits = [ScopeLimit("1", requests=2, tokens=1000)]

    async def scenario():
        held = await ledger.reserve(limits, Amount(1, 900, 0), lease_s=10)
        refused = await ledger.reserve(limits, Amount(1, 900, 0), lease_s=10)  # tokens
        clock.advance(11)  # the reserving gateway died: its lease lapses
        again = await ledger.reserve(limits, Amount(1, 900, 0), lease_s=10)
        after_lapse = await ledger.used("1")
        await ledger.settle(again, Amount(1, 50, 0))
        full = await ledger.reserve(limits, Amount(1, 0, 0), lease_s=10)
        await ledger.settle(held, Amount(1, 30, 0))  # the lapsed one reports after all
        return held, refused, again, after_lapse, full, await ledger.used("1")

    held, refused, again, after_lapse, full, used = run(scenario())
    assert hasattr(held, "id") and not hasattr(refused, "id")
    assert hasattr(again, "id")  # the tokens came back ...
    assert after_lapse["requests"] == 1  # ... the request did not
    assert not hasattr(full, "id") and full.metric == "requests"
    assert (used["requests"], used["tokens"]) == (2, 80)


def test_reservations_lapse_exactly_when_due_among_many_settled_and_unsettled():
    """Random reserve / settle / clock steps against a plain model: what is reserved is
    always the sum of the unsettled leases not yet expired, whatever the order of their
    expiries (the ledger keeps them in a heap it rebuilds as settled ones pile up)."""
    rng = random.Random(11)
    clock = FakeClock(now=1_800_000_000.0)
    ledger = MemoryBudgets(clock=clock)
    limits = [ScopeLimit("t", requests=10**9)]
    live: dict[str, float] = {}  # id -> expires, the model

    async def scenario():
        for _ in range(3000):
            roll = rng.random()
            if roll < 0.5:
                lease_s = rng.choice((0.5, 1, 5, 30))
                held = await ledger.reserve(limits, Amount(1, 0, 0), lease_s=lease_s)
                live[held.id] = clock() + lease_s
                open_leases.append(held)
            elif roll < 0.85 and open_leases:
                held = open_leases.pop(rng.randrange(len(open_leases)))
                await ledger.settle(held, Amount(1, 0, 0))
                live.pop(held.id, None)
            else:
                clock.advance(rng.choice((0.1, 0.5, 2)))
            await ledger.reserve(limits, Amount(0, 0, 0), lease_s=1)  # lapses what is due
            now = clock()
            expected = sum(1 for expires in live.values() if expires > now)
            assert (await ledger.used("t"))["reserved_requests"] == expected

    open_leases: list = []
    run(scenario())


@needs_redis
def test_redis_reservations_are_atomic_and_leased():
    prefix = f"{settings.REDIS_KEY_PREFIX}budget-test-{uuid.uuid4().hex[:8]}:"
    clock = FakeClock(now=1_800_000_000.0)

    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            ledgers = [RedisBudgets(client, prefix, clock=clock) for _ in range(4)]
            limits = [ScopeLimit("t", cost=1_000_000), ScopeLimit("t:agent:1")]
            asks = [ledgers[i % 4].reserve(limits, Amount(1, 10, 100_000), lease_s=30)
                    for i in range(50)]
            results = await asyncio.gather(*asks)
            held = [r for r in results if hasattr(r, "id")]
            await ledgers[0].settle(held[0], Amount(1, 10, 150_000))  # more than reserved
            clock.advance(31)  # the other nine were never settled: lapsed
            after = await ledgers[1].reserve(limits, Amount(1, 0, 850_000), lease_s=30)
            too_much = await ledgers[2].reserve(limits, Amount(1, 0, 1), lease_s=30)
            used = await ledgers[0].used("t", month=held[0].month)
            await ledgers[3].settle(held[1], Amount(1, 5, 0))  # a lapsed one reports late
            late = await ledgers[0].used("t", month=held[0].month)
            return held, after, too_much, used, late
        finally:
            keys = [k async for k in client.scan_iter(match=prefix + "*")]
            if keys:
                await client.delete(*keys)
            await client.aclose()

    held, after, too_much, used, late = run(scenario())
    assert len(held) == 10  # 1.0 of budget, 0.1 a call: never an 11th
    assert hasattr(after, "id") and not hasattr(too_much, "id")
    assert used["cost"] == 150_000 and used["reserved_cost"] == 850_000
    # The nine that lapsed count as requests (their gateway died with them); the settled
    # one counts once, and the reservation after the lapse is not used yet.
    assert used["requests"] == 10 and used["reserved_requests"] == 1
    assert (late["requests"], late["tokens"]) == (10, used["tokens"] + 5)


# ---- idempotency --------------------------------------------------------------------------


def test_a_claim_lapses_after_its_lease_and_a_finished_reply_replays_for_a_day():
    clock = FakeClock()
    store = MemoryStore(clock=clock)

    async def scenario():
        first = await store.claim("k", "h", "crashed", lease_s=10)
        busy = await store.claim("k", "h", "retry", lease_s=10)
        clock.advance(10.5)
        taken = await store.claim("k", "h", "retry", lease_s=10)
        await store.finish("k", "crashed", Stored(200, b"late"), "h")  # not its claim now
        await store.finish("k", "retry", Stored(200, b"ours"), "h")
        clock.advance(23 * 3600)
        replay = await store.claim("k", "h", "third", lease_s=10)
        clock.advance(2 * 3600)
        expired = await store.claim("k", "h", "fourth", lease_s=10)
        return first, busy, taken, replay, expired

    first, busy, taken, replay, expired = run(scenario())
    assert first[0] == Outcome.NEW and busy[0] == Outcome.BUSY and taken[0] == Outcome.NEW
    assert replay == (Outcome.REPLAY, Stored(200, b"ours"))
    assert expired[0] == Outcome.NEW


def test_the_in_process_store_stays_bounded_and_keeps_calls_in_progress():
    """Past its bound the embedded store forgets the oldest finished replies first; a
    claim still in progress is never dropped (its duplicate must stay BUSY), and what
    expired is swept away."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    store.MAX_RECORDS, store.SWEEP_ABOVE = 50, 10
    store._sweep_above = 10

    async def scenario():
        await store.claim("running", "h", "owner", lease_s=10_000)
        await store.claim("lapsing", "h", "crashed", lease_s=1)
        for i in range(200):
            await store.claim(f"k{i}", "h", "o", lease_s=10)
            await store.finish(f"k{i}", "o", Stored(200, str(i).encode()), "h")
        clock.advance(2)  # the crashed claim's lease is over
        for i in range(200, 220):
            await store.claim(f"k{i}", "h", "o", lease_s=10)
            await store.finish(f"k{i}", "o", Stored(200, str(i).encode()), "h")
        return (len(store._records), await store.claim("running", "h", "dup", lease_s=10),
                await store.claim("k219", "h", "dup", lease_s=10),
                "lapsing" in store._records)

    size, running, recent, lapsing = run(scenario())
    assert size <= 2 * 50 + 1  # bounded (a sweep runs once the count doubles)
    assert running[0] == Outcome.BUSY  # in progress: kept whatever the bound
    assert recent == (Outcome.REPLAY, Stored(200, b"219"))  # the newest replies stay
    assert not lapsing  # expired: swept


@needs_redis
def test_a_redis_claim_lapses_after_its_lease():
    prefix = f"{settings.REDIS_KEY_PREFIX}idem-test-{uuid.uuid4().hex[:8]}:"

    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        store = RedisStore(client, prefix)
        try:
            first = await store.claim("k", "h", "crashed", lease_s=0.3)
            busy = await store.claim("k", "h", "retry", lease_s=0.3)
            other_body = await store.claim("k", "h2", "retry", lease_s=0.3)
            await store.forget("k", "retry")  # not the owner: nothing happens
            deadline = asyncio.get_running_loop().time() + 5
            while (await store.claim("k", "h", "retry", lease_s=5))[0] != Outcome.NEW:
                assert asyncio.get_running_loop().time() < deadline, "the lease never lapsed"
                await asyncio.sleep(0.05)
            await store.finish("k", "retry", Stored(201, b"body"), "h")
            replay = await store.claim("k", "h", "third", lease_s=5)
            ttl = await client.ttl(prefix + "k")
            return first, busy, other_body, replay, ttl
        finally:
            await client.delete(prefix + "k")
            await client.aclose()

    first, busy, other_body, replay, ttl = run(scenario())
    assert first[0] == Outcome.NEW and busy[0] == Outcome.BUSY
    assert other_body[0] == Outcome.MISMATCH
    assert replay == (Outcome.REPLAY, Stored(201, b"body"))
    assert ttl > 23 * 3600



@needs_redis
def test_a_redis_replay_says_what_the_reply_said_besides_its_body():
    """An intent call's routing is in its reply's headers (the chat door's body has no
    place for it): its replay carries them. A record stored before replies kept their
    headers (a gateway of the previous release, same Redis) replays with none."""
    prefix = f"{settings.REDIS_KEY_PREFIX}idem-test-{uuid.uuid4().hex[:8]}:"
    routed = ((b"x-reach-capability", b"weather.forecast"), (b"x-reach-confidence", b"0.81"))

    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        store = RedisStore(client, prefix)
        try:
            await store.claim("new", "h", "o", lease_s=5)
            await store.finish("new", "o", Stored(200, b"{}", routed), "h")
            await client.hset(prefix + "old", mapping={"hash": "h", "owner": "o",
                                                       "status": 200, "body": b"{}"})
            return (await store.claim("new", "h", "dup", lease_s=5),
                    await store.claim("old", "h", "dup", lease_s=5))
        finally:
            await client.delete(prefix + "new", prefix + "old")
            await client.aclose()

    new, old = run(scenario())
    assert new == (Outcome.REPLAY, Stored(200, b"{}", routed))
    assert old == (Outcome.REPLAY, Stored(200, b"{}"))

def test_a_reply_lost_after_delivery_is_retried_with_the_same_key(scripted):
    with LossyProxy(scripted.port) as lossy:
        agents = scripted_agents(scripted.endpoint)
        agents[0] = with_instances(agents[0], lossy.endpoint, scripted.endpoint)
        table, key = route_table(agents)
        run_id = uuid.uuid4().hex

        async def scenario():
            async with in_process(table, key) as gw:
                keyed = [await gw.post("/v1/invoke", invoke("echo.all", m=f"{run_id}-{i}"),
                                       Idempotency_Key=f"{run_id}-{i}") for i in range(4)]
                unkeyed = [await gw.post("/v1/invoke", invoke("echo.all", m=f"{run_id}-u{i}"))
                           for i in range(2)]
                return keyed, unkeyed

        keyed, unkeyed = run(scenario())
        delivered = lossy.delivered
    assert [r.status_code for r in keyed] == [200] * 4
    seen = scripted.seen()
    retried = 0
    for i in range(4):
        runs = [e for e in seen if f"{run_id}-{i}'" in repr(e.get("body"))]
        assert 1 <= len(runs) <= 2
        assert {e["idempotency_key"] for e in runs} == {f"{run_id}-{i}"}
        retried += len(runs) == 2
    assert retried >= 1 and delivered >= retried
    # Without a key a delivered call is never sent twice: one of the two is lost (502).
    assert sorted(r.status_code for r in unkeyed) == [200, 502]
    for i in range(2):
        assert scripted.calls_with(f"{run_id}-u{i}'") == 1


def test_only_the_calls_own_results_are_stored_and_replayed(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))
    run_id = uuid.uuid4().hex

    async def scenario():
        async with in_process(table, key) as gw:
            # A 4xx the request caused (the chat agent needs text) is the call's result.
            bad = [await gw.post("/v1/invoke", invoke("chat.scripted"),
                                 Idempotency_Key=f"{run_id}-bad") for _ in range(2)]
            # An agent failure decided nothing: the same key runs again.
            failed = [await gw.post("/v1/invoke", invoke("fail.op", m=f"{run_id}-f"),
                                    Idempotency_Key=f"{run_id}-fail") for _ in range(2)]
            # A routing state is not stored either: the key is still free afterwards.
            missing = await gw.post("/v1/invoke", invoke("nobody.here"),
                                    Idempotency_Key=f"{run_id}-route")
            served = await gw.post("/v1/invoke", invoke("echo.all"),
                                   Idempotency_Key=f"{run_id}-route")
            return bad, failed, missing, served

    bad, failed, missing, served = run(scenario())
    assert [r.status_code for r in bad] == [400, 400]
    assert bad[1].headers.get("idempotent-replayed") == "true"
    assert [r.status_code for r in failed] == [502, 502]
    assert "idempotent-replayed" not in failed[1].headers
    assert scripted.calls_with(f"{run_id}-f") == 2
    assert missing.status_code == 404 and served.status_code == 200


def test_keyed_calls_without_redis_get_a_clear_503_and_unkeyed_calls_go_through(scripted):
    from tests.support.inprocess import gateway_app

    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario(fail_open: bool):
        import httpx

        from reach_platform.gateway_factory import redis_client

        dead = redis_client(f"redis://127.0.0.1:{free_port()}/0")  # the production client
        app = gateway_app(table)
        app.pipeline.idempotency = RedisStore(dead, "x:")
        app.pipeline.idempotency_fail_open = fail_open
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway",
                                     headers=headers) as client:
            keyed = [await client.post("/v1/invoke", json=invoke("echo.all"),
                                       headers={"Idempotency-Key": f"k{i}"}) for i in range(5)]
            plain = await client.post("/v1/invoke", json=invoke("echo.all"))
        await app.close()
        await dead.aclose()
        return keyed, plain

    keyed, plain = run(scenario(fail_open=False))
    assert {r.status_code for r in keyed} == {503}
    error = keyed[0].json()["error"]
    assert (error["code"], error["retryable"]) == ("idempotency_unavailable", True)
    assert keyed[0].headers["retry-after"] == "1"
    assert plain.status_code == 200
    keyed, _ = run(scenario(fail_open=True))
    assert {r.status_code for r in keyed} == {200}


# ---- metering -----------------------------------------------------------------------------


def test_a_mixed_workload_meters_every_call_once_with_its_outcome(scripted):
    agents = scripted_agents(scripted.endpoint)
    chat_agent = agents[1]
    table, key = route_table(agents, quotas=(quota(agent_pk=chat_agent.pk,
                                                   monthly_requests=3),))

    async def scenario():
        async with in_process(table, key) as gw:
            replies = []
            for i in range(3):
                replies.append(await gw.post("/v1/invoke", invoke("echo.all", n=i)))
            for i in range(4):  # the fourth is over the chat agent's budget
                replies.append(await gw.post("/v1/chat/completions", {
                    "model": "scripted-chat",
                    "messages": [{"role": "user", "content": f"count to {i} now"}]}))
            replies.append(await gw.post("/v1/invoke", invoke("fail.op")))
            replies.append(await gw.post("/v1/invoke", invoke("slow.op"),
                                         X_Reach_Deadline_Ms="200"))
            for _ in range(3):  # burst 2: the third is rate limited
                replies.append(await gw.post("/v1/invoke", invoke("echo.limited")))
            replies.append(await gw.post("/v1/invoke", invoke("strict.echo", text="")))
            replies.append(await gw.post("/v1/invoke", invoke("nobody.here")))
            replies.append(await gw.client.post(
                "/v1/invoke", content=b"{", headers={"Authorization": f"Bearer {key}",
                                         "Content-Type": "application/json"}))
            replies.append(await gw.post("/v1/invoke", {
                "capability": "a2a.scripted", "stream": True, "input": {"text": "a b c"}}))
            return replies, gw.usage.drain()

    replies, events = run(scenario())
    ids = [r.headers["x-request-id"] for r in replies]
    assert sorted(e["request_id"] for e in events) == sorted(ids)  # one each, no more
    outcome = {e["request_id"]: e["outcome"] for e in events}
    assert [outcome[i] for i in ids] == [
        "success", "success", "success",
        "success", "success", "success", "quota_exceeded",
        "upstream_error", "deadline_exceeded",
        "success", "success", "rate_limited",
        "invalid_input", "no_capability", "malformed_json", "success"]
    reported = 0
    for reply in replies[3:6]:
        usage = reply.json()["usage"]
        reported += usage["prompt_tokens"] + usage["completion_tokens"]
    reported += 3 + 3  # the A2A stream's own figures: input 3, one token a word
    assert sum(e["input_tokens"] + e["output_tokens"] for e in events) == reported
    assert all(e["cost"] == 0 for e in events if e["outcome"] != "success")


def test_idempotency_helpers_key_records_by_tenant():
    assert idempotency.record_key(1, "k") != idempotency.record_key(2, "k")


def test_a_retry_on_a_dearer_agent_is_reserved_at_that_agents_price(scripted):
    from dataclasses import replace

    from tests.support.inprocess import agent, capability

    dead = f"http://127.0.0.1:{free_port()}/"
    cheap = agent("cheap", dead, capability("px.echo", path="/echo"), price_per_call=1.0)
    pricey = agent("pricey", scripted.endpoint, capability("px.echo", path="/echo"),
                   price_per_call=5.0)
    table, key = route_table([cheap, replace(pricey)], quotas=(quota(monthly_cost=10.0),))

    async def scenario():
        async with in_process(table, key) as gw:
            replies = await asyncio.gather(*(gw.post("/v1/invoke", invoke("px.echo", n=i))
                                             for i in range(10)))
            return replies, gw.usage.drain()

    replies, events = run(scenario())
    spent = sum(e["cost"] for e in events)
    assert 5.0 <= spent <= 10.0, spent  # never the 30.0 a cheap reservation let through
    assert {r.status_code for r in replies} <= {200, 429, 502}
    assert sum(r.status_code == 200 for r in replies) == spent / 5.0
