"""Usage events: one per call, handed off without ever blocking the call.

The gateway appends to a bounded in-memory queue; a sink drains it (the
metering pipeline: a Redis stream in production, the in-process consumer in
embedded mode). A full queue drops the event and counts the drop rather than
slow a call.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from gateway.metrics import USAGE_DROPPED
from gateway.usage_spool import UsageSpool


class UsageQueue:
    """``on_drop`` counts what a full queue drops (the route-feedback queue is one too).
    With a ``spool`` (``gateway.usage_spool``) every event queued is on disk too until
    its shipper says it is shipped (``shipped``), and a drain first takes in the events
    of processes that died before shipping theirs."""

    def __init__(self, maxlen: int = 100_000, *,
                 on_drop: Callable[[], None] = USAGE_DROPPED.inc,
                 spool: UsageSpool | None = None) -> None:
        self._events: collections.deque[dict] = collections.deque()
        self._maxlen = maxlen
        self._on_drop = on_drop
        self._spool = spool
        self._lock = threading.Lock()
        self.emitted = 0

    def opened(self, event: dict) -> Any:
        """A call goes to an agent: with a spool, ``event`` (its ``worker_lost`` event) is
        what it is metered if this process dies first; pass what this returns to its
        final ``emit``."""
        if self._spool is None:
            return None
        with self._lock:
            return self._spool.opened(event)

    def emit(self, event: dict, opened: Any = None) -> None:
        with self._lock:
            self._emit(event, opened)

    def _emit(self, event: dict, opened: Any = None) -> None:
        if len(self._events) >= self._maxlen:
            self._on_drop()
            if opened is not None:  # dropped: its open line must not outlive it either
                self._spool.resolved(opened)
            return
        if self._spool is not None:
            self._spool.write(event, opened)
        self._events.append(event)
        self.emitted += 1

    def drain(self, limit: int = 1000) -> list[dict]:
        with self._lock:
            if self._spool is not None:
                self._spool.recover(self._emit)
                self._spool.roll()
            out = []
            while self._events and len(out) < limit:
                out.append(self._events.popleft())
            return out

    def shipped(self, count: int) -> None:
        """``count`` drained events were shipped (or stored), oldest first."""
        if self._spool is not None and count:
            with self._lock:
                self._spool.shipped(count)

    def close(self) -> None:
        """At shutdown, after the last shipping: what is still queued stays on disk for
        the next process."""
        if self._spool is not None:
            with self._lock:
                self._spool.close()

    def __len__(self) -> int:
        return len(self._events)


BATCH = 100


async def ship_to_redis(queue: UsageQueue, client, stream: str, *,
                        interval_s: float = 0.05, maxlen: int = 1_000_000,
                        what: str = "usage") -> None:
    """Forever: move queued usage events to the Redis stream the metering consumer reads
    (or ``what`` other events to the stream their consumer reads: route feedback).

    One stream entry per batch of up to ``BATCH`` events (``{"b": <orjson list>}``):
    one Redis command for a hundred calls, not one per call. While Redis is away the
    events wait in the (bounded) queue and go out when it is back. Cancelled (at
    shutdown), it ships what is waiting once more, and says how many events are lost
    if that fails too.
    """
    import asyncio
    import logging

    import orjson

    logger = logging.getLogger(__name__)
    pending: list[dict] = []
    paused_since: float | None = None
    last_warning = 0.0

    async def ship() -> None:
        pipe = client.pipeline(transaction=False)
        for start in range(0, len(pending), BATCH):
            pipe.xadd(stream, {"b": orjson.dumps(pending[start:start + BATCH])},
                      maxlen=maxlen, approximate=True)
        await pipe.execute()

    loop = asyncio.get_running_loop()
    try:
        while True:
            pending.extend(queue.drain(1000))
            if not pending:
                await asyncio.sleep(interval_s)
                continue
            try:
                await ship()
                queue.shipped(len(pending))
                pending = []
                if paused_since is not None:
                    logger.warning("%s shipping resumed after %.1f s", what,
                                   loop.time() - paused_since)
                    paused_since = None
            except Exception as exc:  # Redis down: keep them, try again shortly
                now = loop.time()
                paused_since = paused_since if paused_since is not None else now
                if now - last_warning >= 30:  # once, then every 30 s, not every retry
                    logger.warning("%s shipping paused (%s); %d events waiting", what,
                                   type(exc).__name__, len(pending))
                    last_warning = now
                await asyncio.sleep(min(1.0, interval_s * 20))
    except asyncio.CancelledError:
        pending.extend(queue.drain(len(queue)))
        if pending:
            try:
                await asyncio.wait_for(ship(), timeout=2)
                queue.shipped(len(pending))
            except Exception:
                logger.error("%s shipping stopped with Redis unreachable: %d %s "
                             "events lost", what, len(pending), what)
        raise
