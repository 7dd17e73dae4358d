"""The one call pipeline, in process: every door gets the same guarantees.

The gateway runs around a hand-built route table (no database, no uvicorn) and
forwards to the scripted agent, a real HTTP server on loopback.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import orjson
from prometheus_client import generate_latest

from gateway.metrics import REGISTRY
from tests.support.inprocess import (
    in_process,
    quota,
    route_table,
    scripted_agents,
    start_scripted_agent,
    stop_process,
    with_instances,
)
from tests.support.servers import free_port


def run(coroutine):
    return asyncio.run(coroutine)


def chat_body(text: str, **kw) -> dict:
    return {"model": "scripted-chat", "messages": [{"role": "user", "content": text}], **kw}


def test_a_keyed_retry_serialised_again_is_the_same_request(scripted):
    """Keys compared by JSON value: a client that re-serialises its body on retry (keys in
    another order, other spacing) gets the stored reply, not 422 (break test)."""
    table, key = route_table(scripted_agents(scripted.endpoint))
    marker = f"respelt-{uuid.uuid4().hex}"
    body = chat_body(marker, temperature=0.2)
    respelt = json.dumps(dict(reversed(list(body.items()))), indent=2).encode()

    async def scenario():
        async with in_process(table, key) as gw:
            first = await gw.post("/v1/chat/completions", body, Idempotency_Key="k-respelt")
            again = await gw.client.post("/v1/chat/completions", content=respelt,
                                         headers=gw._headers({
                                             "Content-Type": "application/json",
                                             "Idempotency_Key": "k-respelt"}))
            return first, again

    first, again = run(scenario())
    assert first.status_code == 200, first.text
    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert scripted.calls_with(marker) == 1


def test_an_idempotency_key_is_printable_ascii_or_refused_before_the_agent(scripted):
    """helper-39: key bytes e4 b8 ad ff reached the agent as c3 a4 c2 b8 c2 ad c3 bf
    (read as latin-1, sent as UTF-8): another key than the caller's."""
    table, key = route_table(scripted_agents(scripted.endpoint))
    marker = f"badkey-{uuid.uuid4().hex}"

    async def scenario():
        async with in_process(table, key) as gw:
            out = []
            for raw in (b"\xe4\xb8\xad\xff", "中".encode(), b"k\x7f", b"a" * 256):
                out.append(await gw.client.post(
                    "/v1/chat/completions", content=json.dumps(chat_body(marker)).encode(),
                    headers=gw._headers({"Content-Type": "application/json",
                                         "Idempotency-Key": raw})))
            out.append(await gw.post("/v1/chat/completions", chat_body(marker),
                                     Idempotency_Key="order-42 retry:1"))
            return out

    *refused, accepted = run(scenario())
    for response in refused:
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_input"
    assert accepted.status_code == 200, accepted.text
    assert scripted.calls_with(marker) == 1


def test_a_keyed_chat_completion_runs_the_agent_once_and_replays(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))
    marker = f"chat-{uuid.uuid4().hex}"

    async def scenario():
        async with in_process(table, key) as gw:
            first = await gw.post("/v1/chat/completions", chat_body(marker),
                                  Idempotency_Key="k-chat")
            again = await gw.post("/v1/chat/completions", chat_body(marker),
                                  Idempotency_Key="k-chat")
            other = await gw.post("/v1/chat/completions", chat_body(marker + " changed"),
                                  Idempotency_Key="k-chat")
            return first, again, other, gw.usage.drain()

    first, again, other, events = run(scenario())
    assert first.status_code == 200, first.text
    assert first.json()["choices"][0]["message"]["content"] == f"ok: {marker}"
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert scripted.calls_with(marker) == 1  # the agent ran once
    # One event per request; only the call that ran carries the agent's usage and cost.
    assert [e["outcome"] for e in events] == ["success", "success", "idempotency_key_reused"]
    assert [e["output_tokens"] > 0 for e in events] == [True, False, False]


