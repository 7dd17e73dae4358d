"""Monthly budgets that cannot be overshot: reserve a call's ceiling, then settle.

Before a call is forwarded its *ceiling* (one request; its tokens: the input's
estimate plus the output ceiling it asked for with ``max_tokens``; its cost at
the agent's prices) is reserved against every scope a budget applies to (the
tenant, the tenant × agent, the tenant × capability), all or nothing, in one
atomic step. A call is admitted only while ``used + reserved + ceiling ≤ budget``
holds for every budget, so however many calls and gateway processes run at once
the admitted total stays within the budget. After the call the reservation is
*settled*: removed, and the call's actual usage added (nothing for a call that
failed without the agent reporting usage).

Reservations are leases. One that is not settled in time (its gateway crashed)
expires, and its call counts as one request used: the agent may well have run it (a
break test: budgets of 20 requests ran 40 calls across a ``kill -9``, each lapsed
reservation handed back). Its tokens and cost, ceilings that were never known, are
released. A settlement arriving after the lapse adds the tokens and cost it reports,
not the request again. The lease is the call's deadline plus a margin.

The bound, stated in the README: none for requests and per-call prices; tokens
and token-priced cost overshoot only when an agent returns more output than the
ceiling it was given (or when the caller gave none: then only the input is
reserved, and calls in flight may exceed the budget by their output).

``RedisBudgets`` shares the counters of every gateway process; ``MemoryBudgets``
has the same semantics in one process (the embedded mode). Counters are per
calendar month (UTC) and scope, in the same hash the batched usage counters of
``gateway.governance`` write, so a budget added mid-month sees the month so far.
"""

from __future__ import annotations

import heapq
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from reach_core.budgets import usage_key

COST_SCALE = 1_000_000  # costs are counted in millionths, as integers
NO_LIMIT = -1
FIELDS = ("requests", "tokens", "cost")


_current_month: tuple[float, str] = (float("-inf"), "")  # (minute start, "YYYY-MM")


def month_key(now: float | None = None) -> str:
    """``"YYYY-MM"`` (UTC) of ``now`` (default: the current time). The answer for the
    current minute is kept: every call asks, and it changes twelve times a year (the
    month turns at a minute boundary)."""
    global _current_month
    at = time.time() if now is None else now
    start, key = _current_month
    if not start <= at < start + 60:
        key = time.strftime("%Y-%m", time.gmtime(at))
        _current_month = (at - at % 60, key)
    return key


@dataclass(frozen=True)
class Amount:
    requests: int = 0
    tokens: int = 0
    cost: int = 0  # millionths

    @classmethod
    def of(cls, *, requests: int, tokens: int, cost: float) -> Amount:
        return cls(requests, tokens, round(cost * COST_SCALE))

    def values(self) -> tuple[int, int, int]:
        return self.requests, self.tokens, self.cost


@dataclass(frozen=True)
class ScopeLimit:
    """The budgets of one scope (``NO_LIMIT`` where none applies), in ``Amount`` units."""

    scope: str
    requests: int = NO_LIMIT
    tokens: int = NO_LIMIT
    cost: int = NO_LIMIT

    def values(self) -> tuple[int, int, int]:
        return self.requests, self.tokens, self.cost


@dataclass
class Reservation:
    id: str
    scopes: tuple[str, ...]
    month: str
    amount: Amount


@dataclass(frozen=True)
class Refusal:
    scope: str
    metric: str  # requests | tokens | cost
    limit: int


_ids = itertools.count(1)
_PROCESS = os.urandom(6).hex()


def new_reservation_id() -> str:
    return f"{_PROCESS}-{next(_ids)}"


# KEYS: per scope three keys: the usage hash, the leases zset, the lease amounts hash.
# ARGV: now_ms, expires_ms, id, ask requests, tokens, cost, then per scope three limits
# (-1: none), then ttl_ms of the keys. Returns {1} when reserved, else {0, scope index,
# field index}. Expired leases of every scope are dropped first, so a crashed gateway's
# reservations stop counting once their lease lapses.
# Shared by both scripts: drop lease ``rid`` of one scope (usage hash h, leases zset z,
# lease amounts a), giving its reserved amounts back.
# A lapsed lease (``lapsed`` true) charges its requests as used and leaves the marker
# "lapsed" under its id, so its late settlement does not count the request again.
_DROP = """
local names = {'requests', 'tokens', 'cost'}
local function drop(h, z, a, rid, lapsed)
  local amount = redis.call('HGET', a, rid)
  if amount and amount ~= 'lapsed' then
    local i = 1
    for v in string.gmatch(amount, '[^,]+') do
      -- 0 - v, not -v: Lua writes -0 as '-0', which HINCRBY refuses
      redis.call('HINCRBY', h, 'reserved_' .. names[i], 0 - tonumber(v))
      if lapsed and i == 1 and tonumber(v) ~= 0 then
        redis.call('HINCRBY', h, 'requests', tonumber(v))
      end
      i = i + 1
    end
  end
  if lapsed and amount then
    redis.call('HSET', a, rid, 'lapsed')
  else
    redis.call('HDEL', a, rid)
  end
  redis.call('ZREM', z, rid)
  return amount
end
"""

