"""Per-instance circuit breakers for the gateway's upstream calls.

One breaker per upstream instance (keyed by its int pk). CLOSED lets every call through and
keeps outcomes in a sliding window of per-second buckets; once the window holds at least
``min_volume`` calls and a failure brings the failure share to ``failure_ratio``, the breaker
OPENs. After ``cooldown_seconds`` it turns HALF_OPEN and lets exactly one probe through:
success closes it, failure re-opens it with a fresh cool-down.

Stdlib only and thread-safe: the asyncio gateway records outcomes while the router reads the
open set from other threads. Every method is O(window) at worst and never blocks on I/O.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class _Breaker:
    pk: int
    state: BreakerState = BreakerState.CLOSED
    # [second, ok_count, fail_count], oldest first; at most one bucket per second.
    buckets: deque[list[int]] = field(default_factory=deque)
    ok: int = 0
    fail: int = 0
    opened_at: float = 0.0
    probe_started_at: float | None = None


class CircuitBreakers:
    """One breaker per upstream instance (keyed by int instance pk).

    Instances never recorded are CLOSED and cost no memory; CLOSED breakers whose window has
    emptied are dropped by ``states()`` / ``open_instances()``, so tracking stays bounded.
    """

    def __init__(
        self,
        *,
        window_seconds: float = 60.0,
        failure_ratio: float = 0.30,
        min_volume: int = 10,
        cooldown_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_open: Callable[[int], None] = lambda pk: None,
    ) -> None:
        """``on_open(instance_pk)`` is told of every trip (the metrics count them)."""
        if window_seconds <= 0 or cooldown_seconds < 0 or min_volume < 1:
            raise ValueError("window_seconds > 0, cooldown_seconds >= 0, min_volume >= 1")
        if not 0 < failure_ratio <= 1:
            raise ValueError("failure_ratio must be in (0, 1]")
        self._window = window_seconds
        self._ratio = failure_ratio
        self._min_volume = min_volume
        self._cooldown = cooldown_seconds
        self._clock = clock
        self._on_open = on_open
        self._lock = threading.Lock()
        self._breakers: dict[int, _Breaker] = {}
        # The router asks on every call: it looks only at breakers that are not
        # closed, and idle closed breakers are swept at most once a second.
        self._not_closed: set[int] = set()
        self._last_sweep = float("-inf")

    def allow(self, instance_pk: int) -> bool:
        """True if a call may go to the instance; in HALF_OPEN a True makes it the probe."""
        now = self._clock()
        with self._lock:
            b = self._breakers.get(instance_pk)
            if b is None:
                return True
            self._advance(b, now)
            if b.state is BreakerState.CLOSED:
                return True
            if b.state is BreakerState.OPEN or self._probe_in_flight(b, now):
                return False
            b.probe_started_at = now
            return True

    def no_verdict(self, instance_pk: int) -> None:
        """A call ended saying nothing of the instance (its caller's deadline cut it): if
        it was the half-open probe, another call may probe now, not after a cool-down
        (helper-50: a probe cut by its caller's deadline kept the breaker shut)."""
        with self._lock:
            b = self._breakers.get(instance_pk)
            if b is not None and b.state is BreakerState.HALF_OPEN:
                b.probe_started_at = None

    def record(self, instance_pk: int, *, ok: bool) -> None:
        """Record one call's outcome; creates the breaker if the instance has none yet.

        While OPEN, and while HALF_OPEN before any probe was issued, results are late ones from
        calls started before the breaker opened: they are ignored so they cannot close it.
        """
        now = self._clock()
        with self._lock:
            b = self._breakers.setdefault(instance_pk, _Breaker(instance_pk))
            self._advance(b, now)
            if b.state is BreakerState.HALF_OPEN:
                if b.probe_started_at is None:
                    return
                if ok:
                    self._close(b)
                else:
                    self._open(b, now)
                return
            if b.state is BreakerState.OPEN:
                return
            self._prune(b, now)
            second = int(now)
            if not b.buckets or b.buckets[-1][0] != second:
                b.buckets.append([second, 0, 0])
            b.buckets[-1][1 if ok else 2] += 1
            if ok:
                b.ok += 1
            else:
                b.fail += 1
            total = b.ok + b.fail
            # Only a failure trips it: a success that brings the window to its volume
            # says the instance answers (a break test saw one open on a success 29 s
            # after the last failure, and refuse every call for 30 s).
            if not ok and total >= self._min_volume and b.fail / total >= self._ratio:
                self._open(b, now)

    def state(self, instance_pk: int) -> BreakerState:
        """The instance's current state (CLOSED if it has no breaker)."""
        now = self._clock()
        with self._lock:
            b = self._breakers.get(instance_pk)
            if b is None:
                return BreakerState.CLOSED
            self._advance(b, now)
            return b.state

    def open_instances(self) -> frozenset[int]:
        """Instances normal traffic must avoid: OPEN in cool-down, or HALF_OPEN with a probe out.

        A HALF_OPEN instance with no probe out is left in, so the router can pick it and the
        gateway's ``allow()`` turns that call into the probe.
        """
        now = self._clock()
        with self._lock:
            if now - self._last_sweep >= 1.0:
                self._sweep(now)
                self._last_sweep = now
            out = []
            for pk in self._not_closed:
                b = self._breakers[pk]
                self._advance(b, now)
                if b.state is BreakerState.OPEN or (
                    b.state is BreakerState.HALF_OPEN and self._probe_in_flight(b, now)
                ):
                    out.append(pk)
            return frozenset(out)

    def states(self) -> dict[int, BreakerState]:
        """Every instance whose breaker is not CLOSED, for metrics."""
        now = self._clock()
        with self._lock:
            self._sweep(now)
            return {
                pk: b.state
                for pk, b in self._breakers.items()
                if b.state is not BreakerState.CLOSED
            }

    # Helpers below expect the lock to be held.

    def _advance(self, b: _Breaker, now: float) -> None:
        # Cool-down expiry is applied lazily on access: no timers in an asyncio gateway.
        if b.state is BreakerState.OPEN and now - b.opened_at >= self._cooldown:
            b.state = BreakerState.HALF_OPEN
            b.probe_started_at = None

    def _probe_in_flight(self, b: _Breaker, now: float) -> bool:
        # A probe that never reports back expires after a cool-down so it cannot wedge us.
        return b.probe_started_at is not None and now - b.probe_started_at < self._cooldown

    def _prune(self, b: _Breaker, now: float) -> None:
        horizon = now - self._window
        while b.buckets and b.buckets[0][0] <= horizon:
            _, ok, fail = b.buckets.popleft()
            b.ok -= ok
            b.fail -= fail

    def _open(self, b: _Breaker, now: float) -> None:
        self._not_closed.add(b.pk)
        b.state = BreakerState.OPEN
        b.opened_at = now
        b.probe_started_at = None
        # The window is meaningless once open and is restarted on close; free it now.
        b.buckets.clear()
        b.ok = b.fail = 0
        self._on_open(b.pk)

    def _close(self, b: _Breaker) -> None:
        self._not_closed.discard(b.pk)
        b.state = BreakerState.CLOSED
        b.probe_started_at = None
        b.buckets.clear()
        b.ok = b.fail = 0

    def _sweep(self, now: float) -> None:
        for pk in list(self._breakers):
            b = self._breakers[pk]
            self._advance(b, now)
            if b.state is BreakerState.CLOSED:
                self._prune(b, now)
                if not b.buckets:
                    del self._breakers[pk]