def test_concurrent_keyed_duplicates_on_both_doors_run_the_agent_once(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))
    marker = f"dup-{uuid.uuid4().hex}"

    async def scenario():
        async with in_process(table, key) as gw:
            chats = [gw.post("/v1/chat/completions", chat_body(marker), Idempotency_Key="c")
                     for _ in range(5)]
            invokes = [gw.post("/v1/invoke", {"capability": "echo.all",
                                              "input": {"m": marker}}, Idempotency_Key="i")
                       for _ in range(5)]
            return await asyncio.gather(*chats, *invokes)

    replies = run(scenario())
    assert [r.status_code for r in replies] == [200] * 10
    assert len({r.content for r in replies[:5]}) == 1
    assert len({r.content for r in replies[5:]}) == 1
    assert scripted.calls_with(marker) == 2  # once per door


def series(name: str) -> set[str]:
    text = generate_latest(REGISTRY).decode()
    return {line.split(" ")[0] for line in text.splitlines() if line.startswith(name + "{")}


def test_junk_paths_leave_the_metric_series_unchanged(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario():
        async with in_process(table, key) as gw:
            # The first of each kind creates its one series: a junk path, a wrong method.
            first = await gw.client.get("/v1/junk-0")
            wrong_method = await gw.client.put("/v1/invoke")
            before = series("reach_calls_total")
            replies = [await gw.client.request(method, f"/v1/{uuid.uuid4().hex}/x{i}")
                       for i, method in zip(range(50), ["GET", "POST", "PUT", "DELETE"] * 13,
                                            strict=False)]
            await gw.client.patch("/v1/chat/completions")
            return first, before, replies, wrong_method, series("reach_calls_total")

    first, before, replies, wrong_method, after = run(scenario())
    assert first.status_code == 404 and first.json()["error"]["code"] == "not_found"
    assert {r.status_code for r in replies} == {404}
    assert wrong_method.status_code == 405
    assert after == before
    assert all(re.search(r'endpoint="(invoke|chat_completions|route|not_found)"', s)
               for s in after)


def test_errors_are_structured_with_retryable_on_every_door(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario():
        async with in_process(table, key) as gw:
            return {
                "no_key": await gw.client.post("/v1/invoke", json={}),
                "bad_key": await gw.client.post("/v1/chat/completions", json={},
                                                headers={"Authorization": "Bearer rk_x"}),
                "not_json": await gw.client.post(
                    "/v1/invoke", content=b"{nope", headers={"Authorization": f"Bearer {key}",
                                         "Content-Type": "application/json"}),
                "invalid": await gw.post("/v1/invoke", {"capability": "strict.echo",
                                                        "input": {"text": ""}}),
                "unknown": await gw.post("/v1/chat/completions", chat_body("x", model="nobody")),
                "bad_reply": await gw.post("/v1/invoke", {"capability": "bad.op", "input": {}}),
                "deadline": await gw.post("/v1/invoke", {"capability": "echo.all", "input": {}},
                                          X_Reach_Deadline_Ms="soon"),
            }

    replies = run(scenario())
    expected = {"no_key": (401, "unauthorized", False), "bad_key": (401, "unauthorized", False),
                "not_json": (400, "malformed_json", False),
                "invalid": (400, "invalid_input", False),
                "unknown": (404, "no_capability", False),
                "bad_reply": (502, "upstream_bad_response", False),
                "deadline": (400, "invalid_input", False)}
    for name, (status, code, retryable) in expected.items():
        error = replies[name].json()["error"]
        assert (replies[name].status_code, error["code"], error["retryable"]) == \
            (status, code, retryable), name
        assert error["request_id"] == replies[name].headers["x-request-id"]
        assert replies[name].headers["x-should-retry"] == str(retryable).lower(), name
    assert set(replies["invalid"].json()["error"]["details"]) == {"text"}


def test_rate_limits_and_budgets_apply_to_the_chat_door_too(scripted):
    agents = scripted_agents(scripted.endpoint)
    limited, key = route_table(agents, quotas=(quota(requests_per_minute=60, burst=2),))
    budgeted, key2 = route_table(agents, quotas=(quota(monthly_requests=3),))

    async def scenario():
        async with in_process(limited, key) as gw:
            rated = [await gw.post("/v1/chat/completions", chat_body("hi")) for _ in range(3)]
        async with in_process(budgeted, key2) as gw:
            spent = [await gw.post("/v1/chat/completions", chat_body("hi")) for _ in range(3)]
            spent.append(await gw.post("/v1/invoke", {"capability": "echo.all", "input": {}}))
        return rated, spent

    rated, spent = run(scenario())
    assert [r.status_code for r in rated] == [200, 200, 429]
    assert rated[2].json()["error"]["code"] == "rate_limited"
    assert int(rated[2].headers["retry-after"]) >= 1
    assert rated[2].headers["x-should-retry"] == "true"
    assert [r.status_code for r in spent] == [200, 200, 200, 429]
    assert spent[3].json()["error"]["code"] == "quota_exceeded"
    # A spent monthly budget does not come back in a second: no Retry-After, and the
    # OpenAI SDKs' own rule (resend every 429) is overruled.
    assert "retry-after" not in spent[3].headers
    assert spent[3].headers["x-should-retry"] == "false"


def test_every_door_hands_off_one_usage_event_per_call(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario():
        async with in_process(table, key) as gw:
            await gw.post("/v1/invoke", {"capability": "echo.all", "input": {"x": 1}},
                          X_Request_ID="u-invoke")
            await gw.post("/v1/chat/completions", chat_body("one two"), X_Request_ID="u-chat")
            stream = await gw.post("/v1/invoke", {"capability": "chat.scripted", "stream": True,
                                                  "input": {"text": "a b c"}},
                                   X_Request_ID="u-stream")
            return stream, gw.usage.drain()

    stream, events = run(scenario())
    assert stream.status_code == 200 and b"[DONE]" in stream.content
    by_id = {e["request_id"]: e for e in events}
    assert set(by_id) == {"u-invoke", "u-chat", "u-stream"}
    assert by_id["u-invoke"]["cost"] == 0.5  # the agent's price per call
    assert (by_id["u-chat"]["input_tokens"], by_id["u-chat"]["output_tokens"]) == (2, 3)
    assert (by_id["u-stream"]["input_tokens"], by_id["u-stream"]["output_tokens"]) == (2, 3)
    assert {e["outcome"] for e in events} == {"success"}


def test_an_a2a_stream_is_relayed_and_metered_as_a2a(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario():
        async with in_process(table, key) as gw:
            reply = await gw.post("/v1/invoke", {"capability": "a2a.scripted",
                                                 "input": {"text": "hello"}})
            stream = await gw.post("/v1/invoke", {"capability": "a2a.scripted", "stream": True,
                                                  "input": {"text": "one two three four"}},
                                   X_Request_ID="a2a-stream")
            return reply, stream, gw.usage.drain()

    reply, stream, events = run(scenario())
    assert reply.json()["reply_content"] == "a2a: hello"
    assert stream.content.count(b'"artifact-update"') == 4
    event = next(e for e in events if e["request_id"] == "a2a-stream")
    assert (event["input_tokens"], event["output_tokens"]) == (3, 4)  # the agent's figures


def test_an_a2a_stream_reaches_the_chat_door_as_chat_chunks_event_by_event(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario():
        async with in_process(table, key) as gw:
            return await gw.post("/v1/chat/completions",
                                 chat_body("hi there", model="scripted-a2a", stream=True))

    stream = run(scenario())
    assert stream.status_code == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    events = [e for e in stream.content.split(b"\n\n") if e]
    contents = [orjson.loads(e[6:])["choices"][0]["delta"].get("content")
                for e in events[:-1]]
    assert contents == ["hi", "there", None]  # one chunk per A2A event, then the finish
    assert events[-1] == b"data: [DONE]"
    assert all(b'"chat.completion.chunk"' in e for e in events[:-1])


def test_a_stream_asked_of_an_agent_that_does_not_stream_gets_its_answer_as_one_event(
        scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario():
        async with in_process(table, key) as gw:
            replies = [await gw.post("/v1/invoke", {"capability": "echo.all", "stream": True,
                                                    "input": {"n": i}}) for i in range(15)]
            return replies, gw.app.breakers.states()

    replies, breakers = run(scenario())
    for i, reply in enumerate(replies):
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        assert b"event: error" not in reply.content
        [event] = [e for e in reply.content.split(b"\n\n") if e]
        assert orjson.loads(event[6:])["output"]["echo"] == {"n": i}
    assert breakers == {}  # nothing counted as a failure


def test_an_agents_own_4xx_is_not_retryable(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario():
        async with in_process(table, key) as gw:
            return await gw.post("/v1/invoke", {"capability": "refuse.op", "input": {}})

    refused = run(scenario())
    error = refused.json()["error"]
    assert (refused.status_code, error["code"], error["retryable"]) == \
        (400, "invalid_input", False)
    assert "HTTP 422" in error["message"]


def test_a_retry_goes_to_another_instance_when_the_first_never_got_the_call(scripted):
    dead = f"http://127.0.0.1:{free_port()}/"
    agents = scripted_agents(scripted.endpoint)
    agents[0] = with_instances(agents[0], dead, scripted.endpoint)
    table, key = route_table(agents)
    marker = f"retry-{uuid.uuid4().hex}"

    async def scenario():
        async with in_process(table, key) as gw:
            return [await gw.post("/v1/invoke", {"capability": "echo.all",
                                                 "input": {"m": f"{marker}-{i}"}})
                    for i in range(4)]

    replies = run(scenario())
    assert [r.status_code for r in replies] == [200] * 4
    live = agents[0].instances[1].pk
    assert {r.json()["instance"] for r in replies} == {live}
    assert scripted.calls_with(marker) == 4


def test_retry_then_breaker_then_half_open_recovery_on_an_injected_clock(scripted):
    """A dead instance: every call still succeeds through the retry until its breaker
    opens; then no call tries it (no retries); after the cool-down, on the fake clock, a
    half-open probe reaches the revived instance and closes the breaker."""
    from gateway.breaker import BreakerState, CircuitBreakers
    from gateway.metrics import RETRIES
    from tests.support.clock import FakeClock

    dead_port = free_port()
    agents = scripted_agents(scripted.endpoint)
    agents[0] = with_instances(agents[0], f"http://127.0.0.1:{dead_port}/", scripted.endpoint)
    dead, live = (i.pk for i in agents[0].instances)
    table, key = route_table(agents)
    clock = FakeClock()
    breakers = CircuitBreakers(min_volume=4, cooldown_seconds=30, clock=clock)

    def retries() -> float:
        return RETRIES._value.get()

    async def calls(gw, n: int) -> list[int]:
        replies = [await gw.post("/v1/invoke", {"capability": "echo.all", "input": {"n": i}})
                   for i in range(n)]
        return [r.status_code for r in replies]

    async def scenario():
        async with in_process(table, key, breakers=breakers) as gw:
            before = retries()
            statuses = await calls(gw, 12)
            retried, state = retries() - before, breakers.states().get(dead)
            more = await calls(gw, 10)
            retried_while_open = retries() - before - retried
            revived = start_scripted_agent(dead_port)
            try:
                clock.advance(30)
                probes = []
                for _ in range(20):  # a smooth round robin reaches the probe within two
                    probes.append(await gw.post("/v1/invoke", {"capability": "echo.all",
                                                               "input": {}}))
                    if dead not in breakers.states():
                        break
                return (statuses, retried, state, more, retried_while_open, probes,
                        breakers.states().get(dead), revived.seen())
            finally:
                stop_process(revived.proc)

    statuses, retried, state, more, retried_while_open, probes, final, seen = run(scenario())
    assert statuses == [200] * 12  # a refused connection is retried on the live instance
    assert retried >= 4 and state == BreakerState.OPEN
    assert more == [200] * 10 and retried_while_open == 0
    assert {p.status_code for p in probes} == {200}
    assert final is None  # closed (and forgotten)
    assert seen, "the revived instance got no traffic"
    assert probes[-1].json()["instance"] == dead
    assert live != dead


def test_a_stream_that_goes_idle_is_counted_and_metered_with_its_real_outcome(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario():
        async with in_process(table, key, stream_idle_timeout_s=0.3) as gw:
            stream = await gw.post("/v1/invoke", {"capability": "chat.scripted", "stream": True,
                                                  "input": {"text": "stall after 2 words"}},
                                   X_Request_ID="idle-stream")
            return stream, gw.usage.drain(), generate_latest(REGISTRY).decode()

    stream, events, metrics = run(scenario())
    assert stream.status_code == 200 and b"event: error" in stream.content
    assert b'"code":"upstream_timeout"' in stream.content
    [event] = [e for e in events if e["request_id"] == "idle-stream"]
    assert event["outcome"] == "upstream_timeout"
    assert event["output_tokens"] == 2  # what it streamed before stalling still counts
    assert 'reach_calls_total{endpoint="invoke",outcome="upstream_timeout"}' in metrics
    assert not any('endpoint="stream"' in line for line in metrics.splitlines())


def test_a_caller_gone_mid_body_ends_the_request_quietly(scripted):
    """The server saw the caller go (or refused the rest of a bad chunked body): the
    application returns, metered, instead of raising into the server's error log."""
    table, key = route_table(scripted_agents(scripted.endpoint))
    sent = []

    async def scenario():
        async with in_process(table, key) as gw:
            messages = iter([
                {"type": "http.request", "body": b'{"capability": "echo.all", "in',
                 "more_body": True},
                {"type": "http.disconnect"},
            ])

            async def receive():
                return next(messages)

            async def send(message):
                sent.append(message)

            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                     "method": "POST", "scheme": "http", "path": "/v1/invoke",
                     "raw_path": b"/v1/invoke", "query_string": b"", "root_path": "",
                     "client": ("127.0.0.1", 40001), "server": ("127.0.0.1", 80),
                     "headers": [(b"authorization", f"Bearer {key}".encode()),
                                 (b"content-type", b"application/json")]}
            await gw.app(scope, receive, send)  # returns: no CancelledError escapes
            return gw.usage.drain()

    events = run(scenario())
    assert sent == []  # nobody to answer
    assert [e["outcome"] for e in events] == ["client_cancelled"]


class EarlyTimers(asyncio.SelectorEventLoop):
    """A loop whose timers fire 4 ms early, as uvloop's can: its clock counts whole
    milliseconds (on a coarse kernel clock where one is fine enough), so a time-out may
    run while the call's budget, read on the precise clock, still shows a little left."""

    def call_at(self, when, callback, *args, context=None):
        return super().call_at(when - 0.004, callback, *args, context=context)


def test_a_caller_budget_that_ran_out_is_the_callers_even_when_the_timer_fires_early(
        scripted):
    """CI failure: a 50 ms deadline answered ``upstream_timeout`` (the agent's fault)
    one time in many, when the time-out fired with a millisecond of the budget still on
    the clock. Whether the call's own time ran out is known without the clock: the
    attempt had all of it."""
    table, key = route_table(scripted_agents(scripted.endpoint))

    async def scenario():
        async with in_process(table, key) as gw:
            replies = [await gw.post("/v1/invoke", {"capability": "slow.op", "input": {}},
                                     X_Reach_Deadline_Ms="60") for _ in range(5)]
            return replies, gw.app.breakers.states()

    with asyncio.Runner(loop_factory=EarlyTimers) as runner:
        replies, breakers = runner.run(scenario())
    for reply in replies:
        assert reply.status_code == 504, reply.text
        assert reply.json()["error"]["code"] == "deadline_exceeded", reply.text
    assert breakers == {}  # the caller's own deadline: nothing counted against the agent


def test_a_duplicate_with_a_short_deadline_hears_the_key_is_busy(scripted):
    """A duplicate that cannot wait for the first call (its deadline is shorter) gets
    409 ``idempotency_in_progress`` with Retry-After, not a 504: what it needs to know is
    that the key is taken, and when to come back."""
    table, key = route_table(scripted_agents(scripted.endpoint))
    marker = f"busy-{uuid.uuid4().hex}"
    body = {"capability": "slow.op", "input": {"marker": marker}}

    async def scenario():
        async with in_process(table, key) as gw:
            first = asyncio.ensure_future(gw.post("/v1/invoke", body, Idempotency_Key=marker))
            while not scripted.calls_with(marker):  # the first is at the agent (2 s)
                await asyncio.sleep(0.02)
            duplicate = await gw.post("/v1/invoke", body, Idempotency_Key=marker,
                                      X_Reach_Deadline_Ms="300")
            return await first, duplicate

    first, duplicate = run(scenario())
    assert first.status_code == 200, first.text
    assert duplicate.status_code == 409, duplicate.text
    assert duplicate.json()["error"]["code"] == "idempotency_in_progress"
    assert int(duplicate.headers["retry-after"]) >= 1
    assert scripted.calls_with(marker) == 1
