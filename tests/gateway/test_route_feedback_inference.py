"""Inferred route feedback, in process: a dry run or a failed intent call, then an explicit
capability call by the same key within a minute, is feedback for that intent. The clock
is injected; no database is touched."""

from __future__ import annotations

import asyncio

import pytest

from gateway.route_feedback import FeedbackRecorder
from gateway.usage import UsageQueue
from routing.matcher import index_from_capabilities
from routing.router import Router, RouteRequest, capability_texts
from routing.table import ApiKeyEntry
from tests.support.clock import FakeClock
from tests.support.inprocess import in_process, route_table, scripted_agents

UNKNOWN = "quarterly numbers for the board"


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.fixture
def world(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))
    index = index_from_capabilities(capability_texts(table))
    clock = FakeClock()
    return table, key, Router(index=lambda: index), clock, FeedbackRecorder(UsageQueue(),
                                                                            clock=clock)


def scenario(world, steps):
    """Run ``steps(gw, clock)`` on a gateway with ``world``'s recorder; returns what it
    returned and the feedback events queued."""
    table, key, router, clock, feedback = world

    async def go():
        async with in_process(table, key, router=router, route_feedback=feedback) as gw:
            return await steps(gw, clock), feedback.queue.drain()

    return run(go())


def explicit(gw, capability: str = "echo.all"):
    return gw.post("/v1/invoke", {"capability": capability, "input": {"text": "hi"}})


def test_a_dry_run_then_an_explicit_call_within_a_minute_is_feedback(world):
    async def steps(gw, clock):
        dry = await gw.get("/v1/route", params={"intent": UNKNOWN})
        clock.advance(59)
        call = await explicit(gw)
        return dry, call

    (dry, call), events = scenario(world, steps)
    assert dry.status_code == 404 and call.status_code == 200, call.text
    [sent] = events
    assert sent["source"] == "inferred" and sent["tenant"] == 1
    assert (sent["intent"], sent["capability"], sent["routed_to"]) == (UNKNOWN, "echo.all", "")
    assert sent["request_id"] == call.headers["x-request-id"] and len(sent["event_id"]) == 32


def test_after_a_minute_nothing_is_inferred(world):
    async def steps(gw, clock):
        await gw.get("/v1/route", params={"intent": UNKNOWN})
        clock.advance(60.5)
        return await explicit(gw)

    call, events = scenario(world, steps)
    assert call.status_code == 200 and events == []


def test_a_failed_intent_call_then_an_explicit_call_is_feedback_once(world):
    async def steps(gw, clock):
        failed = await gw.post("/v1/invoke", {"intent": UNKNOWN, "input": {}})
        clock.advance(10)
        first, second = await explicit(gw), await explicit(gw, "strict.echo")
        return failed, first, second

    (failed, first, second), events = scenario(world, steps)
    assert failed.json()["error"]["code"] == "no_capability"
    assert first.status_code == second.status_code == 200
    # The intent is used once: the second explicit call teaches nothing more.
    assert [(e["intent"], e["capability"]) for e in events] == [(UNKNOWN, "echo.all")]


def test_following_the_router_teaches_nothing(world):
    async def steps(gw, clock):
        dry = (await gw.get("/v1/route", params={"intent": "echo all"})).json()
        return dry, await explicit(gw, dry["capability"])

    (dry, call), events = scenario(world, steps)
    assert dry["capability"] and call.status_code == 200
    assert events == []


def test_a_failed_explicit_call_keeps_the_intent_for_the_next(world):
    async def steps(gw, clock):
        await gw.get("/v1/route", params={"intent": UNKNOWN})
        refused = await gw.post("/v1/invoke", {"capability": "strict.echo",
                                               "input": {"wrong": 1}})
        return refused, await explicit(gw)

    (refused, call), events = scenario(world, steps)
    assert refused.status_code == 400 and call.status_code == 200
    assert [e["capability"] for e in events] == ["echo.all"]


def test_an_intent_call_answered_in_between_ends_the_remembered_intent(world):
    """Break test (helper-36): a 300, then intent calls that were answered, then an
    explicit call of another capability taught the first intent to that capability."""
    async def steps(gw, clock):
        failed = await gw.post("/v1/invoke", {"intent": UNKNOWN, "input": {}})
        answered = await gw.post("/v1/invoke", {"intent": "echo all", "input": {"text": "x"}})
        return failed, answered, await explicit(gw, "strict.echo")

    (failed, answered, call), events = scenario(world, steps)
    assert failed.json()["error"]["code"] == "no_capability"
    assert answered.status_code == call.status_code == 200, answered.text
    assert events == []


