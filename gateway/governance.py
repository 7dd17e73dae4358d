"""Who may call how much: rate limits and monthly budgets, checked after routing.

Rate limits (token buckets, ``gateway.limits``) come from three places:
- the tenant's ``Quota`` rows: tenant-wide, or narrowed to an agent or a capability
  (``requests_per_minute``, ``burst``);
- the capability's declared ``qps`` / ``burst``, which protects the agent from all
  tenants together.
All buckets of a call are decided atomically. Over the limit: 429 ``rate_limited``
with ``Retry-After``.

With Redis unreachable a process falls back to a local bucket of the same rate
and burst (so a limit admits at most its rate × the number of processes), counted
in ``reach_limits_degraded_total``; with ``REACH_RATE_LIMIT_FAIL_OPEN=false`` it
refuses instead.

Budgets: a ``Quota``'s ``monthly_requests`` / ``monthly_tokens`` / ``monthly_cost``,
enforced by reservation (``gateway.budgets``): a call reserves its ceiling before it
is forwarded and settles to its actual usage after. Over budget: 429
``quota_exceeded``. Usage of calls no budget applies to is counted in batches.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import redis

from gateway.budgets import NO_LIMIT, Amount, Refusal, Reservation, ScopeLimit, month_key
from gateway.limits import Limit
from reach_core.budgets import budget_scope
from reach_core.errors import ReachError
from routing.router import Candidate
from routing.table import QuotaEntry, RouteTable

logger = logging.getLogger(__name__)


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


def usage_scopes(tenant_pk: int, candidate: Candidate) -> tuple[str, ...]:
    """The counters a call adds to: the tenant's, tenant x agent's, tenant x capability's."""
    return (budget_scope(tenant_pk), budget_scope(tenant_pk, agent_pk=candidate.agent.pk),
            budget_scope(tenant_pk, capability_pk=candidate.capability.pk))


def quota_scope(quota: QuotaEntry) -> str:
    return budget_scope(quota.tenant_pk, quota.agent_pk, quota.capability_pk)


def budget_limits(table: RouteTable, tenant_pk: int, candidate: Candidate) -> list[ScopeLimit]:
    """Per scope, the tightest of the budgets that apply to a call (in ``Amount`` units)."""
    caps: dict[str, list[int]] = {}
    for quota in table.quotas_by_tenant.get(tenant_pk, ()):
        if not _applies(quota, candidate):
            continue
        values = (quota.monthly_requests, quota.monthly_tokens,
                  None if quota.monthly_cost is None else round(quota.monthly_cost * 1_000_000))
        if all(v is None for v in values):
            continue
        row = caps.setdefault(quota_scope(quota), [NO_LIMIT] * 3)
        for index, value in enumerate(values):
            if value is not None:
                row[index] = value if row[index] == NO_LIMIT else min(row[index], value)
    return [ScopeLimit(scope, *row) for scope, row in sorted(caps.items())]


@dataclass
class Admission:
    """What admitting a call holds until it is settled."""

    tenant_pk: int
    candidate: Candidate
    reservation: Reservation | None  # None when no budget applies (or Redis was away)
    scopes: tuple[str, ...]  # the usage counters the call adds to


