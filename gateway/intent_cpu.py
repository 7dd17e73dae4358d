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
the tenants asking are refused, and only a tenant that has asked for no matching in the
last ``QUIET_S`` is served, from one more bucket, a quarter of the size, for such
tenants: at most 1.25 shares in all, whatever the number of tenants. "Asked", not "matched": a
refused tenant that keeps asking stays refused (a re-test found tenants whose own
buckets had refilled while they were refused taking the quiet tenants' way in, 1 s of
CPU per second between twelve of them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from reach_core.errors import ReachError

ALL = -1  # every tenant's matching together (tenant pks are positive)
QUIET = -2  # what quiet tenants match once ALL is spent
QUIET_S = 2.0  # a tenant that asked for no matching this long is quiet
# The quiet tenants' bucket, as a share of the others': a quiet tenant's few short
# intents fit, and tenants taking turns at being quiet add at most this much.
QUIET_SHARE = 0.25


class IntentCpu:
    def __init__(self, *, ms_per_s: float, burst_ms: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ms_per_s = ms_per_s
        self.burst_ms = burst_ms
        self._clock = clock
        # tenant (ALL: every tenant together; QUIET: the quiet ones' way in) ->
        # (ms left, at)
        self._buckets: dict[int, tuple[float, float]] = {}
        self._asked: dict[int, float] = {}  # tenant -> when it last asked

    def _left(self, bucket: int, now: float) -> float:
        share = QUIET_SHARE if bucket == QUIET else 1.0
        left, at = self._buckets.get(bucket, (self.burst_ms * share, now))
        return min(self.burst_ms * share, left + (now - at) * self.ms_per_s * share)

    def check(self, tenant_pk: int) -> tuple[int, ...]:
        """The buckets to charge the decision to (``charge``); 429 when the tenant's
        matching time is spent, or every tenant's together and it is not quiet, or
        every quiet tenant's too (0 ``ms_per_s``: no limit)."""
        if self.ms_per_s <= 0:
            return ()
        now = self._clock()
        quiet = now - self._asked.get(tenant_pk, -math.inf) >= QUIET_S
        self._asked[tenant_pk] = now
        left = self._left(tenant_pk, now)
        buckets = (tenant_pk, ALL)
        if left > 0:
            left = self._left(ALL, now)
            if left <= 0 and quiet:
                left, buckets = self._left(QUIET, now), (tenant_pk, ALL, QUIET)
        if left <= 0:
            raise ReachError(
                "rate_limited", "Intent matching has used its share of this gateway's "
                "CPU; retry shortly, or name a capability.",
                retry_after=max(1, math.ceil(-left / self.ms_per_s)))
        return buckets

    def charge(self, buckets: tuple[int, ...], ms: float) -> None:
        now = self._clock()
        for bucket in buckets:
            self._buckets[bucket] = (self._left(bucket, now) - ms, now)
