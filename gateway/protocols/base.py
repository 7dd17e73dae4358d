"""What every agent protocol provides, and the plain-data helpers they share.

A protocol turns a call (the capability and the caller's input, already in the
agent's own parameter names) into an upstream request, reads the agent's reply
into an ``AgentResponse``, shapes a chat door's request into its own input, and
meters its own stream events. Pure code over plain data: no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from gateway.sse import EventNotUnderstood
from gateway.tasks import TaskRef
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
    # The agent's word on the work, for a task (A2A task states): None is a plain answer
    # (done); "working" means it took the work and reports later; "input-required" that
    # it waits for the caller. The agent's own task and context ids (A2A) go with it.
    state: str | None = None
    agent_task_id: str = ""
    agent_context_id: str = ""


@dataclass(frozen=True)
class UpstreamRequest:
    path: str
    body: dict


_NOT_JSON = object()


class StreamMeter:
    """Counts a stream's tokens event by event: the agent's own figures when it reports
    them, else an estimate from the text it streamed (a word, or a CJK character, per
    token). Subclasses say where a protocol's events keep text and usage."""

    # Every event of the protocol is a JSON object: one that is not raises
    # ``EventNotUnderstood``.
    json_events: ClassVar[bool] = False

    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0
        self._reported = False
        self._estimated = 0
        self.last_texts: list[str] = []  # the text the last observed event streamed

    def observe(self, data: bytes) -> bool:
        """Read one event's ``data``; True when the event carries usage and nothing else
        (a door that was not asked for usage may drop it)."""
        self.last_texts = []
        if data == b"[DONE]":
            return False
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            event = _NOT_JSON
        if not isinstance(event, dict):
            if self.json_events:
                raise EventNotUnderstood("the agent streamed an event that is not a JSON "
                                         "object")
            texts = self.other_texts(data, event)
            self._estimated += sum(estimate_tokens(text) for text in texts)
            self.last_texts = texts
            return False
        usage, texts, usage_only = self.read_event(event)
        if isinstance(usage, Mapping):
            self.input_tokens = _int(usage.get("input_tokens") or usage.get("prompt_tokens"))
            self.output_tokens = _int(usage.get("output_tokens")
                                      or usage.get("completion_tokens"))
            self._reported = True
        for text in texts:
            self._estimated += estimate_tokens(text)
        self.last_texts = texts
        return usage_only

    def read_event(self, event: dict) -> tuple[Mapping | None, list[str], bool]:
        """``(usage or None, texts streamed, usage only?)`` of one decoded event."""
        usage = event.get("usage")
        texts = [v for k in ("text", "content", "delta") if isinstance(v := event.get(k), str)]
        return (usage if isinstance(usage, Mapping) else None), texts, False

    def other_texts(self, data: bytes, event: Any) -> list[str]:
        """The text of an event that is no JSON object (``event`` is its decoded JSON,
        or ``_NOT_JSON``): none, unless a protocol says otherwise."""
        return []

    @property
    def reported(self) -> bool:
        """The agent reported its usage (else the totals are an estimate)."""
        return self._reported

    def totals(self) -> tuple[int, int]:
        if self._reported:
            return self.input_tokens, self.output_tokens
        return self.input_tokens, self._estimated


class PlainEventMeter(StreamMeter):
    """A plain agent's events (an SDK generator's chunks, any SSE): every event is text
    to the caller — its ``text``/``content``/``delta``, else the event itself (plain text,
    a JSON string, or the JSON of an object less its usage), so a chat door relaying
    such a stream shows what the agent sent instead of nothing."""

    def read_event(self, event: dict) -> tuple[Mapping | None, list[str], bool]:
        usage, texts, _ = super().read_event(event)
        if not texts and "error" not in event:
            rest = {k: v for k, v in event.items() if k != "usage"}
            if rest:
                texts = [orjson.dumps(rest).decode()]
        return usage, texts, False

    def other_texts(self, data: bytes, event: Any) -> list[str]:
        if isinstance(event, str):
            return [event]
        return [data.decode("utf-8", "replace")]