# ---- the recorder on its own ------------------------------------------------------------


def key(pk: int, tenant_pk: int = 1) -> ApiKeyEntry:
    return ApiKeyEntry(pk=pk, prefix=f"p{pk}", key_hash="x", tenant_pk=tenant_pk)


def test_another_keys_call_never_resolves_an_intent():
    recorder = FeedbackRecorder(UsageQueue(), clock=FakeClock())
    recorder.tried(key(1), UNKNOWN, None)
    assert not recorder.chose(key(2), "echo.all", "r1")
    assert recorder.chose(key(1), "echo.all", "r2")
    assert [e["tenant"] for e in recorder.queue.drain()] == [1]


def test_the_memory_is_bounded_least_recently_used_first_out():
    recorder = FeedbackRecorder(UsageQueue(), clock=FakeClock(), max_keys=2)
    for pk in (1, 2, 1, 3):
        recorder.tried(key(pk), f"intent {pk}", None)
    assert len(recorder) == 2
    assert not recorder.chose(key(2), "echo.all", "r")  # the least recently used went
    assert recorder.chose(key(1), "echo.all", "r") and recorder.chose(key(3), "echo.all", "r")


@pytest.mark.parametrize(("outcome", "remembered"), [
    ("no_capability", True), ("upstream_error", True), ("upstream_timeout", True),
    ("upstream_bad_response", True), ("success", False), ("invalid_input", False),
    ("rate_limited", False), ("no_healthy_instance", False),
])
def test_which_intent_calls_are_remembered(outcome, remembered):
    recorder = FeedbackRecorder(UsageQueue(), clock=FakeClock())
    recorder.after_call(key(1), RouteRequest(tenant_pk=1, intent=UNKNOWN), outcome,
                        "fail.op" if outcome.startswith("upstream") else None, "r1")
    recorder.after_call(key(1), RouteRequest(tenant_pk=1, capability="echo.all"), "success",
                        "echo.all", "r2")
    events = recorder.queue.drain()
    assert len(events) == int(remembered)
    if remembered:
        assert events[0]["routed_to"] == ("fail.op" if outcome.startswith("upstream") else "")


def test_a_chat_call_naming_an_agent_is_not_a_capability_choice():
    recorder = FeedbackRecorder(UsageQueue(), clock=FakeClock())
    recorder.tried(key(1), UNKNOWN, None)
    recorder.after_call(key(1), RouteRequest(tenant_pk=1, capability="chat.scripted",
                                             agent="scripted-chat"), "success", None, "r")
    assert recorder.queue.drain() == [] and len(recorder) == 1


def test_reports_are_limited_per_key_and_refused_ones_do_not_count():
    """Each report is a stored row: a loop of them is refused past the key's share
    (60 a minute, bursts of 20), and another key is not held by it."""
    from reach_core.errors import ReachError
    from tests.support.inprocess import TENANT_PK

    clock = FakeClock()
    recorder = FeedbackRecorder(UsageQueue(), clock=clock)
    table, _ = route_table(scripted_agents("http://127.0.0.1:9/"))
    body = b'{"intent": "numbers for the board", "capability": "echo.all"}'
    mine, theirs = key(1, TENANT_PK), key(2, TENANT_PK)
    for n in range(20):
        run(recorder.reported(table, mine, body, f"r{n}"))
        with pytest.raises(ReachError):  # invalid: refused before it counts
            run(recorder.reported(table, mine, b'{"intent": "x"}', "bad"))
    with pytest.raises(ReachError) as refused:
        run(recorder.reported(table, mine, body, "r20"))
    assert refused.value.code == "rate_limited" and refused.value.retry_after == 1
    run(recorder.reported(table, theirs, body, "other"))
    clock.advance(1.0)  # one a second comes back
    run(recorder.reported(table, mine, body, "r21"))
    with pytest.raises(ReachError):
        run(recorder.reported(table, mine, body, "r22"))
    assert len(recorder.queue.drain()) == 22
