"""Usage and cost reports, read straight from ``UsageEvent``.

Reports aggregate the raw events rather than the daily/hourly rollups so they
are right before (and regardless of whether) a rollup has run. Every function
takes ``tenant_ids``: the tenants the caller may read, ``None`` meaning all of
them (superusers), an empty collection meaning none.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from django.db.models import Count, DecimalField, Q, QuerySet, Sum
from django.db.models.functions import TruncDate

from metering.choices import Outcome
from metering.models import UsageEvent

GROUP_KEYS: tuple[str, ...] = ("tenant", "agent", "capability", "day")
METRIC_KEYS: tuple[str, ...] = (
    "requests", "errors", "input_tokens", "output_tokens", "cost", "latency_ms_avg",
)
# Events keep their row when the agent or capability goes (SET_NULL); calls that
# never reached an agent carry no agent either, so both land in this bucket.
MISSING = "(deleted)"

COST_PLACES = Decimal("0.000001")
SHARE_PLACES = Decimal("0.000001")

# Wide enough that a year of a busy tenant's costs never overflows the
# decimal context SQLite's converter quantizes with (it uses max_digits).
_COST_SUM = DecimalField(max_digits=24, decimal_places=6)

# The ORM lookups each group key groups on; the first one is what is reported.
_GROUP_LOOKUPS: dict[str, tuple[str, ...]] = {
    "tenant": ("tenant__slug",),
    # Grouped by id too: two agents may share a name across namespaces.
    "agent": ("agent__name", "agent_id"),
    # By the public capability id, so "per capability" spans every agent offering it.
    "capability": ("capability__capability_id",),
    "day": ("report_day",),
}


def period_bounds(start: dt.date, end: dt.date) -> tuple[dt.datetime, dt.datetime]:
    """``[start 00:00 UTC, end+1 00:00 UTC)``: both days whole, whatever the server zone."""
    lower = dt.datetime.combine(start, dt.time.min, tzinfo=dt.UTC)
    upper = dt.datetime.combine(end + dt.timedelta(days=1), dt.time.min, tzinfo=dt.UTC)
    return lower, upper


def _events(
    *, tenant_ids: Iterable[int] | None, start: dt.date, end: dt.date
) -> QuerySet[UsageEvent]:
    lower, upper = period_bounds(start, end)
    # order_by(): Meta.ordering must not leak into GROUP BY.
    return (
        UsageEvent.objects.for_tenants(tenant_ids)
        .filter(occurred_at__gte=lower, occurred_at__lt=upper)
        .order_by()
    )


def _metric_aggregates() -> dict[str, Any]:
    return {
        "requests": Count("id"),
        "errors": Count("id", filter=~Q(outcome=Outcome.SUCCESS)),
        "input_tokens": Sum("input_tokens"),
        "output_tokens": Sum("output_tokens"),
        "cost": Sum("cost", output_field=_COST_SUM),
        # Summed, not averaged, in SQL: the mean is derived once, the same way for
        # rows and totals.
        "latency_ms_total": Sum("latency_ms"),
    }


def _metrics(raw: dict[str, Any]) -> dict[str, Any]:
    requests = int(raw.get("requests") or 0)
    latency_total = int(raw.get("latency_ms_total") or 0)
    return {
        "requests": requests,
        "errors": int(raw.get("errors") or 0),
        "input_tokens": int(raw.get("input_tokens") or 0),
        "output_tokens": int(raw.get("output_tokens") or 0),
        "cost": quantize_cost(raw.get("cost")),
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

    Rows are sorted by the group keys in that order. Without group keys the
    report is a single row holding the totals (none when there was no usage).
    """
    keys = normalise_group_by(group_by)
    events = _events(tenant_ids=tenant_ids, start=start, end=end)
    if not keys:
        totals = usage_totals(tenant_ids=tenant_ids, start=start, end=end)
        return [totals] if totals["requests"] else []
    if "day" in keys:
        events = events.annotate(report_day=TruncDate("occurred_at", tzinfo=dt.UTC))
    lookups = [lookup for key in keys for lookup in _GROUP_LOOKUPS[key]]
    grouped = events.values(*lookups).annotate(**_metric_aggregates())
    rows = [_report_row(raw, keys) for raw in grouped]
    rows.sort(key=lambda row: tuple(row[key] for key in keys))
    return rows


def _report_row(raw: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key in keys:
        value = raw[_GROUP_LOOKUPS[key][0]]
        if key == "day":
            # SQLite may hand back the ISO string, PostgreSQL a date.
            value = value.isoformat() if isinstance(value, dt.date) else str(value)
        row[key] = MISSING if value is None else value
    row.update(_metrics(raw))
    return row


def usage_totals(
    *, tenant_ids: Iterable[int] | None, start: dt.date, end: dt.date
) -> dict[str, Any]:
    """The metrics of ``usage_report`` over the whole period, in one row."""
    events = _events(tenant_ids=tenant_ids, start=start, end=end)
    return _metrics(events.aggregate(**_metric_aggregates()))


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
    grouped = (
        _events(tenant_ids=tenant_ids, start=start, end=end)
        .values("tenant__slug")
        .annotate(cost=Sum("cost", output_field=_COST_SUM), requests=Count("id"))
    )
    rows = [
        {"tenant": raw["tenant__slug"], "requests": int(raw["requests"]),
         "cost": quantize_cost(raw["cost"])}
        for raw in grouped
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

