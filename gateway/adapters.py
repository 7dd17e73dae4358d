"""Protocol adapters: how to ask each kind of agent, and how to read its answer.

Each adapter turns a call (the capability and the caller's input, already
mapped to the agent's own parameter names) into an upstream request, and an
upstream reply into an ``AgentResponse``. Pure functions over plain data.

- ``openai``: OpenAI-compatible chat completions (``messages`` in, ``choices`` out).
- ``http``: plain JSON with a declarative request template and response mapping,
  e.g. unwrapping a ``{code, data: {message}}`` business envelope.
- ``a2a``: A2A JSON-RPC ``message/send`` and ``message/stream``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reach_core.errors import ReachError
from routing.table import AgentEntry, CapabilityEntry


@dataclass
class AgentResponse:
    reply_content: str | None = None
    tool_calls: list | None = None
    output: Any = None
    raw_meta: dict = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class UpstreamRequest:
    path: str
    body: dict


def thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value


def _dig(data: Any, path: str) -> Any:
    """``a.b.0.c`` into nested dicts and lists; None when any step is missing."""
    for part in [p for p in path.split(".") if p]:
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    return data


def _fill(template: Any, values: Mapping) -> Any:
    """A request template: any string ``"{input.text}"`` / ``"{input}"`` is replaced by
    that value (keeping its JSON type); other values are kept as written."""
    if isinstance(template, str) and template.startswith("{") and template.endswith("}"):
        return _dig(values, template[1:-1])
    if isinstance(template, Mapping):
        return {k: _fill(v, values) for k, v in template.items()}
    if isinstance(template, list | tuple):
        return [_fill(v, values) for v in template]
    return template


# ---- requests ------------------------------------------------------------------------------


def build_request(agent: AgentEntry, capability: CapabilityEntry, payload: dict,
                  *, stream: bool, request_id: str) -> UpstreamRequest:
    if agent.protocol == "openai":
        return UpstreamRequest(capability.path or "/v1/chat/completions",
                               openai_body(agent, payload, stream=stream))
    if agent.protocol == "a2a":
        return UpstreamRequest(capability.path or "/", a2a_body(payload, stream=stream,
                                                                request_id=request_id))
    template = (capability.adapter.get("request") or {}).get("template")
    body = _fill(thaw(template), {"input": payload}) if template else payload
    return UpstreamRequest(capability.path or "/", body)


def openai_body(agent: AgentEntry, payload: dict, *, stream: bool) -> dict:
    if isinstance(payload.get("messages"), list):
        body = dict(payload)
    else:
        text = payload.get("text") or payload.get("prompt") or payload.get("input")
        if not isinstance(text, str):
            raise ReachError("invalid_input",
                               "input needs 'messages', or a 'text' or 'prompt' string.")
        body = {k: v for k, v in payload.items() if k not in ("text", "prompt", "input")}
        body["messages"] = [{"role": "user", "content": text}]
    body.setdefault("model", agent.name)
    body["stream"] = stream
    if stream:
        # Usage must be counted for streams too: ask the agent to send it.
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return body


def a2a_body(payload: dict, *, stream: bool, request_id: str) -> dict:
    text = payload.get("text") or payload.get("prompt")
    parts = [{"kind": "text", "text": text}] if isinstance(text, str) else []
    data = {k: v for k, v in payload.items() if k not in ("text", "prompt")}
    if data:
        parts.append({"kind": "data", "data": data})
    return {
        "jsonrpc": "2.0", "id": request_id,
        "method": "message/stream" if stream else "message/send",
        "params": {"message": {"role": "user", "parts": parts,
                               "messageId": uuid.uuid4().hex}},
    }


# ---- responses -----------------------------------------------------------------------------


def parse_response(agent: AgentEntry, capability: CapabilityEntry, body: Any) -> AgentResponse:
    """Read a non-streamed reply. Raises ``ReachError`` for a reply that is not what the
    protocol promises (``upstream_bad_response``) or an envelope reporting failure."""
    if agent.protocol == "openai":
        return parse_openai(body)
    if agent.protocol == "a2a":
        return parse_a2a(body)
    return parse_http(capability, body)


def _bad(message: str) -> ReachError:
    return ReachError("upstream_bad_response", message)


def parse_openai(body: Any) -> AgentResponse:
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) \
            or not body["choices"]:
        raise _bad("the agent's reply is not a chat completion (no choices)")
    message = body["choices"][0].get("message") or {}
    usage = body.get("usage") or {}
    return AgentResponse(
        reply_content=message.get("content"), tool_calls=message.get("tool_calls"),
        output=None,
        raw_meta={k: body.get(k) for k in ("id", "model", "created") if k in body}
        | {"finish_reason": body["choices"][0].get("finish_reason")},
        input_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
    )


def parse_http(capability: CapabilityEntry, body: Any) -> AgentResponse:
    mapping = capability.adapter.get("response") or {}
    envelope = mapping.get("envelope")
    meta: dict = {}
    if envelope:
        if not isinstance(body, Mapping):
            raise _bad("the agent's reply is not the declared envelope")
        code_field = envelope.get("code_field", "code")
        ok_value = envelope.get("ok_value", 0)
        meta = {"code": body.get(code_field)}
        if body.get(code_field) != ok_value:
            message = body.get(envelope.get("message_field", "message")) or "no message"
            raise ReachError(
                "upstream_error",
                f"the agent reported failure (code {body.get(code_field)!r}: {message})",
            )
        body = body.get(envelope.get("data_field", "data"))
    output = _dig(body, mapping["output"]) if mapping.get("output") else body
    reply = _dig(body, mapping["reply"]) if mapping.get("reply") else None
    if reply is None and isinstance(output, Mapping):
        for key in ("message", "reply", "text", "content", "answer"):
            if isinstance(output.get(key), str):
                reply = output[key]
                break
    usage = _dig(body, "usage") if isinstance(body, Mapping) else None
    usage = usage if isinstance(usage, Mapping) else {}
    return AgentResponse(
        reply_content=reply if isinstance(reply, str) else None, output=output,
        raw_meta=meta,
        input_tokens=int(usage.get("input_tokens") or usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or usage.get("completion_tokens") or 0),
    )


def parse_a2a(body: Any) -> AgentResponse:
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
        raise _bad("the agent's reply is not JSON-RPC 2.0")
    if body.get("error"):
        error = body["error"]
        raise ReachError("upstream_error",
                           f"the agent returned JSON-RPC error {error.get('code')}: "
                           f"{error.get('message')}")
    result = body.get("result")
    if not isinstance(result, dict):
        raise _bad("the agent's JSON-RPC reply has no result")
    texts, data = [], None
    for part in _a2a_parts(result):
        if part.get("kind") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part.get("kind") == "data":
            data = part.get("data")
    return AgentResponse(
        reply_content="".join(texts) or None, output=data,
        raw_meta={k: result.get(k) for k in ("kind", "id", "contextId") if k in result}
        | ({"state": result["status"].get("state")} if isinstance(result.get("status"), dict)
           else {}),
    )


def _a2a_parts(result: dict) -> list[dict]:
    """A Message's parts, or a Task's artifacts' parts (then its status message's)."""
    if result.get("kind") == "message" or "parts" in result:
        return [p for p in result.get("parts") or [] if isinstance(p, dict)]
    parts = []
    for artifact in result.get("artifacts") or []:
        parts.extend(p for p in artifact.get("parts") or [] if isinstance(p, dict))
    if not parts and isinstance(result.get("status"), dict):
        message = result["status"].get("message") or {}
        parts.extend(p for p in message.get("parts") or [] if isinstance(p, dict))
    return parts
