"""``POST /v1/chat/completions``: the OpenAI-compatible door, so the official SDK works.

``model`` names an agent (``name`` or ``namespace/name``) or a capability
(``capability:<id>``); the ``X-Reach-Intent`` header routes by intent instead.
OpenAI-protocol agents are streamed through event by event; other agents'
replies are dressed as chat completions (and, when streamed, as one chunk).
"""

from __future__ import annotations

import time

import orjson

from gateway.auth import authenticate
from reach_core.errors import ReachError
from routing.router import RouteRequest
from routing.table import RouteTable


def _route(table: RouteTable, tenant_pk: int, model, intent: str | None, namespace: str,
           internal: bool) -> RouteRequest:
    base = {"tenant_pk": tenant_pk, "namespace": namespace, "internal_network": internal}
    if intent:
        return RouteRequest(intent=intent, **base)
    if not isinstance(model, str) or not model:
        raise ReachError("invalid_input", "'model' must name an agent or 'capability:<id>' "
                           "(or send the X-Reach-Intent header).")
    if model.startswith("capability:"):
        return RouteRequest(capability=model.split(":", 1)[1], **base)
    for agent in table.agents.values():
        if model in (agent.name, f"{agent.namespace}/{agent.name}") and agent.capabilities:
            return RouteRequest(capability=agent.capabilities[0].capability_id, agent=model,
                                **base)
    raise ReachError("no_capability", f"No agent is named {model!r}.")


def _last_user_text(messages: list) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise ReachError("invalid_input", "'messages' needs a user message.")


def completion_body(app, ctx, candidate, reply) -> dict:
    usage = {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens,
             "total_tokens": reply.input_tokens + reply.output_tokens}
    message = {"role": "assistant", "content": reply.reply_content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return {
        "id": f"chatcmpl-{ctx.request_id}", "object": "chat.completion",
        "created": int(time.time()), "model": candidate.agent.name,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": reply.raw_meta.get("finish_reason") or "stop"}],
        "usage": usage,
    }


async def completions(app, scope, receive, send, request_id: str) -> None:
    from gateway.app import header, send_json

    table = app._table()
    key = authenticate(table, header(scope, b"authorization"))
    body = await app.read_json(scope, receive)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ReachError("invalid_input", "'messages' must be a non-empty list.")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ReachError("invalid_input", "'stream' must be true or false.")
    route = _route(table, key.tenant_pk, body.get("model"), header(scope, b"x-reach-intent"),
                   header(scope, b"x-reach-namespace") or "default",
                   app.config.is_internal((scope.get("client") or (None,))[0]))
    def payload_for(candidate) -> dict:
        # OpenAI agents get the chat request as sent; others the last user message.
        if candidate.agent.protocol == "openai":
            return {k: v for k, v in body.items() if k not in ("model", "stream")}
        return {"text": _last_user_text(messages)}

    candidate, agent_payload, ctx = app.begin(scope, table, route, payload_for, request_id,
                                              key.tenant_pk)
    if app.governed:
        await app.governor.admit(table, key.tenant_pk, candidate)
    if candidate.agent.protocol == "openai":
        upstream = await app.caller.open(table, route, candidate, agent_payload, ctx,
                                         stream=stream)
        if stream:
            wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            await app.relay(scope, receive, send, upstream, ctx, openai_passthrough=True,
                            keep_usage_chunk=wants_usage)
            return
        reply = await app.caller.read(upstream, ctx)
    else:
        upstream = await app.caller.open(table, route, candidate, agent_payload, ctx,
                                         stream=False)
        reply = await app.caller.read(upstream, ctx)
    candidate = upstream.candidate
    app.emit_usage(ctx, candidate, "success", reply.input_tokens, reply.output_tokens)
    completion = completion_body(app, ctx, candidate, reply)
    if not stream:
        await send_json(send, 200, completion, request_id)
        return
    # A non-streaming agent asked for a stream: the whole answer as one chunk.
    base = {"id": completion["id"], "object": "chat.completion.chunk",
            "created": completion["created"], "model": completion["model"]}
    events = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                    "content": reply.reply_content or ""},
                              "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    payload_bytes = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"x-request-id", request_id.encode())]})
    await send({"type": "http.response.body", "body": payload_bytes + b"data: [DONE]\n\n"})
