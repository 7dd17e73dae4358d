"""Monthly budgets from ``Quota`` rows: usage this calendar month and 80 % alerts.

Usage is read from ``UsageEvent`` (not the rollups) so an alert never waits for
the next rollup. Months are UTC calendar months.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TypedDict

from django.db import transaction
from django.db.models import Count, DecimalField, Q, Sum

from metering.models import BudgetAlert, UsageEvent
from reach_core.budgets import budget_scope, usage_key
from tenants.models import Quota

# Shares of a budget that raise an alert, each once per quota, month and metric.
THRESHOLDS = (Decimal("0.80"), Decimal("1.00"))
_METRICS = (("requests", "monthly_requests"), ("tokens", "monthly_tokens"),
            ("cost", "monthly_cost"))
# Wider than a row's cost: SQLite's converter quantizes a sum within the field's max_digits.
_COST_SUM = DecimalField(max_digits=24, decimal_places=6)


class MonthUsage(TypedDict):
    requests: int
    tokens: int
    cost: Decimal


def _month_bounds(now: datetime) -> tuple[datetime, datetime]:
    now = now.astimezone(UTC) if now.tzinfo else now.replace(tzinfo=UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(
        month=start.month + 1)
    return start, end


def month_usage(tenant_id: int, agent_id: int | None = None, *,
                capability_id: int | None = None,
                now: datetime | None = None) -> MonthUsage:
    """A tenant's usage this calendar month, optionally narrowed to an agent or capability."""
    start, end = _month_bounds(now or datetime.now(tz=UTC))
    # Agent calls only: tool calls have quotas of their own, not the tenant's budgets.
    scope = Q(tenant_id=tenant_id, occurred_at__gte=start, occurred_at__lt=end,
              tool__isnull=True)
    if agent_id is not None:
        scope &= Q(agent_id=agent_id)
    if capability_id is not None:
        scope &= Q(capability_id=capability_id)
    # A request counts when the agent answered (it succeeded or reported usage), or when
    # its gateway died with it (``worker_lost``: the agent may have run it): as the
    # gateway's budgets count them, a failing agent consumes no budget.
    answered = Q(outcome="success") | Q(input_tokens__gt=0) | Q(output_tokens__gt=0) \
        | Q(cost__gt=0) | Q(outcome="worker_lost")
    totals = UsageEvent.objects.filter(scope).aggregate(
        requests=Count("id", filter=answered),
        input_tokens=Sum("input_tokens", default=0),
        output_tokens=Sum("output_tokens", default=0),
        cost=Sum("cost", output_field=_COST_SUM),
    )
    return MonthUsage(
        requests=totals["requests"],
        tokens=totals["input_tokens"] + totals["output_tokens"],
        cost=totals["cost"] or Decimal(0),
    )


def _crossed(used: Decimal, budget: Decimal, threshold: Decimal) -> bool:
    if budget <= 0:
        # A zero budget means "none allowed": any use at all is worth an alert.
        return used > 0
    return used >= budget * threshold


@transaction.atomic
def budgets_check(*, now: datetime) -> list[BudgetAlert]:
    """Alert once per quota, month, metric and threshold when usage reaches 80 % and
    100 % of the budget.

    Returns the alerts created by this run; the unique constraint makes a second
    run (or a concurrent one) a no-op.
    """
    start, _ = _month_bounds(now)
    month: date = start.date()
    quotas = Quota.objects.filter(
        Q(monthly_requests__isnull=False) | Q(monthly_tokens__isnull=False)
        | Q(monthly_cost__isnull=False)
    ).order_by("pk")
    usage_by_scope: dict[tuple[int, int | None, int | None], MonthUsage] = {}
    created: list[BudgetAlert] = []
    for quota in quotas:
        scope = (quota.tenant_id, quota.agent_id, quota.capability_id)
        if scope not in usage_by_scope:
            usage_by_scope[scope] = month_usage(
                quota.tenant_id, quota.agent_id, capability_id=quota.capability_id, now=now)
        usage = usage_by_scope[scope]
        for metric, field in _METRICS:
            budget = getattr(quota, field)
            if budget is None:
                continue
            used, budget = Decimal(usage[metric]), Decimal(budget)
            for threshold in THRESHOLDS:
                if not _crossed(used, budget, threshold):
                    continue
                alert, is_new = BudgetAlert.objects.get_or_create(
                    quota=quota, month=month, metric=metric, threshold=threshold,
                    defaults={"tenant_id": quota.tenant_id, "used": used, "budget": budget},
                )
                if is_new:
                    created.append(alert)
    return created


# Sets each field of the usage hash to at least the given value (never lowers it).
_RESTORE = """
for i = 1, #ARGV - 1, 2 do
  local have = tonumber(redis.call('HGET', KEYS[1], ARGV[i])) or 0
  if have < tonumber(ARGV[i + 1]) then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[#ARGV])
return 1
"""
_KEY_TTL_MS = 40 * 86400 * 1000


def quota_budget_scope(quota: Quota) -> str:
    """The counters a quota's budgets are checked against, named as the gateway names them."""
    return budget_scope(quota.tenant_id, quota.agent_id, quota.capability_id)


def budget_counters_restore(*, client, prefix: str, now: datetime) -> int:
    """Raise the gateways' month counters in Redis to at least the stored usage.

    The counters are the budgets' source of truth while Redis keeps them; a Redis that
    lost its data (restarted without persistence) would start the month from zero. The
    stored events lag the counters by seconds at most, so taking the larger of the two
    never counts a call twice and restores what was lost. Returns the scopes written.
    """
    month = now.astimezone(UTC).strftime("%Y-%m")
    restore = client.register_script(_RESTORE)
    quotas = Quota.objects.filter(Q(monthly_requests__isnull=False)
                                  | Q(monthly_tokens__isnull=False)
                                  | Q(monthly_cost__isnull=False))
    done = set()
    for quota in quotas:
        scope = quota_budget_scope(quota)
        if scope in done:
            continue
        done.add(scope)
        used = month_usage(quota.tenant_id, quota.agent_id, capability_id=quota.capability_id,
                           now=now)
        restore(keys=[usage_key(prefix, month, scope)], args=[
            "requests", used["requests"], "tokens", used["tokens"],
            "cost", int(used["cost"] * 1_000_000), _KEY_TTL_MS])
    return len(done)
