"""Plain HTTP/JSON agents, described declaratively in the capability's ``adapter``.

``adapter.request.template`` shapes the body (any string ``"{input.text}"`` or
``"{input}"`` is replaced by that value, keeping its JSON type);
``adapter.response`` maps the reply: an ``envelope`` (``{code, message, data}``
business wrappers, failure when ``code`` is not ``ok_value``), ``output`` and
``reply`` paths into the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.protocols.base import (
    AgentProtocol,
    AgentResponse,
    PlainEventMeter,
    StreamMeter,
    UpstreamRequest,
    bad_response,
    dig,
    stated,
    thaw,
    usage_tokens,
)
from gateway.tasks import TaskRef
from reach_core.errors import ReachError
from routing.table import AgentEntry, CapabilityEntry

_REPLY_KEYS = ("message", "reply", "text", "content", "answer")


def fill(template: Any, values: Mapping) -> Any:
    if isinstance(template, str) and template.startswith("{") and template.endswith("}"):
        return dig(values, template[1:-1])
    if isinstance(template, Mapping):
        return {k: fill(v, values) for k, v in template.items()}
    if isinstance(template, list | tuple):
        return [fill(v, values) for v in template]
    return template


class HttpProtocol(AgentProtocol):
    name = "http"

    def request(self, agent: AgentEntry, capability: CapabilityEntry, payload: dict, *,
                stream: bool, request_id: str, task: TaskRef | None = None) -> UpstreamRequest:
        template = (capability.adapter.get("request") or {}).get("template")
        body = fill(thaw(template), {"input": payload}) if template else payload
        return UpstreamRequest(capability.path or "/", body)

    def parse(self, agent: AgentEntry, capability: CapabilityEntry, body: Any) -> AgentResponse:
        mapping = capability.adapter.get("response") or {}
        envelope = mapping.get("envelope")
        meta: dict = {}
        if envelope:
            if not isinstance(body, Mapping):
                raise bad_response("the agent's reply is not the declared envelope")
            code_field = envelope.get("code_field", "code")
            meta = {"code": body.get(code_field)}
            if body.get(code_field) != envelope.get("ok_value", 0):
                message = body.get(envelope.get("message_field", "message")) or "no message"
                raise ReachError(
                    "upstream_error",
                    f"the agent reported failure (code {body.get(code_field)!r}: {message})",
                )
            body = body.get(envelope.get("data_field", "data"))
        output = dig(body, mapping["output"]) if mapping.get("output") else body
        reply = dig(body, mapping["reply"]) if mapping.get("reply") else None
        if reply is None and isinstance(output, Mapping):
            reply = next((output[k] for k in _REPLY_KEYS if isinstance(output.get(k), str)),
                         None)
        input_tokens, output_tokens = usage_tokens(
            body.get("usage") if isinstance(body, Mapping) else None)
        state, message = stated(body)
        if state is not None and reply is None and message:
            reply = message
        return AgentResponse(
            reply_content=reply if isinstance(reply, str) else None, output=output,
            raw_meta=meta, input_tokens=input_tokens, output_tokens=output_tokens,
            state=state,
        )

    def stream_meter(self) -> StreamMeter:
        return PlainEventMeter()
