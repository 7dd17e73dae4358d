"""OpenAI-compatible chat completions: ``messages`` in, ``choices`` out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.protocols.base import (
    AgentProtocol,
    AgentResponse,
    StreamMeter,
    UpstreamRequest,
    bad_response,
    usage_tokens,
)
from gateway.tasks import TaskRef
from reach_core.errors import ReachError
from routing.table import AgentEntry, CapabilityEntry


class ChatChunkMeter(StreamMeter):
    """Chat-completion chunks: text in ``choices[].delta.content``; the usage chunk (sent
    when ``stream_options.include_usage`` was asked for) has no choices."""

    json_events = True

    def read_event(self, event: dict) -> tuple[Mapping | None, list[str], bool]:
        usage = event.get("usage")
        texts = [content for choice in event.get("choices") or []
                 if isinstance(content := ((choice or {}).get("delta") or {}).get("content"),
                               str)]
        usage = usage if isinstance(usage, Mapping) else None
        return usage, texts, usage is not None and not event.get("choices")


class OpenAIProtocol(AgentProtocol):
    name = "openai"
    speaks_chat = True

    def request(self, agent: AgentEntry, capability: CapabilityEntry, payload: dict, *,
                stream: bool, request_id: str, task: TaskRef | None = None) -> UpstreamRequest:
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
            body["stream_options"] = {**(body.get("stream_options") or {}),
                                      "include_usage": True}
        return UpstreamRequest(capability.path or "/v1/chat/completions", body)

    def parse(self, agent: AgentEntry, capability: CapabilityEntry, body: Any) -> AgentResponse:
        if not isinstance(body, dict) or not isinstance(body.get("choices"), list) \
                or not body["choices"] or not isinstance(body["choices"][0], dict):
            raise bad_response("the agent's reply is not a chat completion (no choices)")
        choice = body["choices"][0]
        message = choice.get("message") or {}
        if not isinstance(message, dict):
            raise bad_response("the agent's reply has a malformed message")
        input_tokens, output_tokens = usage_tokens(body.get("usage"))
        return AgentResponse(
            reply_content=message.get("content"), tool_calls=message.get("tool_calls"),
            raw_meta={k: body.get(k) for k in ("id", "model", "created") if k in body}
            | {"finish_reason": choice.get("finish_reason")},
            input_tokens=input_tokens, output_tokens=output_tokens,
        )

    def chat_input(self, chat: dict) -> dict:
        # The chat request as sent, less what the gateway decides (model, stream).
        return {k: v for k, v in chat.items() if k not in ("model", "stream")}

    def stream_meter(self) -> StreamMeter:
        return ChatChunkMeter()
