"""What helper-44's break test of the data plane found, each tried again: usage figures
no call can have, integers JSON cannot carry exactly through this gateway, a keyed retry
after its budget was spent, a keyed reply Redis did not take, and a head of many small
headers. In-process gateway, real scripted agent, real Redis behind a test-owned
forwarder where Redis goes away."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
import redis.asyncio as aioredis
from django.conf import settings

from gateway.budgets import Amount, RedisBudgets
from gateway.governance import Governor
from gateway.idempotency import RedisStore
from gateway.limits import InProcessLimiter
from gateway.protocols.base import MAX_REPORTED_TOKENS
from tests.gateway.test_pipeline import chat_body, run
from tests.support.forwarder import Forwarder
from tests.support.inprocess import (
    gateway_app,
    in_process,
    quota,
    route_table,
    scripted_agents,
)

needs_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="needs REDIS_URL")
WIDE = "100000000000000000000001"  # 10^23 + 1: a float would make it 1e23


@pytest.mark.parametrize("stream", [False, True])
def test_usage_no_call_can_have_is_not_believed_and_the_call_is_metered_once(
        scripted, stream):
    """1e20, 2^62, 1e300 reported as tokens: the caller got a 500 (a 64-bit overflow
    writing the usage event), no usage event was kept, and the budget settlement was
    retried for ever; the re-test: a string "99999999" was believed and spent a monthly
    token budget in one call. Now such a figure counts as none; the call is answered and
    metered once; a number in range is the agent's, as before."""
    table, key = route_table(scripted_agents(scripted.endpoint))
    figures = {"1e20": 0, str(2**62): 0, "1e300": 0, "-5": 0, "7.0": 7, '"99999999"': 0,
               "true": 0, "[3]": 0,
               str(MAX_REPORTED_TOKENS): MAX_REPORTED_TOKENS,
               str(MAX_REPORTED_TOKENS + 1): 0}

    async def scenario():
        async with in_process(table, key) as gw:
            replies = {figure: await gw.post("/v1/chat/completions", chat_body(
                f"report usage {figure}", stream=stream), X_Request_ID=f"u-{i}")
                for i, figure in enumerate(figures)}
            return replies, gw.usage.drain()

    replies, events = run(scenario())
    for figure, reply in replies.items():
        assert reply.status_code == 200, (figure, reply.text)
    by_id = {e["request_id"]: e for e in events}
    assert len(events) == len(by_id) == len(figures)  # one event per call
    for i, (figure, tokens) in enumerate(figures.items()):
        assert by_id[f"u-{i}"]["outcome"] == "success"
        assert by_id[f"u-{i}"]["input_tokens"] == tokens, figure


@needs_redis
def test_a_settlement_the_ledger_refuses_is_dropped_not_applied_again_and_again():
    """A pipeline is not a transaction: the request counted before Redis refused the
    token figure was counted again on every flush (a tenant's count rose 100 a second
    with no traffic). Refused is not unreachable: dropped, and said."""
    prefix = f"{settings.REDIS_KEY_PREFIX}budget-refused-{uuid.uuid4().hex[:8]}:"

    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        ledger = RedisBudgets(client, prefix)
        governor = Governor(limiter=InProcessLimiter(), ledger=ledger)
        try:
            governor.record(("tenant:1",), Amount(1, 2**63, 0))  # past Redis's integers
            for _ in range(3):
                await governor.flush()
            return await ledger.used("tenant:1"), governor._unflushed
        finally:
            keys = await client.keys(prefix + "*")
            if keys:
                await client.delete(*keys)
            await client.aclose()

    used, left = run(scenario())
    assert used.get("requests", 0) <= 1 and not left


def test_an_integer_json_cannot_carry_is_refused_not_rounded(scripted):
    """10^23 + 1 reached the agent as 1e23, an agent's 30-digit number reached the
    caller rounded, and two such bodies under one Idempotency-Key were "the same"
    request (replayed). Now 400 naming the cause, and 502 for the agent's; integers
    within 64 bits (either sign) go through exactly."""
    table, key = route_table(scripted_agents(scripted.endpoint))
    exact = 2**64 - 1

    async def scenario():
        async with in_process(table, key) as gw:
            async def raw(text: str, **headers):
                return await gw.client.post("/v1/invoke", content=text.encode(), headers=(
                    gw._headers({"Content-Type": "application/json", **headers})))
            return {
                "wide": await raw(f'{{"capability": "echo.all", "input": {{"n": {WIDE}}}}}'),
                # Past a double's range too (helper-50: 5,000 digits was malformed_json).
                "huge": await raw('{"capability": "echo.all", "input": {"n": 9%s}}'
                                  % ("0" * 5000)),
                # A float no double holds is out of range too, not malformed (helper-52).
                "inf": await raw('{"capability": "echo.all", "input": {"x": -1e400}}'),
                "keyed": [await raw(f'{{"capability": "echo.all", "input": {{"n": {n}}}}}',
                                    Idempotency_Key="k-wide")
                          for n in (WIDE, WIDE[:-1] + "2")],
                "in_a_string": await raw(f'{{"capability": "echo.all", '
                                         f'"input": {{"n": "{WIDE}"}}}}'),
                "exact": await raw(f'{{"capability": "echo.all", "input": {{"n": {exact}, '
                                   f'"m": {-(2**63)}}}}}'),
                "agent_wide": await gw.post("/v1/chat/completions",
                                            chat_body(f"answer number {WIDE}")),
                "agent_exact": await gw.post("/v1/chat/completions",
                                             chat_body(f"answer number {exact}")),
            }

    replies = run(scenario())
    for reply in (replies["wide"], replies["huge"], replies["inf"], *replies["keyed"]):
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["code"] == "invalid_input"
        assert "as a string" in reply.json()["error"]["message"]
    assert replies["in_a_string"].json()["output"]["echo"]["n"] == WIDE
    assert replies["exact"].json()["output"]["echo"] == {"n": exact, "m": -(2**63)}
    assert replies["agent_wide"].status_code == 502
    assert replies["agent_wide"].json()["error"]["code"] == "upstream_bad_response"
    assert replies["agent_exact"].status_code == 200, replies["agent_exact"].text
    # Nothing rounded reached the agent.
    assert not [s for s in scripted.seen()
                if isinstance((s.get("body") or {}).get("n"), float)]