class Governor:
    """Admits calls (rate limits, then budget reservations) and settles what they used.

    ``ledger`` is a ``gateway.budgets`` ledger (Redis or in process); ``fallback`` the
    local limiter used while the shared one is unreachable (None: refuse then).
    Budgets with the ledger unreachable are not enforced (the call is admitted and
    counted in ``on_degraded``): a budget is not worth an outage. Settlements that fail
    are kept and retried by ``flush_forever``; a lapsed lease only means the settlement
    adds the usage without a reservation to drop.
    """

    FLUSH_EVERY_S = 0.1

    def __init__(self, *, limiter, ledger, fallback=None,
                 on_degraded: Callable[[], None] | None = None) -> None:
        self.limiter = limiter
        self.ledger = ledger
        self.fallback = fallback
        self._on_degraded = on_degraded
        self._unflushed: dict[tuple[str, str], list[int]] = {}
        self._unsettled: list[tuple[Reservation, Amount]] = []
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
            rules = (budget_limits(table, tenant_pk, candidate),
                     limits_for(table, tenant_pk, candidate), candidate.capability,
                     usage_scopes(tenant_pk, candidate))
            if len(self._rules) > 100_000:
                self._rules.clear()
            self._rules[key] = rules
        return rules[0], rules[1], rules[3]

    def _degraded(self) -> None:
        if self._on_degraded is not None:
            self._on_degraded()

    async def admit(self, table: RouteTable, tenant_pk: int, candidate: Candidate, *,
                    ceiling: Callable[[], Amount], lease_s: float) -> Admission:
        """Raise ``rate_limited`` or ``quota_exceeded``, or return the admission the call
        must settle (``settle``) however it ends. ``ceiling()`` is the most the call may
        use, computed only when a budget applies."""
        budgets, limits, scopes = self._applicable(table, tenant_pk, candidate)
        if limits:
            verdict = await self.limiter.check(limits)
            if verdict.degraded:
                self._degraded()
                if self.fallback is not None:
                    verdict = await self.fallback.check(limits)
            if not verdict.allowed:
                raise ReachError(
                    "rate_limited", f"Rate limit {verdict.limit_key or ''} reached; retry "
                    f"after {verdict.retry_after_s:g} s.".replace("  ", " "),
                    retry_after=max(1, math.ceil(verdict.retry_after_s)))
        if not budgets:
            return Admission(tenant_pk, candidate, None, scopes)
        try:
            held = await self.ledger.reserve(budgets, ceiling(), lease_s)
        except Exception:  # ledger unreachable: budgets are not worth an outage
            logger.warning("budget ledger unreachable: admitting without a reservation")
            self._degraded()
            return Admission(tenant_pk, candidate, None, scopes)
        if isinstance(held, Refusal):
            raise ReachError("quota_exceeded", f"The tenant's monthly {held.metric} budget "
                             f"({_shown(held)}) would be exceeded by this call.")
        return Admission(tenant_pk, candidate, held, scopes)

    async def settle(self, admission: Admission, actual: Amount) -> None:
        """Drop the call's reservation and count what it used. Never raises."""
        scopes = admission.scopes
        reservation = admission.reservation
        if reservation is not None:
            try:
                await self.ledger.settle(reservation, actual)
            except Exception:
                self._degraded()
                self._unsettled.append((reservation, actual))
            scopes = tuple(s for s in scopes if s not in reservation.scopes)
        if actual != Amount():
            self.record(scopes, actual)

    def record(self, scopes: tuple[str, ...], amount: Amount) -> None:
        """Count usage outside any reservation; written by ``flush_forever``."""
        month = month_key()
        for scope in scopes:
            pending = self._unflushed.setdefault((month, scope), [0, 0, 0])
            for index, value in enumerate(amount.values()):
                pending[index] += value

    async def flush(self) -> None:
        unsettled, self._unsettled = self._unsettled, []
        for reservation, actual in unsettled:
            try:
                await self.ledger.settle(reservation, actual)
            except redis.ResponseError:
                # Refused, not unreachable: it would be refused again for ever (and what
                # ran before the refusal counted each time). Said, and let go.
                logger.error("budgets: the ledger refused a settlement of %s; dropped",
                             actual)
            except Exception:
                self._unsettled.append((reservation, actual))
        batch, self._unflushed = self._unflushed, {}
        if not batch:
            return
        try:
            await self.ledger.add_many({key: Amount(*v) for key, v in batch.items()})
        except redis.ResponseError:
            # A pipeline is not a transaction: the commands before the refused one were
            # applied. Retried, they were applied again on every flush (a break test: a
            # tenant's request count rose by 100 a second with no traffic).
            logger.error("budgets: the ledger refused a batch of usage (%d scopes); "
                         "dropped, not retried", len(batch))
        except Exception:
            self._degraded()
            # Keep them for the next flush rather than under-count a budget.
            for key, values in batch.items():
                again = self._unflushed.setdefault(key, [0, 0, 0])
                for index, value in enumerate(values):
                    again[index] += value

    async def flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self.FLUSH_EVERY_S)
            if self._unflushed or self._unsettled:
                await self.flush()


def _shown(refusal: Refusal) -> str:
    if refusal.metric == "cost":
        return f"{refusal.limit / 1_000_000:g}"
    return str(refusal.limit)
