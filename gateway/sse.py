"""Server-sent events: re-framing an upstream byte stream into whole events."""

from __future__ import annotations

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
