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
the tenants spending are refused and a light tenant is still served, from one more
bucket, a quarter of the size: at most 1.25 shares in all, whatever the number of
tenants. Light is judged by what a tenant's matching has cost lately (a moving average
over ``SPEND_TAU_S``, which a refusal does not lower at once), against a bar that falls
as that last bucket empties, so the lightest keep their way in; and the bucket must hold
one of the tenant's decisions at what they have cost. The bar is at least the even split
of what all matching may take among the tenants matching lately: a tenant spending less
than its even part is not the one crowding the others out. Three designs before this
one failed re-tests: "its own bucket full" (tenants refused long enough had full buckets
again: twelve took 1 s of CPU per second), then "asked nothing for 2 s" (a tenant
sending two short intents a second was refused behind one heavy tenant), then a fixed
bar of 5 % of a share (helper-49: a tenant sending 13 short intents a second, an eighth
of its share, had 6-18 % refused while one other tenant flooded).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from reach_core.errors import ReachError

ALL = -1  # every tenant's matching together (tenant pks are positive)
LIGHT = -2  # what light tenants match once ALL is spent
# The light tenants' bucket, as a share of the others'.
LIGHT_SHARE = 0.25
# Light: a tenant whose matching cost less than this share of ``ms_per_s`` lately (over
# about ``SPEND_TAU_S``), when the light bucket is full; the bar falls as it empties.
LIGHT_SPEND = 0.05
SPEND_TAU_S = 10.0
# Matching lately: a tenant spending at least this (ms per s) counts in the even split;
# below a hundredth of it, a tenant is forgotten (its spend and its decisions' cost).
ACTIVE_SPEND = 1.0
# How often the tenants matching lately are counted (and the forgotten dropped).
COUNT_EVERY_S = 0.25
# What one decision of a tenant costs: its dearest lately, fading by this per decision.
# A tenant's decisions come in the light way only while the light bucket holds one of
# them (a heavy tenant's long intent, let in once its average spend had faded, took the
# light bucket from the light tenants for seconds).
COST_MEMORY = 0.9
# Threads that match. Two: a light tenant's short match runs beside a heavy one instead
# of waiting for it (bench/intent_offloop.py: another tenant's dry-run p50 under a flood,
# 11.95 ms with one thread, 3.12 ms with two). The CPU all matching may take is the
# shares' (at most 1.25 of them), whatever the number of threads.
THREADS = 2