class AgentProtocol:
    """One way of talking to agents, registered by ``name`` in ``gateway.protocols``."""

    name: ClassVar[str]
    # Its streams are OpenAI chat-completion chunks: the chat door relays them as they
    # are; for other protocols it calls without streaming and sends the answer as one chunk.
    speaks_chat: ClassVar[bool] = False

    def request(self, agent: AgentEntry, capability: CapabilityEntry, payload: dict, *,
                stream: bool, request_id: str, task: TaskRef | None = None) -> UpstreamRequest:
        """``task``: the call is an attempt of that asynchronous task."""
        raise NotImplementedError

    def continued(self, original: dict, message: dict) -> dict:
        """A task's input after the caller answered the agent (``message``'s input): the
        original input with the answer's keys over it, sent again, for agents that keep
        no conversation; a protocol with conversations of its own sends the answer alone."""
        return {**original, **message}

    def parse(self, agent: AgentEntry, capability: CapabilityEntry, body: Any) -> AgentResponse:
        """Read a non-streamed reply. Raises ``ReachError`` for a reply that is not what the
        protocol promises (``upstream_bad_response``) or one reporting failure."""
        raise NotImplementedError

    def chat_input(self, chat: dict) -> dict:
        """The input for this protocol from an OpenAI chat request: the last user message."""
        return {"text": last_user_text(chat.get("messages") or [])}

    def stream_meter(self) -> StreamMeter:
        return StreamMeter()


TASK_STATES = frozenset({"submitted", "working", "input-required", "auth-required",
                         "completed", "failed", "canceled", "rejected", "unknown"})


def stated(body: Any) -> tuple[str | None, str]:
    """A plain agent's word on a task, from its reply's ``status`` object
    (``{"status": {"state": "input-required", "message": "Which language?"}}``): the state
    and the message, or ``(None, "")`` when the reply says nothing of the kind."""
    status = body.get("status") if isinstance(body, Mapping) else None
    if not isinstance(status, Mapping) or status.get("state") not in TASK_STATES:
        return None, ""
    message = status.get("message")
    return status["state"], message if isinstance(message, str) else ""


def bad_response(message: str) -> ReachError:
    return ReachError("upstream_bad_response", message)


# The most tokens one call may be said to use: more than any model reads and writes in
# one call. A larger figure (1e20, 2**62, 1e300) is the agent's fault, not usage, and is
# not believed (as a figure that is no number): taken, it failed the call's usage event
# (beyond 64 bits) and its budget settlement, retried for ever (a break test).
MAX_REPORTED_TOKENS = 1_000_000_000


def _int(value: Any) -> int:
    # A JSON number only: "99999999" or true is no token count (a re-test: a string
    # figure spent a tenant's monthly token budget in one call).
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    try:
        number = int(value)
    except (ValueError, OverflowError):  # NaN, infinity
        return 0
    return number if 0 <= number <= MAX_REPORTED_TOKENS else 0


def usage_tokens(usage: Any) -> tuple[int, int]:
    """``(input, output)`` from a usage object in either naming (OpenAI's or ours)."""
    if not isinstance(usage, Mapping):
        return 0, 0
    return (_int(usage.get("input_tokens") or usage.get("prompt_tokens")),
            _int(usage.get("output_tokens") or usage.get("completion_tokens")))


def estimate_tokens(text: str) -> int:
    cjk = sum(1 for ch in text if "\u3400" <= ch <= "\u9fff")
    return cjk + len(text.split()) if text.strip() else 0


def last_user_text(messages: list) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):  # content parts
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise ReachError("invalid_input", "'messages' needs a user message.")


def thaw(value: Any) -> Any:
    """A route table's frozen mapping as plain, JSON-ready dicts and lists."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value


def dig(data: Any, path: str) -> Any:
    """``a.b.0.c`` into nested dicts and lists; None when any step is missing."""
    for part in [p for p in path.split(".") if p]:
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    return data
