"""Protocol adapters and SSE framing: pure functions, no network."""

from __future__ import annotations

import pytest

from gateway.adapters import build_request, parse_response
from gateway.sse import EventFramer, StreamUsage, data_of, error_event
from reach_core.errors import ReachError
from routing.table import AgentEntry, CapabilityEntry


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
    assert error_event({"error": {"code": "x"}}).startswith(b"event: error\ndata: {")


def test_stream_usage_prefers_the_agents_figures_and_estimates_otherwise():
    reported = StreamUsage()
    reported.observe(b'{"choices": [{"delta": {"content": "a b"}}]}')
    assert reported.observe(b'{"choices": [], "usage": {"prompt_tokens": 5, '
                            b'"completion_tokens": 9}}') is True
    assert reported.totals() == (5, 9)
    estimated = StreamUsage()
    estimated.observe(b'{"choices": [{"delta": {"content": "hello world"}}]}')
    estimated.observe(b'{"choices": [{"delta": {"content": "\xe4\xbd\xa0\xe5\xa5\xbd"}}]}')
    estimated.observe(b"[DONE]")
    assert estimated.totals() == (0, 2 + 3)  # two words; two CJK characters + one "word"
