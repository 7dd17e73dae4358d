"""Server-sent events: re-framing an upstream byte stream into whole events."""

from __future__ import annotations

import asyncio
import itertools

import orjson

from reach_core.errors import ReachError


class EventFramer:
    """Feed bytes as they arrive; get back the complete events (each ending in a blank line).

    Upstreams flush at arbitrary byte boundaries; relaying half an event would
    let a client parse a torn ``data:`` line. An event longer than ``max_event_bytes``
    raises ``EventTooLarge``: an agent that never ends its event must not fill the
    gateway's memory. Each byte is searched once (a long event arriving in many pieces
    was rescanned and recopied on every piece, blocking the loop for seconds at 50 MB).
    """

    def __init__(self, max_event_bytes: int = 10 * 1024 * 1024) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._tail = b""  # the last bytes kept, for a separator split across pieces
        self._max = max_event_bytes

    def feed(self, chunk: bytes) -> list[bytes]:
        if not chunk:
            return []
        # A separator may begin in the tail of what came before: search the join. Each
        # kind of separator is searched from where the last event ended, never again
        # over bytes already passed (helper-50: a piece holding 80,000 tiny events was
        # recopied and rescanned per event, and held the event loop for 25 s).
        tail = self._tail
        window = tail + chunk
        events = []
        pos = 0  # where the next event begins in ``window``
        lf, crlf = window.find(b"\n\n"), window.find(b"\r\n\r\n")
        while True:
            if -1 < lf < pos:
                lf = window.find(b"\n\n", pos)
            if -1 < crlf < pos:
                crlf = window.find(b"\r\n\r\n", pos)
            if crlf != -1 and (lf == -1 or crlf < lf):
                index, size = crlf, 4
            elif lf != -1:
                index, size = lf, 2
            else:
                break
            if pos == 0 and self._parts:
                # The event began in earlier pieces: those, less the tail they end in.
                body = b"".join(self._parts)
                body = body[:len(body) - len(tail)] + window[:index]
            else:
                body = window[pos:index]
            events.append(body.replace(b"\r\n", b"\n") + b"\n\n")
            self._parts, self._size = [], 0
            pos = index + size
        if pos == 0:
            self._append(chunk)
            self._tail = window[-3:]
        else:
            rest = window[pos:]
            if rest:
                self._append(rest)
            self._tail = rest[-3:]
        return events

    def _append(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._size > self._max:
            raise EventTooLarge(f"an event of the agent's stream is over {self._max} bytes")
        self._parts.append(piece)

    @property
    def pending(self) -> bytes:
        return b"".join(self._parts)


class EventTooLarge(ValueError):
    pass


class EventNotUnderstood(ValueError):
    """An event its protocol cannot have sent (a chat chunk that is not JSON): relayed,
    it would break the caller's parser mid-stream; the stream ends as the agent's fault."""


class AgentReportedError(Exception):
    """The agent ended its stream with an ``event: error`` of its own."""


def is_error_event(event: bytes) -> bool:
    """Whether the event is named ``error`` (how agents end a stream that failed)."""
    return event.startswith(b"event: error") or b"\nevent: error" in event \
        or event.startswith(b"event:error") or b"\nevent:error" in event


def data_of(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of an event, or None if it has none."""
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


# Events handled before the event loop is given back: an agent's 240 KB piece can hold
# 80,000 tiny events, and handling them in one go held every other call (helper-50).
EVENTS_PER_TURN = 1000
COLLECT_SLICE = 64 * 1024  # bytes of a whole stream framed at a time


async def collected(body: bytes, meter) -> dict:
    """A whole stream read as one reply, for a plain agent that streams whatever it is
    asked (an SDK generator): ``{"events": [each event's data, decoded when JSON],
    "text": what its events said}``, ``meter`` (a ``StreamMeter``) counting as it reads.
    An ``error`` event is the agent's failure (``upstream_error``)."""
    events: list = []
    texts: list[str] = []
    framer = EventFramer(max_event_bytes=len(body) + 1)
    handled = 0
    pieces = (body[at:at + COLLECT_SLICE] for at in range(0, len(body), COLLECT_SLICE))
    for piece in itertools.chain(pieces, (b"\n\n",)):
        # Framed a slice at a time, the loop given a turn between slices and every
        # ``EVENTS_PER_TURN`` events: 10 MB of comment lines framed in one go held it
        # for 2.8 s (helper-52).
        for event in framer.feed(piece):
            handled += 1
            if handled % EVENTS_PER_TURN == 0:
                await asyncio.sleep(0)
            _collect(event, meter, events, texts)
        await asyncio.sleep(0)
    return {"events": events, "text": "".join(texts)}


def _collect(event: bytes, meter, events: list, texts: list[str]) -> None:
    if is_error_event(event):
        raise ReachError("upstream_error", "the agent's stream ended with an error event")
    data = data_of(event)
    if data is None or data == b"[DONE]":
        return
    meter.observe(data)
    texts += meter.last_texts
    try:
        events.append(orjson.loads(data))
    except orjson.JSONDecodeError:
        events.append(data.decode("utf-8", "replace"))
