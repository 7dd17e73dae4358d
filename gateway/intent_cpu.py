"""Each tenant's share of a gateway process's CPU for intent matching.

Matching an intent (embedding it, scoring every capability text) is CPU spent in one
step of the event loop: a dry run or an intent call never waits on anything while it
runs, so it never counts as a call in flight for long, and a tenant sending many long
intents at once stalled every other tenant's calls and the heartbeats for seconds (a
break test: another tenant's 1 ms echo took 27 s) without ever being refused. So each
tenant has a bucket of matching time: it refills at ``ms_per_s`` (a share of one core)
up to ``burst_ms``, each decision is charged what it took, and a tenant whose bucket
is empty gets 429 ``rate_limited`` at once, before any matching. Per process, in
memory: a share of this process's CPU is what is protected.

All tenants together have one more bucket of the same size: six tenants within their
own shares still held a seventh's calls for up to 2 s (a break test). Once it is spent,
only a tenant that has matched nothing lately (its own bucket full) is served; the
tenants spending are refused, the quiet one is not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from reach_core.errors import ReachError

ALL = -1  # every tenant's matching together (tenant pks are positive)


class IntentCpu:
    def __init__(self, *, ms_per_s: float, burst_ms: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ms_per_s = ms_per_s
        self.burst_ms = burst_ms
        self._clock = clock
        # tenant (ALL: every tenant together) -> (ms left, at)
        self._buckets: dict[int, tuple[float, float]] = {}

    def _left(self, tenant_pk: int, now: float) -> float:
        left, at = self._buckets.get(tenant_pk, (self.burst_ms, now))
        return min(self.burst_ms, left + (now - at) * self.ms_per_s)

    def check(self, tenant_pk: int) -> None:
        """429 when the tenant's matching time is spent, or every tenant's together and
        this one has matched lately (0 ``ms_per_s``: no limit)."""
        if self.ms_per_s <= 0:
            return
        now = self._clock()
        left = self._left(tenant_pk, now)
        if left < self.burst_ms:
            left = min(left, self._left(ALL, now))
        if left <= 0:
            raise ReachError(
                "rate_limited", "Intent matching has used its share of this gateway's "
                "CPU; retry shortly, or name a capability.",
                retry_after=max(1, math.ceil(-left / self.ms_per_s)))

    def charge(self, tenant_pk: int, ms: float) -> None:
        if self.ms_per_s <= 0:
            return
        now = self._clock()
        for bucket in (tenant_pk, ALL):
            self._buckets[bucket] = (self._left(bucket, now) - ms, now)
