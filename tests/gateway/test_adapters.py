"""Protocols and SSE framing: pure code, no network."""

from __future__ import annotations

import pytest

from gateway.protocols import PROTOCOLS
from gateway.sse import EventFramer, data_of
from reach_core.errors import ReachError
from reach_core.kinds import Protocol
from routing.table import AgentEntry, CapabilityEntry


def build_request(agent, capability, payload, **kw):
    return PROTOCOLS[agent.protocol].request(agent, capability, payload, **kw)


def parse_response(agent, capability, body):
    return PROTOCOLS[agent.protocol].parse(agent, capability, body)


def test_every_protocol_kind_has_a_registered_protocol():
    assert set(PROTOCOLS) == set(Protocol)
    assert all(PROTOCOLS[kind].name == kind for kind in Protocol)


def agent(protocol: str) -> AgentEntry:
    return AgentEntry(pk=1, namespace="default", name="a", owner_tenant_pk=1, protocol=protocol)


ENVELOPE = {"response": {"envelope": {"code_field": "code", "ok_value": 0,
                                      "data_field": "data", "message_field": "message"}}}


def test_http_unwraps_a_business_envelope():
    cap = CapabilityEntry(pk=1, capability_id="t.x", adapter=ENVELOPE)
    reply = parse_response(agent("http"), cap, {"code": 0, "message": "ok",
                                                "data": {"message": "你好"}})
    assert reply.reply_content == "你好" and reply.output == {"message": "你好"}
    with pytest.raises(ReachError) as failed:
        parse_response(agent("http"), cap, {"code": 40001, "message": "text is required",
                                            "data": None})
    assert failed.value.kind.code == "upstream_error"
    assert "40001" in failed.value.message and "text is required" in failed.value.message


def test_http_request_template_and_response_paths():
    cap = CapabilityEntry(pk=1, capability_id="t.x", path="/run", adapter={
        "request": {"template": {"query": {"q": "{input.text}"}, "all": "{input}", "v": 2}},
        "response": {"output": "result", "reply": "result.answer"},
    })
    request = build_request(agent("http"), cap, {"text": "hi", "n": 1}, stream=False,
                            request_id="r")
    assert request.path == "/run"
    assert request.body == {"query": {"q": "hi"}, "all": {"text": "hi", "n": 1}, "v": 2}
    reply = parse_response(agent("http"), cap, {"result": {"answer": "42"},
                                                "usage": {"input_tokens": 3}})
    assert reply.reply_content == "42" and reply.output == {"answer": "42"}
    assert reply.input_tokens == 3


