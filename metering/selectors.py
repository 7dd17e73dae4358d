"""Usage and cost reports: daily rollups for settled days, raw events for the rest.

A day is *settled* when it ended before yesterday (UTC) and is not pending (every
event stored for it has been rolled up, ``metering.rollups``): its figures come
from ``UsageDaily``. Today, yesterday and pending days come from ``UsageEvent``.
So a report is current up to the last stored call, yet a year-long report reads a
few days of raw events, not a year of them. Both sources give the same sums.

Every function takes ``tenant_ids``: the tenants the caller may read, ``None``
meaning all of them (superusers), an empty collection meaning none.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from django.db.models import Count, DecimalField, F, Q, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from metering.choices import Outcome, sorted_reasons
from metering.models import UsageDaily, UsageEvent
from metering.rollups import pending_days

GROUP_KEYS: tuple[str, ...] = ("tenant", "agent", "capability", "day")
METRIC_KEYS: tuple[str, ...] = (
    "requests", "errors", "input_tokens", "output_tokens", "cost", "latency_ms_avg",
)
# Calls refused before routing (no_capability, invalid_input, ...) carry no agent and
# no capability; events keep their row when the agent or capability goes (SET_NULL),
# so a deleted agent's past calls land in the same bucket.
MISSING: dict[str, str] = {"agent": "(no agent)", "capability": "(no capability)"}

COST_PLACES = Decimal("0.000001")
SHARE_PLACES = Decimal("0.000001")

# Wide enough that a year of a busy tenant's costs never overflows the
# decimal context SQLite's converter quantizes with (it uses max_digits).
_COST_SUM = DecimalField(max_digits=24, decimal_places=6)

# The ORM lookups each group key groups on (the same on UsageEvent and UsageDaily);
# the first one is what is reported.
_GROUP_LOOKUPS: dict[str, tuple[str, ...]] = {
    "tenant": ("tenant__slug",),
    # Grouped by id too: two agents may share a name across namespaces.
    "agent": ("agent__name", "agent_id"),
    # By the public capability id, so "per capability" spans every agent offering it.
    "capability": ("capability__capability_id",),
    "day": ("report_day",),
}
_SUMS = ("requests", "errors", "input_tokens", "output_tokens", "cost", "latency_ms_total")


def period_bounds(start: dt.date, end: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """``[start 00:00 UTC, end+1 00:00 UTC)``: both days whole, whatever the server zone."""
    lower = dt.datetime.combine(start, dt.time.min, tzinfo=dt.UTC)
    upper = dt.datetime.combine(end + dt.timedelta(days=1), dt.time.min, tzinfo=dt.UTC)
    return lower, upper


def _day_ranges(days: Iterable[dt.date]) -> Q:
    """``occurred_at`` within any of ``days``, consecutive days as one range."""
    condition = Q(pk__in=[])  # matches nothing
    ordered = sorted(set(days))
    while ordered:
        first = last = ordered.pop(0)
        while ordered and ordered[0] == last + dt.timedelta(days=1):
            last = ordered.pop(0)
        lower, upper = period_bounds(first, last)
        condition |= Q(occurred_at__gte=lower, occurred_at__lt=upper)
    return condition


def _sources(
    *, tenant_ids: Iterable[int] | None, start: dt.date, end: dt.date
) -> tuple[QuerySet[UsageDaily], QuerySet[UsageEvent]]:
    """The rollup rows of the settled days and the events of the others in the period."""
    tenant_ids = None if tenant_ids is None else list(tenant_ids)
    today = timezone.now().astimezone(dt.UTC).date()
    recent_from = max(start, today - dt.timedelta(days=1))
    pending = pending_days(start, end)
    from_events = pending | {
        recent_from + dt.timedelta(days=n) for n in range((end - recent_from).days + 1)
    }
    # order_by(): Meta.ordering must not leak into GROUP BY.
    rollups = (
        UsageDaily.objects.for_tenants(tenant_ids)
        .filter(day__gte=start, day__lte=min(end, today - dt.timedelta(days=2)))
        .exclude(day__in=pending)
        .order_by()
    )
    events = UsageEvent.objects.for_tenants(tenant_ids).filter(
        _day_ranges(from_events), tool__isnull=True)
    return rollups, events.order_by()


def _zero() -> dict[str, Any]:
    return {**dict.fromkeys(_SUMS, 0), "cost": Decimal(0), "errors_by_reason": {}}


def _group_key(raw: dict[str, Any], keys: Sequence[str]) -> tuple:
    key: list[Any] = []
    for name in keys:
        if name == "agent":
            # A rollup row keeps a deleted agent's id: it groups with the events' NULL.
            agent = raw["agent__name"]
            key.append((agent, raw["agent_id"] if agent is not None else None))
        elif name == "day":
            value = raw["report_day"]
            # SQLite may hand back the ISO string, PostgreSQL a date.
            key.append(value.isoformat() if isinstance(value, dt.date) else str(value))
        else:
            key.append(raw[_GROUP_LOOKUPS[name][0]])
    return tuple(key)


def _grouped(queryset: QuerySet, lookups: list[str], **aggregates: Any) -> list[dict]:
    if lookups:
        return list(queryset.values(*lookups).annotate(**aggregates))
    # values() without fields would mean "every field".
    return [queryset.aggregate(**aggregates)]


def _sums(
    *, tenant_ids: Iterable[int] | None, start: dt.date, end: dt.date, keys: Sequence[str]
) -> dict[tuple, dict[str, Any]]:
    """Per group (see ``_group_key``): the sums and ``errors_by_reason``."""
    rollups, events = _sources(tenant_ids=tenant_ids, start=start, end=end)
    if "day" in keys:
        rollups = rollups.annotate(report_day=F("day"))
        events = events.annotate(report_day=TruncDate("occurred_at", tzinfo=dt.UTC))
    lookups = [lookup for key in keys for lookup in _GROUP_LOOKUPS[key]]
    groups: dict[tuple, dict[str, Any]] = {}

    def add(raw: dict[str, Any], **counts: int) -> dict[str, Any]:
        group = groups.setdefault(_group_key(raw, keys), _zero())
        for field in ("input_tokens", "output_tokens", "cost", "latency_ms_total"):
            group[field] += raw[field] or 0
        for field, count in counts.items():
            group[field] += count
        return group

    for raw in _grouped(
        rollups, lookups, rows=Count("id"), requests=Sum("requests"), errors=Sum("errors"),
        input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"),
        cost=Sum("cost", output_field=_COST_SUM), latency_ms_total=Sum("latency_ms_total"),
    ):
        if raw["rows"]:
            add(raw, requests=raw["requests"], errors=raw["errors"])
    # The breakdowns are JSON: summed here, over the rows that have any. (setdefault: a
    # rollup rewritten between the two queries must not fail the report.)
    for raw in rollups.filter(errors__gt=0).values(*lookups, "errors_by_reason"):
        reasons = groups.setdefault(_group_key(raw, keys), _zero())["errors_by_reason"]
        for reason, count in raw["errors_by_reason"].items():
            reasons[reason] = reasons.get(reason, 0) + count

    for raw in _grouped(
        events, [*lookups, "outcome"], requests=Count("id"),
        input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"),
        cost=Sum("cost", output_field=_COST_SUM), latency_ms_total=Sum("latency_ms"),
    ):
        failed = raw["outcome"] != Outcome.SUCCESS
        group = add(raw, requests=raw["requests"], errors=raw["requests"] if failed else 0)
        if failed:
            reasons = group["errors_by_reason"]
            reasons[raw["outcome"]] = reasons.get(raw["outcome"], 0) + raw["requests"]
    return groups


def _metrics(sums: dict[str, Any]) -> dict[str, Any]:
    requests = int(sums["requests"])
    latency_total = int(sums["latency_ms_total"])
    return {
        "requests": requests,
        "errors": int(sums["errors"]),
        "errors_by_reason": sorted_reasons(sums["errors_by_reason"]),
        "input_tokens": int(sums["input_tokens"]),
        "output_tokens": int(sums["output_tokens"]),
        "cost": quantize_cost(sums["cost"]),
        "latency_ms_avg": round(latency_total / requests, 1) if requests else 0.0,
    }


def quantize_cost(value: Decimal | float | int | None) -> Decimal:
    return Decimal(str(value or 0)).quantize(COST_PLACES, rounding=ROUND_HALF_EVEN)


def normalise_group_by(group_by: Sequence[str]) -> list[str]:
    """The caller's keys in their order, duplicates dropped; unknown keys are an error."""
    unknown = [key for key in group_by if key not in GROUP_KEYS]
    if unknown:
        raise ValueError(f"Unknown group key(s): {', '.join(unknown)}.")
    return list(dict.fromkeys(group_by))