class IntentCpu:
    def __init__(self, *, ms_per_s: float, burst_ms: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ms_per_s = ms_per_s
        self.burst_ms = burst_ms
        self._clock = clock
        # tenant (ALL: every tenant together; LIGHT: the light ones' way in) ->
        # (ms left, at)
        self._buckets: dict[int, tuple[float, float]] = {}
        self._spend: dict[int, tuple[float, float]] = {}  # tenant -> (ms per s, at)
        self._cost: dict[int, float] = {}  # tenant -> what one of its decisions costs
        self._active, self._counted_at = 1, -math.inf

    def _matching(self, now: float) -> int:
        """How many tenants matched lately (at least 1), counted every
        ``COUNT_EVERY_S``; the long quiet are forgotten then."""
        if now - self._counted_at >= COUNT_EVERY_S:
            spends = {t: self._spending(t, now) for t in self._spend}
            for t, spend in spends.items():
                if spend < ACTIVE_SPEND / 100:
                    del self._spend[t]
                    self._cost.pop(t, None)
            self._active = max(1, sum(spend >= ACTIVE_SPEND for spend in spends.values()))
            self._counted_at = now
        return self._active

    def _left(self, bucket: int, now: float) -> float:
        share = LIGHT_SHARE if bucket == LIGHT else 1.0
        left, at = self._buckets.get(bucket, (self.burst_ms * share, now))
        return min(self.burst_ms * share, left + (now - at) * self.ms_per_s * share)

    def _spending(self, tenant_pk: int, now: float) -> float:
        rate, at = self._spend.get(tenant_pk, (0.0, now))
        return rate * math.exp(-(now - at) / SPEND_TAU_S)

    def check(self, tenant_pk: int) -> tuple[int, ...]:
        """The buckets to charge the decision to (``charge``); 429 when the tenant's
        matching time is spent, or every tenant's together and it is not light, or every
        light tenant's too (0 ``ms_per_s``: no limit)."""
        if self.ms_per_s <= 0:
            return ()
        now = self._clock()
        left = self._left(tenant_pk, now)
        buckets = (tenant_pk, ALL)
        if left > 0:
            left = self._left(ALL, now)
            if left <= 0:
                light_left = self._left(LIGHT, now)
                even = (1 + LIGHT_SHARE) * self.ms_per_s / self._matching(now)
                bar = max(LIGHT_SPEND * self.ms_per_s, even) * light_left / (
                    self.burst_ms * LIGHT_SHARE)
                if self._spending(tenant_pk, now) < bar and \
                        self._cost.get(tenant_pk, 0.0) <= light_left:
                    left, buckets = light_left, (tenant_pk, ALL, LIGHT)
        if left <= 0:
            raise ReachError(
                "rate_limited", "Intent matching has used its share of this gateway's "
                "CPU; retry shortly, or name a capability.",
                retry_after=max(1, math.ceil(-left / self.ms_per_s)))
        return buckets

    def charge(self, buckets: tuple[int, ...], ms: float) -> None:
        if not buckets:
            return
        now = self._clock()
        for bucket in buckets:
            self._buckets[bucket] = (self._left(bucket, now) - ms, now)
        tenant_pk = buckets[0]
        self._spend[tenant_pk] = (self._spending(tenant_pk, now) + ms / SPEND_TAU_S, now)
        self._cost[tenant_pk] = max(ms, COST_MEMORY * self._cost.get(tenant_pk, 0.0))


class OffLoopMatching:
    """Intent matching in threads of its own, charged to its tenant's share.

    On the event loop a match held every other call for as long as it ran (a 2,000-
    character intent about 100 ms; a break test saw another tenant's dry-run p50 go from
    5 to 74–91 ms under a flood within the shares). In a thread the loop gets the
    interpreter back every switch interval (5 ms), and the encoder's matrix products
    release it altogether. ``THREADS`` threads, so that one tenant's long match does not
    hold another's short one.

    A tenant has one match in the threads at a time, and its next is checked against its
    share only once that one is charged: else a burst of intents would all pass the
    check before the first was paid for and queue seconds of matching ahead of other
    tenants. A caller who hangs up does not give the turn back early: the match it
    started runs on (a thread cannot be stopped) and the turn is the tenant's until it
    ends, so hanging up cannot queue unpaid matches either. Charged in the thread's own
    CPU time, not the wall time spent waiting for the interpreter.
    """

    def __init__(self, cpu: IntentCpu) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.cpu = cpu
        self._thread = ThreadPoolExecutor(THREADS, thread_name_prefix="intent-match")
        self._turns: dict[int, asyncio.Future] = {}  # tenant -> its match in the thread

    async def run(self, tenant_pk: int, match: Callable[[], object]):
        """``match()`` in the thread once the tenant's previous match is done; raises 429
        ``rate_limited`` (``IntentCpu.check``) before anything runs."""
        while (turn := self._turns.get(tenant_pk)) is not None:
            await asyncio.wait([turn])
        buckets = self.cpu.check(tenant_pk)
        spent_ms = [0.0]

        def timed():
            started = time.thread_time()
            try:
                return match()
            finally:
                spent_ms[0] = (time.thread_time() - started) * 1000

        running = asyncio.get_running_loop().run_in_executor(self._thread, timed)
        self._turns[tenant_pk] = running

        def done(_) -> None:
            if self._turns.get(tenant_pk) is running:
                del self._turns[tenant_pk]
            self.cpu.charge(buckets, spent_ms[0])

        running.add_done_callback(done)
        return await asyncio.shield(running)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