def test_openai_request_and_reply():
    cap = CapabilityEntry(pk=1, capability_id="chat.x")
    request = build_request(agent("openai"), cap, {"text": "hello"}, stream=True,
                            request_id="r")
    assert request.path == "/v1/chat/completions"
    assert request.body["messages"] == [{"role": "user", "content": "hello"}]
    assert request.body["stream_options"] == {"include_usage": True}
    reply = parse_response(agent("openai"), cap, {
        "id": "c", "choices": [{"message": {"content": "hey", "tool_calls": [{"id": "t"}]},
                                "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
    assert (reply.reply_content, reply.input_tokens, reply.output_tokens) == ("hey", 4, 2)
    assert reply.tool_calls == [{"id": "t"}] and reply.raw_meta["finish_reason"] == "tool_calls"
    with pytest.raises(ReachError, match="no choices"):
        parse_response(agent("openai"), cap, {"choices": []})


def test_a2a_message_send_and_replies():
    cap = CapabilityEntry(pk=1, capability_id="a.x")
    request = build_request(agent("a2a"), cap, {"text": "hi", "lang": "en"}, stream=False,
                            request_id="r-1")
    assert request.body["method"] == "message/send" and request.body["id"] == "r-1"
    parts = request.body["params"]["message"]["parts"]
    assert parts == [{"kind": "text", "text": "hi"}, {"kind": "data", "data": {"lang": "en"}}]
    message = parse_response(agent("a2a"), cap, {"jsonrpc": "2.0", "id": "r-1", "result": {
        "kind": "message", "parts": [{"kind": "text", "text": "hello"}]}})
    assert message.reply_content == "hello"
    task = parse_response(agent("a2a"), cap, {"jsonrpc": "2.0", "id": "r-1", "result": {
        "kind": "task", "id": "t1", "status": {"state": "completed"},
        "artifacts": [{"parts": [{"kind": "text", "text": "done"},
                                 {"kind": "data", "data": {"n": 1}}]}]}})
    assert (task.reply_content, task.output, task.raw_meta["state"]) == ("done", {"n": 1},
                                                                          "completed")
    with pytest.raises(ReachError, match="JSON-RPC error -32601"):
        parse_response(agent("a2a"), cap, {"jsonrpc": "2.0", "id": "r", "error": {
            "code": -32601, "message": "Method not found"}})
    with pytest.raises(ReachError) as bad:
        parse_response(agent("a2a"), cap, {"result": {}})
    assert bad.value.kind.code == "upstream_bad_response"


def test_events_are_reframed_whole_across_arbitrary_chunks():
    framer = EventFramer()
    stream = b"data: one\n\ndata: two\r\n\r\nevent: x\ndata: three\n\n"
    events = []
    for i in range(0, len(stream), 3):  # three bytes at a time
        events += framer.feed(stream[i:i + 3])
    assert events == [b"data: one\n\n", b"data: two\n\n", b"event: x\ndata: three\n\n"]
    assert framer.pending == b""
    assert data_of(events[2]) == b"three"
    event = ReachError("upstream_error", "broke").sse_event("r-1")
    assert event.startswith(b"event: error\ndata: {") and event.endswith(b"\n\n")
    assert data_of(event.rstrip(b"\n")).startswith(b'{"error":{"code":"upstream_error"')


def test_stream_usage_prefers_the_agents_figures_and_estimates_otherwise():
    reported = PROTOCOLS["openai"].stream_meter()
    reported.observe(b'{"choices": [{"delta": {"content": "a b"}}]}')
    assert reported.observe(b'{"choices": [], "usage": {"prompt_tokens": 5, '
                            b'"completion_tokens": 9}}') is True
    assert reported.totals() == (5, 9)
    estimated = PROTOCOLS["openai"].stream_meter()
    estimated.observe(b'{"choices": [{"delta": {"content": "hello world"}}]}')
    estimated.observe(b'{"choices": [{"delta": {"content": "\xe4\xbd\xa0\xe5\xa5\xbd"}}]}')
    estimated.observe(b"[DONE]")
    assert estimated.totals() == (0, 2 + 3)  # two words; two CJK characters + one "word"


def test_an_a2a_stream_is_metered_as_a2a_events_not_as_chat_chunks():
    meter = PROTOCOLS["a2a"].stream_meter()
    meter.observe(b'{"jsonrpc": "2.0", "id": "r", "result": {"kind": "artifact-update", '
                  b'"artifact": {"parts": [{"kind": "text", "text": "one two three"}]}}}')
    meter.observe(b'{"jsonrpc": "2.0", "id": "r", "result": {"kind": "status-update", '
                  b'"status": {"state": "working", "message": {"parts": '
                  b'[{"kind": "text", "text": "four"}]}}}}')
    assert meter.totals() == (0, 4)
    # The chat meter finds nothing in the same events: they are not chat chunks.
    chat = PROTOCOLS["openai"].stream_meter()
    chat.observe(b'{"jsonrpc": "2.0", "result": {"kind": "artifact-update", "artifact": '
                 b'{"parts": [{"kind": "text", "text": "one two three"}]}}}')
    assert chat.totals() == (0, 0)
    reported = PROTOCOLS["a2a"].stream_meter()
    reported.observe(b'{"jsonrpc": "2.0", "id": "r", "result": {"kind": "status-update", '
                     b'"status": {"state": "completed"}, "final": true, '
                     b'"metadata": {"usage": {"input_tokens": 7, "output_tokens": 11}}}}')
    assert reported.totals() == (7, 11)


def test_chat_input_is_shaped_by_the_protocol():
    chat = {"model": "m", "stream": True, "temperature": 0.2,
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "hello"}]}
    assert PROTOCOLS["openai"].chat_input(chat) == {
        "temperature": 0.2, "messages": chat["messages"]}
    assert PROTOCOLS["http"].chat_input(chat) == {"text": "hello"}
    assert PROTOCOLS["a2a"].chat_input(chat) == {"text": "hello"}
    with pytest.raises(ReachError) as missing:
        PROTOCOLS["http"].chat_input({"messages": [{"role": "system", "content": "x"}]})
    assert missing.value.code == "invalid_input"
