"""Token-bucket rate limiting for the gateway: shared through Redis, or in-process.

A check names several limits (tenant, tenant+agent, capability, ...) and is decided all or
nothing: if any bucket lacks ``cost`` tokens none is debited and the verdict names the first
refusing limit with its retry-after; otherwise every bucket is debited.

``RedisLimiter`` decides a whole check in one Lua script call, on Redis's own clock, so every
gateway process shares one timeline whatever its local clock says (a test may inject a clock
instead). It never raises on Redis trouble: it reports a degraded verdict per its
fail-open/closed policy instead.
``InProcessLimiter`` has the same semantics in memory for a single-process deployment.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    import redis.asyncio

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limit:
    """One token bucket: ``burst`` tokens of capacity, refilled at ``rate_per_s``."""

    key: str  # e.g. "tenant:7", "tenant:7:agent:3", "capability:12" (caller builds it)
    rate_per_s: float  # > 0
    burst: int  # >= 1

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0 or self.burst < 1:
            raise ValueError(f"limit {self.key!r}: need rate_per_s > 0 and burst >= 1")


@dataclass(frozen=True)
class Verdict:
    """Outcome of a check; ``retry_after_s`` is 0 when allowed, else ceiled to 1 ms."""

    allowed: bool
    retry_after_s: float
    limit_key: str | None  # the first limit that refused, else None
    degraded: bool = False  # True when Redis was unreachable and the policy decided


ALLOWED = Verdict(allowed=True, retry_after_s=0.0, limit_key=None)


def _ceil_ms(seconds: float) -> float:
    # Ceiled so a client waiting exactly this long finds enough tokens; the epsilon keeps
    # float noise (0.020000000000000004) from adding a whole millisecond.
    return max(0.001, math.ceil(seconds * 1000 - 1e-9) / 1000)


def _check_cost(limits: Sequence[Limit], cost: int) -> None:
    # A cost above a burst could never be granted: that is a caller bug, not a refusal.
    if cost < 1 or any(cost > lim.burst for lim in limits):
        raise ValueError("cost must be >= 1 and <= the burst of every limit")


@dataclass(slots=True)
class _Bucket:
    tokens: float
    ts: float
    refill_s: float  # burst / rate: idle this long means full again


class InProcessLimiter:
    """In-memory token buckets for one process, safe within one event loop.

    ``check`` never awaits, so a whole check runs without interleaving other coroutines (it is
    not thread-safe). Memory is bounded: once more than ``MAX_BUCKETS`` buckets are tracked,
    buckets idle for longer than their refill time (hence full, so dropping them changes no
    verdict) are swept; sweeps are spaced so their cost stays amortised O(1) per check.
    """

    MAX_BUCKETS = 100_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._sweep_above = self.MAX_BUCKETS

    def __len__(self) -> int:
        """Number of buckets currently tracked."""
        return len(self._buckets)

    async def check(self, limits: Sequence[Limit], cost: int = 1) -> Verdict:
        """Debit ``cost`` from every limit's bucket, or from none if any lacks it.

        Raises ``ValueError`` if ``cost`` < 1 or exceeds a limit's burst.
        """
        if not limits:
            return ALLOWED
        _check_cost(limits, cost)
        now = self._clock()
        # Tentative balances by key, so a key listed twice is debited twice, like in Lua.
        pending: dict[str, float] = {}
        for lim in limits:
            tokens = pending.get(lim.key)
            if tokens is None:
                b = self._buckets.get(lim.key)
                tokens = float(lim.burst) if b is None else min(
                    lim.burst, b.tokens + max(0.0, now - b.ts) * lim.rate_per_s)
            if tokens < cost:
                return Verdict(False, _ceil_ms((cost - tokens) / lim.rate_per_s), lim.key)
            pending[lim.key] = tokens - cost
        refill = {lim.key: lim.burst / lim.rate_per_s for lim in limits}
        for key, tokens in pending.items():
            self._buckets[key] = _Bucket(tokens, now, refill[key])
        if len(self._buckets) > self._sweep_above:
            self._sweep(now)
        return ALLOWED

    def _sweep(self, now: float) -> None:
        self._buckets = {k: b for k, b in self._buckets.items() if now - b.ts <= b.refill_s}
        # If most buckets are busy, sweeping again on the next insert would be O(n) per check.
        self._sweep_above = max(self.MAX_BUCKETS, 2 * len(self._buckets))


# KEYS: bucket keys. ARGV: cost, then rate and burst per key (as strings: floats survive),
# then optionally the time in integer microseconds; absent, the script reads Redis's TIME.
# Returns {1, 0, "0"} when all were debited, else {0, index of first refusal, retry-after}.
_LUA = """
local now_us = tonumber(ARGV[2 * #KEYS + 2])
if now_us == nil then
  local t = redis.call('TIME')
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[1])
local pending, order = {}, {}
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  local tokens = pending[key]
  if tokens == nil then
    local h = redis.call('HMGET', key, 'tokens', 'ts')
    local prev, ts = tonumber(h[1]), tonumber(h[2])
    if prev == nil or ts == nil then
      tokens = burst
    else
      tokens = math.min(burst, prev + math.max(0, now_us - ts) / 1000000 * rate)
    end
    order[#order + 1] = {key, math.max(1000, math.ceil(burst / rate) * 2000)}
  end
  if tokens < cost then
    return {0, i, tostring((cost - tokens) / rate)}
  end
  pending[key] = tokens - cost
end
for _, kt in ipairs(order) do
  -- Explicit formats: Redis would stringify Lua numbers with %.14g and lose precision.
  redis.call('HSET', kt[1], 'tokens', string.format('%.17g', pending[kt[1]]),
             'ts', string.format('%d', now_us))
  redis.call('PEXPIRE', kt[1], string.format('%d', kt[2]))
end
return {1, 0, '0'}
"""


class RedisLimiter:
    """Token buckets shared by every gateway process through Redis.

    Each bucket is a hash ``{tokens, ts}`` under ``prefix + "rl:" + key`` that expires after
    about twice its refill time when idle. One check is one EVALSHA, so it is atomic across
    processes. (On Redis Cluster all keys of one check would need a common hash tag.)

    ``check`` never raises on Redis trouble: on ``redis.RedisError``, ``OSError`` or a timeout
    it calls ``on_degraded`` (if given) and returns ``Verdict(fail_open, 0 or 1.0, None,
    degraded=True)``. Bound its latency with the client's socket (connect) timeouts and retry
    policy.

    Refill runs on Redis's ``TIME`` unless ``clock`` (seconds, any origin) is given: then
    each check passes ``clock()`` to the script instead, so tests can stop and step time.
    Every limiter sharing a bucket must then read the same clock, and a clock going back
    adds no tokens. Idle buckets still expire on Redis's own clock, after about twice their
    refill time.
    """

    def __init__(self, client: redis.asyncio.Redis, *, prefix: str, fail_open: bool = True,
                 on_degraded: Callable[[], None] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self._script = client.register_script(_LUA)
        self._prefix = prefix + "rl:"
        self._fail_open = fail_open
        self._on_degraded = on_degraded
        self._clock = clock

    async def check(self, limits: Sequence[Limit], cost: int = 1) -> Verdict:
        """Debit ``cost`` from every limit's bucket, or from none if any lacks it.

        Raises ``ValueError`` only if ``cost`` < 1 or exceeds a limit's burst.
        """
        if not limits:
            return ALLOWED
        _check_cost(limits, cost)
        args: list[str] = [str(cost)]
        for lim in limits:
            args += [repr(float(lim.rate_per_s)), str(lim.burst)]
        if self._clock is not None:
            # Integer microseconds, the unit the script keeps ``ts`` in.
            args.append(str(round(self._clock() * 1_000_000)))
        try:
            ok, index, retry = await self._script(
                keys=[self._prefix + lim.key for lim in limits], args=args)
        except (redis.RedisError, OSError, RuntimeError):
            # TimeoutError is an OSError; a connection dropped under redis-py can also
            # surface as asyncio's RuntimeError ("the handler is closed"). Either way
            # Redis could not decide: the policy does, never a 500.
            return self._degraded()
        if ok:
            return ALLOWED
        lim = limits[int(index) - 1]
        return Verdict(False, _ceil_ms(float(retry)), lim.key)

    def _degraded(self) -> Verdict:
        if self._on_degraded is not None:
            try:
                self._on_degraded()
            except Exception:
                # A broken metrics hook must not turn a policy decision into a 500.
                log.exception("rate limiter on_degraded hook failed")
        return Verdict(allowed=self._fail_open, retry_after_s=0.0 if self._fail_open else 1.0,
                       limit_key=None, degraded=True)


class LeasingLimiter:
    """Spends shared tokens locally, taken from the shared buckets in small leases.

    A call checks the shared buckets (one Redis round trip) only when this process
    holds no lease covering all its limits. A lease is at most ``share`` of a
    bucket's burst and ``horizon_s`` of its rate (and ``max_lease`` tokens), and
    expires after ``horizon_s``: a tight limit (10/s, burst 10) leases one token at
    a time and behaves exactly like ``RedisLimiter``; a generous one costs a round
    trip per lease instead of per call. Unspent leased tokens are lost when a lease
    expires, which can only make a limit slightly stricter, never looser.
    """

    def __init__(self, inner: RedisLimiter, *, share: float = 0.1, horizon_s: float = 0.1,
                 max_lease: int = 1000, clock: Callable[[], float] = time.monotonic) -> None:
        self._inner = inner
        # The shared buckets themselves, for limits too low to lease (a tool's quota).
        self.exact = inner
        self._share = share
        self._horizon = horizon_s
        self._max_lease = max_lease
        self._clock = clock
        self._leases: dict[str, tuple[float, float]] = {}  # key -> (tokens, expires_at)

    def _lease_size(self, limit: Limit) -> int:
        return max(1, min(self._max_lease, int(limit.burst * self._share),
                          int(limit.rate_per_s * self._horizon)))

    async def check(self, limits: Sequence[Limit], cost: int = 1) -> Verdict:
        if not limits:
            return ALLOWED
        now = self._clock()
        held = [self._leases.get(limit.key) for limit in limits]
        if all(h is not None and h[1] > now and h[0] >= cost for h in held):
            for limit, (tokens, expires) in zip(limits, held, strict=True):
                self._leases[limit.key] = (tokens - cost, expires)
            return ALLOWED
        size = max(cost, min(self._lease_size(limit) for limit in limits))
        verdict = await self._inner.check(limits, cost=size) if size > cost else None
        if verdict is None or (not verdict.allowed and not verdict.degraded):
            size = cost  # not enough for a whole lease: ask for just this call
            verdict = await self._inner.check(limits, cost=cost)
        if verdict.allowed and not verdict.degraded:
            expires = now + self._horizon
            for limit in limits:
                self._leases[limit.key] = (size - cost, expires)
            if len(self._leases) > 100_000:
                self._leases = {k: v for k, v in self._leases.items() if v[1] > now}
        return verdict
