"""Draining a gateway's in-process event queue into storage (embedded mode).

Usage events and route feedback travel alike: a bounded queue in the gateway, drained
by the in-process scheduler when there is no Redis stream. Pure: the caller supplies
the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Drainable(Protocol):
    def drain(self, limit: int = ...) -> list[dict]: ...

    def shipped(self, count: int) -> None: ...


def drain_into(queue: Drainable, store: Callable[[list[dict]], int], *, batch: int,
               max_batches: int) -> int:
    """Move ``queue``'s events into ``store`` a batch at a time; returns what it stored.
    Bounded by ``max_batches`` so a busy gateway cannot keep the scheduler here. A batch
    ``store`` fails on goes back to the queue (its only copy) for the next run."""
    stored = 0
    for _ in range(max_batches):
        events = queue.drain(batch)
        if not events:
            break
        try:
            stored += store(events)
        except Exception:
            emit: Callable[[dict], None] | None = getattr(queue, "emit", None)
            for event in events if emit is not None else ():
                emit(event)
            raise
        queue.shipped(len(events))  # stored (or known already): off the spool
    return stored
