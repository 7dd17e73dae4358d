"""Who may call how much: rate limits and monthly budgets, checked after routing.

Rate limits (token buckets, ``gateway.limits``) come from three places:
- the tenant's ``Quota`` rows: tenant-wide, or narrowed to an agent or a capability
  (``requests_per_minute``, ``burst``);
- the capability's declared ``qps`` / ``burst``, which protects the agent from all
  tenants together.
All buckets of a call are decided atomically. Over the limit: 429 ``rate_limited``
with ``Retry-After``.

Budgets: a ``Quota``'s ``monthly_requests`` / ``monthly_tokens`` / ``monthly_cost``
against this month's usage, counted by the gateways themselves (Redis hash per
tenant and month, or in process). Over budget: 429 ``quota_exceeded``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

from gateway.limits import Limit
from reach_core.errors import ReachError
from routing.router import Candidate
from routing.table import QuotaEntry, RouteTable

COST_SCALE = 1_000_000  # costs are counted in millionths, as integers


def month_key(now: float | None = None) -> str:
    return time.strftime("%Y-%m", time.gmtime(now or time.time()))


def limits_for(table: RouteTable, tenant_pk: int, candidate: Candidate) -> list[Limit]:
    out = []
    for quota in table.quotas_by_tenant.get(tenant_pk, ()):
        if quota.requests_per_minute and _applies(quota, candidate):
            rate = quota.requests_per_minute / 60
            out.append(Limit(key=_quota_key(quota), rate_per_s=rate,
                             burst=quota.burst or max(1, math.ceil(rate))))
    capability = candidate.capability
    if capability.qps:
        out.append(Limit(key=f"capability:{capability.pk}", rate_per_s=float(capability.qps),
                         burst=capability.burst or capability.qps))
    return out


def _applies(quota: QuotaEntry, candidate: Candidate) -> bool:
    if quota.agent_pk is not None:
        return quota.agent_pk == candidate.agent.pk
    if quota.capability_pk is not None:
        return quota.capability_pk == candidate.capability.pk
    return True


def _quota_key(quota: QuotaEntry) -> str:
    scope = (f":agent:{quota.agent_pk}" if quota.agent_pk is not None else
             f":capability:{quota.capability_pk}" if quota.capability_pk is not None else "")
    return f"tenant:{quota.tenant_pk}{scope}"


def budgets_for(table: RouteTable, tenant_pk: int, candidate: Candidate) -> list[QuotaEntry]:
    return [q for q in table.quotas_by_tenant.get(tenant_pk, ())
            if (q.monthly_requests or q.monthly_tokens or q.monthly_cost)
            and _applies(q, candidate)]


def usage_scopes(tenant_pk: int, candidate: Candidate) -> list[str]:
    """The counters a call adds to: the tenant's, and the tenant x agent's."""
    return [f"{tenant_pk}", f"{tenant_pk}:agent:{candidate.agent.pk}"]


def quota_scope(quota: QuotaEntry) -> str:
    if quota.agent_pk is not None:
        return f"{quota.tenant_pk}:agent:{quota.agent_pk}"
    return f"{quota.tenant_pk}"


def over_budget(quota: QuotaEntry, used: dict) -> str | None:
    if quota.monthly_requests and used.get("requests", 0) >= quota.monthly_requests:
        return f"monthly request budget of {quota.monthly_requests} is used up"
    if quota.monthly_tokens and used.get("tokens", 0) >= quota.monthly_tokens:
        return f"monthly token budget of {quota.monthly_tokens} is used up"
    if quota.monthly_cost and used.get("cost", 0) >= quota.monthly_cost * COST_SCALE:
        return f"monthly cost budget of {quota.monthly_cost} is used up"
    return None


class MemoryUsageCounters:
    """This month's usage per scope, in this process (the embedded mode)."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    async def add(self, scopes: list[str], *, requests: int, tokens: int, cost: float) -> None:
        month = month_key()
        for scope in scopes:
            counts = self._counts[f"{month}:{scope}"]
            counts["requests"] += requests
            counts["tokens"] += tokens
            counts["cost"] += round(cost * COST_SCALE)

    async def get(self, scope: str) -> dict:
        return dict(self._counts.get(f"{month_key()}:{scope}", {}))