_RESERVE = _DROP + """
local now, exp, id = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local ask = {tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])}
local ttl = ARGV[#ARGV]
local n = #KEYS / 3
for s = 0, n - 1 do
  local h, z, a = KEYS[3 * s + 1], KEYS[3 * s + 2], KEYS[3 * s + 3]
  for _, rid in ipairs(redis.call('ZRANGEBYSCORE', z, '-inf', now)) do
    drop(h, z, a, rid, true)
  end
end
for s = 0, n - 1 do
  local v = redis.call('HMGET', KEYS[3 * s + 1], 'requests', 'tokens', 'cost',
                       'reserved_requests', 'reserved_tokens', 'reserved_cost')
  for f = 1, 3 do
    local limit = tonumber(ARGV[6 + 3 * s + f])
    if limit >= 0 and ask[f] > 0 and
       (tonumber(v[f]) or 0) + (tonumber(v[f + 3]) or 0) + ask[f] > limit then
      return {0, s + 1, f}
    end
  end
end
local amount = ARGV[4] .. ',' .. ARGV[5] .. ',' .. ARGV[6]
for s = 0, n - 1 do
  local h, z, a = KEYS[3 * s + 1], KEYS[3 * s + 2], KEYS[3 * s + 3]
  for f = 1, 3 do
    redis.call('HINCRBY', h, 'reserved_' .. names[f], ask[f])
  end
  redis.call('ZADD', z, exp, id)
  redis.call('HSET', a, id, amount)
  for _, k in ipairs({h, z, a}) do redis.call('PEXPIRE', k, ttl) end
end
return {1}
"""

# KEYS: as for reserve. ARGV: id, actual requests, tokens, cost, ttl_ms. Drops the lease
# if it is still held (it may have lapsed) and adds the actual usage.
_SETTLE = _DROP + """
local id = ARGV[1]
local actual = {tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])}
for s = 0, #KEYS / 3 - 1 do
  local h, z, a = KEYS[3 * s + 1], KEYS[3 * s + 2], KEYS[3 * s + 3]
  local first = 1
  if drop(h, z, a, id, false) == 'lapsed' then first = 2 end  -- its request is counted
  for f = first, 3 do
    if actual[f] ~= 0 then redis.call('HINCRBY', h, names[f], actual[f]) end
  end
  redis.call('PEXPIRE', h, ARGV[5])
end
return 1
"""

KEY_TTL_MS = 40 * 86400 * 1000


