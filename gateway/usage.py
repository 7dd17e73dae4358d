"""Usage events: one per call, handed off without ever blocking the call.

The gateway appends to a bounded in-memory queue; a sink drains it (the
metering pipeline: a Redis stream in production, the in-process consumer in
embedded mode). A full queue drops the event and counts the drop rather than
slow a call.
"""

from __future__ import annotations

import collections
import threading

from gateway.metrics import USAGE_DROPPED


class UsageQueue:
    def __init__(self, maxlen: int = 100_000) -> None:
        self._events: collections.deque[dict] = collections.deque()
        self._maxlen = maxlen
        self._lock = threading.Lock()
        self.emitted = 0

    def emit(self, event: dict) -> None:
        with self._lock:
            if len(self._events) >= self._maxlen:
                USAGE_DROPPED.inc()
                return
            self._events.append(event)
            self.emitted += 1

    def drain(self, limit: int = 1000) -> list[dict]:
        with self._lock:
            out = []
            while self._events and len(out) < limit:
                out.append(self._events.popleft())
            return out

    def __len__(self) -> int:
        return len(self._events)