class RedisUsageCounters:
    """This month's usage per scope in Redis hashes, shared by every gateway process."""

    def __init__(self, client, prefix: str) -> None:
        self._client = client
        self._prefix = prefix

    def _key(self, scope: str) -> str:
        return f"{self._prefix}usage-month:{month_key()}:{scope}"

    async def add(self, scopes: list[str], *, requests: int, tokens: int, cost: float) -> None:
        pipe = self._client.pipeline(transaction=False)
        for scope in scopes:
            key = self._key(scope)
            pipe.hincrby(key, "requests", requests)
            pipe.hincrby(key, "tokens", tokens)
            pipe.hincrby(key, "cost", round(cost * COST_SCALE))
            pipe.expire(key, 40 * 86400)
        await pipe.execute()

    async def get(self, scope: str) -> dict:
        raw = await self._client.hgetall(self._key(scope))
        return {k.decode(): int(v) for k, v in raw.items()}


class Governor:
    """Admits calls (limits, budgets) and counts what they used.

    Budget counters are read at most once a second per scope and written in
    batches every 100 ms: a monthly budget may be overshot by a second's worth
    of calls, and the per-call cost stays one Redis round trip (the rate limit).
    """

    READ_EVERY_S = 1.0
    FLUSH_EVERY_S = 0.1

    def __init__(self, *, limiter, counters, on_degraded=None) -> None:
        self.limiter = limiter
        self.counters = counters
        self._on_degraded = on_degraded
        self._seen: dict[str, tuple[float, dict]] = {}
        self._unflushed: dict[str, list[int | float]] = {}
        # What applies to (tenant, agent, capability), per quota set of the table:
        # the same few answers for every call, so computed once.
        self._rules_for: object = None
        self._rules: dict[tuple[int, int, int], tuple] = {}

    def _applicable(self, table: RouteTable, tenant_pk: int, candidate: Candidate):
        if self._rules_for is not table.quotas_by_tenant:
            self._rules, self._rules_for = {}, table.quotas_by_tenant
        key = (tenant_pk, candidate.agent.pk, candidate.capability.pk)
        rules = self._rules.get(key)
        if rules is None or rules[2] is not candidate.capability:
            rules = (budgets_for(table, tenant_pk, candidate),
                     limits_for(table, tenant_pk, candidate), candidate.capability)
            if len(self._rules) > 100_000:
                self._rules.clear()
            self._rules[key] = rules
        return rules[0], rules[1]

    async def _used(self, scope: str) -> dict:
        now = time.monotonic()
        cached = self._seen.get(scope)
        if cached and now - cached[0] < self.READ_EVERY_S:
            used = dict(cached[1])
        else:
            used = await self.counters.get(scope)
            self._seen[scope] = (now, used)
            used = dict(used)
        pending = self._unflushed.get(scope)
        if pending:  # this process's calls not yet written
            used["requests"] = used.get("requests", 0) + pending[0]
            used["tokens"] = used.get("tokens", 0) + pending[1]
            used["cost"] = used.get("cost", 0) + round(pending[2] * COST_SCALE)
        return used

    async def admit(self, table: RouteTable, tenant_pk: int, candidate: Candidate) -> None:
        """Raise ``rate_limited`` or ``quota_exceeded``, or return to let the call go."""
        budgets, limits = self._applicable(table, tenant_pk, candidate)
        for quota in budgets:
            try:
                used = await self._used(quota_scope(quota))
            except Exception:  # counters unreachable: budgets are not worth an outage
                if self._on_degraded:
                    self._on_degraded()
                continue
            reason = over_budget(quota, used)
            if reason:
                raise ReachError("quota_exceeded", f"The tenant's {reason}.")
        if not limits:
            return
        verdict = await self.limiter.check(limits)
        if not verdict.allowed:
            raise ReachError(
                "rate_limited", f"Rate limit {verdict.limit_key or ''} reached; retry after "
                f"{verdict.retry_after_s:g} s.".replace("  ", " "),
                retry_after=max(1, math.ceil(verdict.retry_after_s)))

    def record(self, tenant_pk: int, candidate: Candidate, *, tokens: int,
               cost: float) -> None:
        """Count one call; written by ``flush_forever``. Never blocks, never raises."""
        for scope in usage_scopes(tenant_pk, candidate):
            pending = self._unflushed.setdefault(scope, [0, 0, 0.0])
            pending[0] += 1
            pending[1] += tokens
            pending[2] += cost

    async def flush(self) -> None:
        batch, self._unflushed = self._unflushed, {}
        for scope, (requests, tokens, cost) in batch.items():
            try:
                await self.counters.add([scope], requests=requests, tokens=tokens, cost=cost)
            except Exception:
                if self._on_degraded:
                    self._on_degraded()
                # Keep them for the next flush rather than under-count a budget.
                again = self._unflushed.setdefault(scope, [0, 0, 0.0])
                again[0] += requests
                again[1] += tokens
                again[2] += cost

    async def flush_forever(self) -> None:
        import asyncio

        while True:
            await asyncio.sleep(self.FLUSH_EVERY_S)
            if self._unflushed:
                await self.flush()
