"""Delivered or not: which failed attempts the gateway retries.

A call that provably never reached its agent whole is retried on another instance
whatever its key: a refused connection, or a connection the agent reset while the
gateway was still sending the request. A reset after the whole request was written
counts as delivered (the gateway cannot know whether the agent read it): an unkeyed call
is then answered 502 and never sent twice, a keyed one is retried with the same
Idempotency-Key. Real servers on loopback (``tests.support.lossy``), the gateway in
process around hand-built route tables.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests.support.inprocess import in_process, route_table, scripted_agents, with_instances
from tests.support.lossy import LossyProxy, ResetServer
from tests.support.servers import free_port


def _send_buffer_max() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return 4 * 1024 * 1024


# More than the gateway's socket send buffer can ever hold (the resetting agent's window
# is a few KiB), so the gateway is still sending the body when the reset comes; the
# gateway's limits are raised to let it through.
LARGE = _send_buffer_max() + 2 * 1024 * 1024


def run(coroutine):
    return asyncio.run(coroutine)


def invoke(capability: str, **input_) -> dict:
    return {"capability": capability, "input": input_}


async def until_hit(gw, server, make_call, *, tries: int = 6):
    """Calls ``make_call(i)`` until one of them reached ``server`` (its ``accepted``
    count moved); returns that reply and the replies of the calls that went elsewhere."""
    others = []
    for i in range(tries):
        before = server.accepted
        reply = await make_call(i)
        if server.accepted > before:
            return reply, others
        others.append(reply)
    raise AssertionError(f"no call reached {server.endpoint} in {tries} tries")


# aiohttp warns that a body this large, passed as bytes, may block the loop while copied.
@pytest.mark.filterwarnings("ignore:Sending a large body:ResourceWarning")
def test_an_unkeyed_call_reset_while_its_body_was_sent_is_retried_elsewhere(scripted):
    marker = uuid.uuid4().hex
    with ResetServer() as resetting:
        agents = scripted_agents(scripted.endpoint)
        agents[0] = with_instances(agents[0], resetting.endpoint, scripted.endpoint)
        table, key = route_table(agents)
        healthy = agents[0].instances[1].pk

        async def scenario():
            async with in_process(table, key, max_body_bytes=2 * LARGE,
                                  max_upstream_bytes=3 * LARGE) as gw:
                return await until_hit(gw, resetting, lambda i: gw.post(
                    "/v1/invoke", invoke("echo.all", m=f"{marker}-{i}", pad="x" * LARGE)))

        (reply, others), heads, complete = run(scenario()), resetting.heads, resetting.complete
    assert reply.status_code == 200 and reply.json()["instance"] == healthy, reply.text
    assert all(r.status_code == 200 for r in others)
    assert heads >= 1 and complete == 0  # the resetting agent never had a whole request
    tried = len(others)
    assert scripted.calls_with(f"{marker}-{tried}'") == 1  # sent once, to the healthy one


def test_a_refused_connection_is_retried_whatever_its_key(scripted):
    marker = uuid.uuid4().hex
    agents = scripted_agents(scripted.endpoint)
    agents[0] = with_instances(agents[0], f"http://127.0.0.1:{free_port()}/",
                               scripted.endpoint)
    table, key = route_table(agents)
    healthy = agents[0].instances[1].pk

    async def scenario():
        async with in_process(table, key) as gw:
            # Two in a row: the balancer sends one of them to the refusing instance.
            return [await gw.post("/v1/invoke", invoke("echo.all", m=f"{marker}-{i}"))
                    for i in range(2)]

    replies = run(scenario())
    assert [(r.status_code, r.json()["instance"]) for r in replies] == [(200, healthy)] * 2
    assert scripted.calls_with(marker) == 2


def test_a_reset_after_the_whole_request_was_written_counts_as_delivered(scripted):
    """The resetting agent read only the headers, but the small body had been written
    whole: the gateway cannot tell that from an agent that read it and died working."""
    with ResetServer() as resetting:
        agents = scripted_agents(scripted.endpoint)
        agents[0] = with_instances(agents[0], resetting.endpoint, scripted.endpoint)
        table, key = route_table(agents)

        async def scenario():
            async with in_process(table, key) as gw:
                return await until_hit(gw, resetting, lambda i: gw.post(
                    "/v1/invoke", invoke("echo.all", n=i)))

        (reply, _), heads = run(scenario()), resetting.heads
    assert heads >= 1
    assert reply.status_code == 502 and reply.json()["error"]["code"] == "upstream_error"


def test_a_reply_lost_after_delivery_is_retried_only_with_a_key(scripted):
    marker = uuid.uuid4().hex
    with LossyProxy(scripted.port) as lossy:
        agents = scripted_agents(scripted.endpoint)
        agents[0] = with_instances(agents[0], lossy.endpoint, scripted.endpoint)
        table, key = route_table(agents)
        healthy = agents[0].instances[1].pk

        async def scenario():
            async with in_process(table, key) as gw:
                unkeyed = await until_hit(gw, lossy, lambda i: gw.post(
                    "/v1/invoke", invoke("echo.all", m=f"{marker}-u{i}")))
                keyed = await until_hit(gw, lossy, lambda i: gw.post(
                    "/v1/invoke", invoke("echo.all", m=f"{marker}-k{i}"),
                    Idempotency_Key=f"{marker}-k{i}"))
                return unkeyed, keyed

        (lost, unkeyed_others), (retried, keyed_others) = run(scenario())
    assert lost.status_code == 502 and lost.json()["error"]["code"] == "upstream_error"
    n = len(unkeyed_others)
    assert scripted.calls_with(f"{marker}-u{n}'") == 1  # delivered once, never again
    assert retried.status_code == 200 and retried.json()["instance"] == healthy
    k = len(keyed_others)
    runs = [e for e in scripted.seen() if f"{marker}-k{k}'" in repr(e.get("body"))]
    assert len(runs) == 2  # through the proxy (reply lost), then on the healthy instance
    assert {e["idempotency_key"] for e in runs} == {f"{marker}-k{k}"}