def usage_report(
    *,
    tenant_ids: Iterable[int] | None,
    start: dt.date,
    end: dt.date,
    group_by: Sequence[str],
) -> list[dict[str, Any]]:
    """One row per group: the group keys (in ``group_by`` order), then the metrics.

    ``errors`` counts every call that did not succeed (``client_cancelled``
    included); ``errors_by_reason`` splits it by outcome, only the outcomes that
    occurred, so its counts add up to ``errors``. Rows are sorted by the group keys
    in that order. Without group keys the report is a single row holding the totals
    (none when there was no usage).
    """
    keys = normalise_group_by(group_by)
    if not keys:
        totals = usage_totals(tenant_ids=tenant_ids, start=start, end=end)
        return [totals] if totals["requests"] else []
    rows = []
    for key, sums in _sums(tenant_ids=tenant_ids, start=start, end=end, keys=keys).items():
        row: dict[str, Any] = {}
        for name, value in zip(keys, key, strict=True):
            if name == "agent":
                value = value[0]
            row[name] = MISSING[name] if value is None else value
        row.update(_metrics(sums))
        rows.append(row)
    rows.sort(key=lambda row: tuple(row[key] for key in keys))
    return rows


def usage_totals(
    *, tenant_ids: Iterable[int] | None, start: dt.date, end: dt.date
) -> dict[str, Any]:
    """The metrics of ``usage_report`` over the whole period, in one row."""
    groups = _sums(tenant_ids=tenant_ids, start=start, end=end, keys=[])
    return _metrics(groups.get((), _zero()))