def test_a_keyed_retry_after_its_budget_was_spent_gets_its_reply(scripted):
    """A budget of one request: the keyed call ran, and its retry (the reply lost) got
    429 quota_exceeded, "not retryable", while it ran and after. The retry waits for
    the call and gets its reply; another key is still refused; the agent ran once."""
    table, key = route_table(scripted_agents(scripted.endpoint),
                             quotas=(quota(monthly_requests=1),))
    marker = uuid.uuid4().hex

    async def scenario():
        async with in_process(table, key) as gw:
            body = {"capability": "slow.op", "input": {"marker": marker}}
            first = asyncio.ensure_future(gw.post("/v1/invoke", body, Idempotency_Key=marker))
            await asyncio.sleep(0.5)  # the first is at the agent (2 s): the budget is held
            during = await gw.post("/v1/invoke", body, Idempotency_Key=marker)
            after = await gw.post("/v1/invoke", body, Idempotency_Key=marker)
            other = await gw.post("/v1/invoke", body, Idempotency_Key=marker + "-other")
            return await first, during, after, other

    first, during, after, other = run(scenario())
    assert first.status_code == 200, first.text
    for retry in (during, after):
        assert retry.status_code == 200, retry.text
        assert retry.headers["idempotent-replayed"] == "true"
        assert retry.content == first.content
    assert other.status_code == 429 and other.json()["error"]["code"] == "quota_exceeded"
    assert sum(1 for s in scripted.seen()
               if s["path"] == "/slow" and (s.get("body") or {}).get("marker") == marker) == 1


def test_a_head_is_measured_as_sent_not_as_its_names_and_values(scripted):
    """2,000 headers "X-n: a" are a 21 KB head; counted by names and values only it
    passed the 16 KiB limit."""
    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario():
        async with in_process(table, key) as gw:
            many = [(f"x-{i}", "a") for i in range(2000)]
            return await gw.client.post("/v1/invoke", json={"capability": "echo.all",
                                                            "input": {}},
                                        headers=[("authorization", f"Bearer {key}"), *many])

    reply = run(scenario())
    assert reply.status_code == 431, reply.text
    assert reply.json()["error"]["code"] == "headers_too_large"


@needs_redis
def test_a_keyed_reply_redis_did_not_take_is_stored_when_it_is_back(scripted):
    """Redis went away as a keyed call ended: its reply was not stored, and a retry after
    Redis came back waited for the claim to lapse and ran the agent again. The reply is
    stored again until Redis takes it: the retry gets it, and the agent ran once."""
    from reach_platform.gateway_factory import redis_client

    table, key = route_table(scripted_agents(scripted.endpoint))
    marker = uuid.uuid4().hex
    body = {"capability": "slow.op", "input": {"marker": marker}}
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": marker}

    async def scenario():
        with Forwarder.for_url(settings.REDIS_URL) as redis_link:
            client = redis_client(redis_link.url(settings.REDIS_URL))
            app = gateway_app(table)
            app.pipeline.idempotency = RedisStore(
                client, f"{settings.REDIS_KEY_PREFIX}unstored-{marker[:8]}:")
            transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway",
                                         timeout=30) as caller:
                first = asyncio.ensure_future(caller.post("/v1/invoke", json=body,
                                                          headers=headers))
                await asyncio.sleep(0.5)  # claimed in Redis; the agent takes 2 s
                with redis_link.outage():  # Redis gone as the call ends
                    reply = await first
                retry = await caller.post("/v1/invoke", json=body, headers=headers)
            await app.close()
            await client.aclose()
            await client.connection_pool.disconnect()
        return reply, retry

    reply, retry = run(scenario())
    assert reply.status_code == 200, reply.text
    assert retry.status_code == 200, retry.text
    assert retry.headers["idempotent-replayed"] == "true"
    assert retry.content == reply.content
    assert sum(1 for s in scripted.seen()
               if s["path"] == "/slow" and (s.get("body") or {}).get("marker") == marker) == 1
