"""Server-sent events: re-framing an upstream byte stream into whole events."""

from __future__ import annotations

import orjson

_SEPARATORS = (b"\r\n\r\n", b"\n\n")


class EventFramer:
    """Feed bytes as they arrive; get back the complete events (each ending in a blank line).

    Upstreams flush at arbitrary byte boundaries; relaying half an event would
    let a client parse a torn ``data:`` line.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        events = []
        while True:
            cut = min((i, s) for s in _SEPARATORS if (i := self._buffer.find(s)) != -1) \
                if any(s in self._buffer for s in _SEPARATORS) else None
            if cut is None:
                return events
            index, separator = cut
            end = index + len(separator)
            events.append(self._buffer[:index].replace(b"\r\n", b"\n") + b"\n\n")
            self._buffer = self._buffer[end:]

    @property
    def pending(self) -> bytes:
        return self._buffer


def data_of(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of an event, or None if it has none."""
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def error_event(body: dict) -> bytes:
    return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"


class StreamUsage:
    """Counts tokens of an OpenAI-style stream: the agent's usage chunk when it sends one,
    else an estimate from the content deltas (a word, or a CJK character, per token)."""

    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0
        self._reported = False
        self._estimated = 0
        self.text: list[str] = []

    def observe(self, data: bytes) -> bool:
        """Read one event's data; returns True for the usage-only chunk (no choices)."""
        if data == b"[DONE]":
            return False
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if not isinstance(chunk, dict):
            return False
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.input_tokens = int(usage.get("prompt_tokens") or 0)
            self.output_tokens = int(usage.get("completion_tokens") or 0)
            self._reported = True
        for choice in chunk.get("choices") or []:
            content = ((choice or {}).get("delta") or {}).get("content")
            if isinstance(content, str):
                self.text.append(content)
                self._estimated += estimate_tokens(content)
        return isinstance(usage, dict) and not chunk.get("choices")

    def totals(self) -> tuple[int, int]:
        if self._reported:
            return self.input_tokens, self.output_tokens
        return self.input_tokens, self._estimated


def estimate_tokens(text: str) -> int:
    cjk = sum(1 for ch in text if "\u3400" <= ch <= "\u9fff")
    return cjk + len(text.split()) if text.strip() else 0