def daily_cost(
    *, tenant_ids: Iterable[int] | None, start: dt.date, end: dt.date
) -> list[tuple[dt.date, Decimal]]:
    """Cost per day for every day of the period, days without usage included as zero."""
    by_day = {
        row["day"]: row["cost"]
        for row in usage_report(tenant_ids=tenant_ids, start=start, end=end, group_by=["day"])
    }
    days = (end - start).days + 1
    out: list[tuple[dt.date, Decimal]] = []
    for offset in range(days):
        day = start + dt.timedelta(days=offset)
        out.append((day, by_day.get(day.isoformat(), quantize_cost(0))))
    return out


def cost_allocation(
    *, start: dt.date, end: dt.date, tenant_ids: Iterable[int] | None
) -> list[dict[str, Any]]:
    """Each tenant's cost and share of the period's total cost, largest first.

    Costs are the exact per-tenant sums, so they add up to the total by
    construction. Shares are rounded to six places and the rounding remainder
    goes to the largest share, so they add up to exactly 1 when anything was
    spent (and are all 0 when nothing was).
    """
    rows = [
        {"tenant": slug, "requests": int(sums["requests"]), "cost": quantize_cost(sums["cost"])}
        for (slug,), sums in _sums(tenant_ids=tenant_ids, start=start, end=end,
                                   keys=["tenant"]).items()
    ]
    rows.sort(key=lambda row: (-row["cost"], row["tenant"]))
    total = sum((row["cost"] for row in rows), Decimal(0))
    for row in rows:
        row["share"] = (
            (row["cost"] / total).quantize(SHARE_PLACES, rounding=ROUND_HALF_EVEN)
            if total else Decimal(0).quantize(SHARE_PLACES)
        )
    if total and rows:
        # Sorted largest first: the remainder (a few millionths at most) goes there.
        remainder = Decimal(1) - sum((row["share"] for row in rows), Decimal(0))
        rows[0]["share"] += remainder
    return rows


def allocation_total(rows: Iterable[dict[str, Any]]) -> Decimal:
    return quantize_cost(sum((row["cost"] for row in rows), Decimal(0)))



def tool_usage(*, tenant_ids: Iterable[int] | None, start: dt.date, end: dt.date) -> list[dict]:
    """Tool calls in ``[start, end]`` (UTC days) per tool and caller (an agent, or the
    tenant's keys): count, errors (every outcome but success, and the service's 4xx
    answers apart), average latency. From the events: the audit records themselves."""
    lower, upper = period_bounds(start, end)
    rows = (UsageEvent.objects.for_tenants(tenant_ids)
            .filter(tool__isnull=False, occurred_at__gte=lower, occurred_at__lt=upper)
            .order_by().values("tool__name", "tenant__slug", "caller_agent__name")
            .annotate(calls=Count("id"), errors=Count("id", filter=~Q(outcome="success")),
                      refused_by_service=Count("id", filter=Q(outcome="success",
                                                             upstream_status__gte=400)),
                      latency_ms_total=Sum("latency_ms")))
    return sorted(({
        "tool": row["tool__name"], "tenant": row["tenant__slug"],
        "caller": row["caller_agent__name"] or "(tenant key)", "calls": row["calls"],
        "errors": row["errors"], "refused_by_service": row["refused_by_service"],
        "latency_ms_avg": round(row["latency_ms_total"] / row["calls"], 1)}
        for row in rows), key=lambda r: (r["tool"] or "", r["tenant"], r["caller"]))
