"""A2A JSON-RPC: ``message/send`` and ``message/stream``.

A reply is a Message (its parts) or a Task (its artifacts' parts, else its
status message's). A stream is a sequence of JSON-RPC results: messages,
tasks, ``status-update`` and ``artifact-update`` events; usage, when an agent
reports it, is in a result's ``metadata.usage``.
"""

from __future__ import annotations

import uuid
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


def parts_of(result: Mapping) -> list[dict]:
    """A Message's parts, an artifact update's, or a Task's artifacts' (then its status
    message's)."""
    if result.get("kind") == "message" or "parts" in result:
        return [p for p in result.get("parts") or [] if isinstance(p, dict)]
    artifact = result.get("artifact")
    if isinstance(artifact, Mapping):  # artifact-update
        return [p for p in artifact.get("parts") or [] if isinstance(p, dict)]
    parts = []
    for artifact in result.get("artifacts") or []:
        if isinstance(artifact, Mapping):
            parts.extend(p for p in artifact.get("parts") or [] if isinstance(p, dict))
    status = result.get("status")
    if not parts and isinstance(status, Mapping) and isinstance(status.get("message"), Mapping):
        parts.extend(p for p in status["message"].get("parts") or [] if isinstance(p, dict))
    return parts


def _text(value: Any) -> str:
    return value[:255] if isinstance(value, str) else ""


class A2AEventMeter(StreamMeter):
    def read_event(self, event: dict) -> tuple[Mapping | None, list[str], bool]:
        result = event.get("result")
        if not isinstance(result, Mapping):
            return None, [], False
        metadata = result.get("metadata")
        usage = metadata.get("usage") if isinstance(metadata, Mapping) else None
        texts = [p["text"] for p in parts_of(result)
                 if p.get("kind") == "text" and isinstance(p.get("text"), str)]
        return (usage if isinstance(usage, Mapping) else None), texts, False


class A2AProtocol(AgentProtocol):
    name = "a2a"

    def request(self, agent: AgentEntry, capability: CapabilityEntry, payload: dict, *,
                stream: bool, request_id: str, task: TaskRef | None = None) -> UpstreamRequest:
        text = payload.get("text") or payload.get("prompt")
        parts: list[dict] = [{"kind": "text", "text": text}] if isinstance(text, str) else []
        data = {k: v for k, v in payload.items() if k not in ("text", "prompt")}
        if data:
            parts.append({"kind": "data", "data": data})
        message = {"role": "user", "parts": parts, "messageId": uuid.uuid4().hex}
        params: dict = {"message": message}
        if task is not None:
            # The agent's own task, when this continues it; and where it may push the
            # task's status later (verified by the token), for work it does not finish
            # within the call.
            if task.agent_task_id:
                message["taskId"] = task.agent_task_id
            if task.agent_context_id:
                message["contextId"] = task.agent_context_id
            if task.push_url:
                params["configuration"] = {"pushNotificationConfig": {
                    "url": task.push_url, "token": task.push_token}}
        return UpstreamRequest(capability.path or "/", {
            "jsonrpc": "2.0", "id": request_id,
            "method": "message/stream" if stream else "message/send", "params": params,
        })

    def continued(self, original: dict, message: dict) -> dict:
        return dict(message)  # the agent keeps the conversation: the answer alone

    def parse(self, agent: AgentEntry, capability: CapabilityEntry, body: Any) -> AgentResponse:
        if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
            raise bad_response("the agent's reply is not JSON-RPC 2.0")
        if body.get("error"):
            error = body["error"] if isinstance(body["error"], dict) else {}
            raise ReachError("upstream_error",
                             f"the agent returned JSON-RPC error {error.get('code')}: "
                             f"{error.get('message')}")
        result = body.get("result")
        if not isinstance(result, dict):
            raise bad_response("the agent's JSON-RPC reply has no result")
        texts, data = [], None
        for part in parts_of(result):
            if part.get("kind") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("kind") == "data":
                data = part.get("data")
        metadata = result.get("metadata")
        input_tokens, output_tokens = usage_tokens(
            metadata.get("usage") if isinstance(metadata, Mapping) else None)
        status = result.get("status")
        is_task = result.get("kind") == "task" or isinstance(status, dict)
        state = status.get("state") if isinstance(status, dict) else None
        return AgentResponse(
            reply_content="".join(texts) or None, output=data,
            raw_meta={k: result.get(k) for k in ("kind", "id", "contextId") if k in result}
            | ({"state": state} if isinstance(status, dict) else {}),
            input_tokens=input_tokens, output_tokens=output_tokens,
            state=state if isinstance(state, str) else None,
            agent_task_id=_text(result.get("id")) if is_task else _text(result.get("taskId")),
            agent_context_id=_text(result.get("contextId")),
        )

    def stream_meter(self) -> StreamMeter:
        return A2AEventMeter()