class RedisBudgets:
    """Budget counters and reservations in Redis, shared by every gateway process.

    ``reserve`` and ``settle`` raise on Redis trouble (``redis.RedisError``, ``OSError``);
    the governor decides what that means (see ``gateway.governance``)."""

    def __init__(self, client, prefix: str,
                 clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._prefix = prefix
        self._clock = clock
        self._reserve = client.register_script(_RESERVE)
        self._settle = client.register_script(_SETTLE)

    def usage_key(self, month: str, scope: str) -> str:
        return usage_key(self._prefix, month, scope)

    def _keys(self, month: str, scopes: Sequence[str]) -> list[str]:
        keys = []
        for scope in scopes:
            base = self.usage_key(month, scope)
            keys += [base, base + ":leases", base + ":lease-amounts"]
        return keys

    async def reserve(self, limits: Sequence[ScopeLimit], ask: Amount,
                      lease_s: float) -> Reservation | Refusal:
        now = self._clock()
        month = month_key(now)
        reservation = Reservation(new_reservation_id(), tuple(lim.scope for lim in limits),
                                  month, ask)
        args = [int(now * 1000), int((now + lease_s) * 1000), reservation.id, *ask.values()]
        for limit in limits:
            args += limit.values()
        result = await self._reserve(keys=self._keys(month, reservation.scopes),
                                     args=[*args, KEY_TTL_MS])
        if int(result[0]) == 1:
            return reservation
        limit = limits[int(result[1]) - 1]
        metric = FIELDS[int(result[2]) - 1]
        return Refusal(limit.scope, metric, getattr(limit, metric))

    async def settle(self, reservation: Reservation, actual: Amount) -> None:
        await self._settle(keys=self._keys(reservation.month, reservation.scopes),
                           args=[reservation.id, *actual.values(), KEY_TTL_MS])

    async def add_many(self, amounts: dict[tuple[str, str], Amount]) -> None:
        """Usage outside any reservation, by (month, scope): one pipelined round trip."""
        pipe = self._client.pipeline(transaction=False)
        for (month, scope), amount in amounts.items():
            key = self.usage_key(month, scope)
            for name, value in zip(FIELDS, amount.values(), strict=True):
                if value:
                    pipe.hincrby(key, name, value)
            pipe.pexpire(key, KEY_TTL_MS)
        await pipe.execute()

    async def used(self, scope: str, month: str | None = None) -> dict[str, int]:
        raw = await self._client.hgetall(self.usage_key(month or month_key(self._clock()),
                                                        scope))
        return {k.decode(): int(v) for k, v in raw.items()}


@dataclass
class _Counts:
    used: list[int] = field(default_factory=lambda: [0, 0, 0])
    reserved: list[int] = field(default_factory=lambda: [0, 0, 0])
    leases: dict[str, tuple[float, Amount]] = field(default_factory=dict)
    lapsed: set[str] = field(default_factory=set)  # charged a request; settled later
    # (expires, id) of the leases, soonest first; settled ones stay until they surface
    # or the heap is rebuilt. Scanning every lease on every call made a reservation
    # cost grow with the calls in flight (70 us each at 1,000).
    expiry: list[tuple[float, str]] = field(default_factory=list)

    def lapse(self, now: float) -> None:
        """Drop the leases that expired by ``now`` (their calls never settled)."""
        expiry = self.expiry
        while expiry and expiry[0][0] <= now:
            _, rid = heapq.heappop(expiry)
            held = self.leases.get(rid)
            if held is not None and held[0] <= now:
                del self.leases[rid]
                self.reserved = [r - a for r, a in zip(self.reserved, held[1].values(),
                                                       strict=True)]
                self.used[0] += held[1].requests  # the call may have run: it counts
                self.lapsed.add(rid)

    def hold(self, rid: str, expires: float, amount: Amount) -> None:
        self.leases[rid] = (expires, amount)
        if len(self.expiry) > 2 * len(self.leases) + 64:  # mostly settled: rebuild
            self.expiry = [(at, lease) for lease, (at, _) in self.leases.items()]
            heapq.heapify(self.expiry)
        else:
            heapq.heappush(self.expiry, (expires, rid))


class MemoryBudgets:
    """The same ledger in this process (the embedded mode). Never awaits inside a
    decision, so it is atomic within one event loop."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counts: dict[tuple[str, str], _Counts] = {}

    def counts(self, month: str, scope: str) -> _Counts:
        return self._counts.setdefault((month, scope), _Counts())

    async def reserve(self, limits: Sequence[ScopeLimit], ask: Amount,
                      lease_s: float) -> Reservation | Refusal:
        now = self._clock()
        month = month_key(now)
        rows = [self.counts(month, limit.scope) for limit in limits]
        for row in rows:
            row.lapse(now)
        wanted = ask.values()
        for limit, row in zip(limits, rows, strict=True):
            for index, cap in enumerate(limit.values()):
                if cap >= 0 and wanted[index] > 0 and \
                        row.used[index] + row.reserved[index] + wanted[index] > cap:
                    return Refusal(limit.scope, FIELDS[index], cap)
        reservation = Reservation(new_reservation_id(), tuple(lim.scope for lim in limits),
                                  month, ask)
        for row in rows:
            row.reserved = [r + a for r, a in zip(row.reserved, wanted, strict=True)]
            row.hold(reservation.id, now + lease_s, ask)
        return reservation

    async def settle(self, reservation: Reservation, actual: Amount) -> None:
        for scope in reservation.scopes:
            row = self.counts(reservation.month, scope)
            held = row.leases.pop(reservation.id, None)
            if held is not None:
                row.reserved = [r - a for r, a in zip(row.reserved, held[1].values(),
                                                      strict=True)]
            counted = actual
            if reservation.id in row.lapsed:  # its request was charged when it lapsed
                row.lapsed.discard(reservation.id)
                counted = Amount(0, actual.tokens, actual.cost)
            row.used = [u + a for u, a in zip(row.used, counted.values(), strict=True)]

    async def add_many(self, amounts: dict[tuple[str, str], Amount]) -> None:
        """Usage outside any reservation, by (month, scope)."""
        for (month, scope), amount in amounts.items():
            row = self.counts(month, scope)
            row.used = [u + a for u, a in zip(row.used, amount.values(), strict=True)]

    async def used(self, scope: str, month: str | None = None) -> dict[str, int]:
        row = self.counts(month or month_key(self._clock()), scope)
        return {**dict(zip(FIELDS, row.used, strict=True)),
                **{f"reserved_{n}": v for n, v in zip(FIELDS, row.reserved, strict=True)}}
