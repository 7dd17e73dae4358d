"""Hourly and daily usage totals, rebuilt from ``UsageEvent``.

Each period is recomputed whole (delete, then insert) in one transaction, so a
rollup can run any number of times, late events are picked up by the next run,
and a group that disappeared (its agent deleted and set NULL) leaves no stale row.
Periods are UTC hours and days, whatever time zone the admin displays.

A run rebuilds the current and the previous hour and day, and every period marked
pending. The consumer marks the hour and the day of each event it stores, in the
transaction that stores it (``pending_mark``), so an event stored however late (a
consumer backlog, a rollup job that was down) reaches its rollup; until then the
reports read that day's raw events instead of its rollup rows.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, models, transaction
from django.db.models import Count, DecimalField, Sum

from metering.choices import Outcome, sorted_reasons
from metering.models import PendingRollup, UsageDaily, UsageEvent, UsageHourly

_GROUP = ("tenant_id", "agent_id", "capability_id")
_SUMS = ("input_tokens", "output_tokens", "cost", "latency_ms_total")
# Wider than a row's cost: SQLite's converter quantizes a sum within the field's max_digits.
_COST_SUM = DecimalField(max_digits=24, decimal_places=6)
# Pending periods rebuilt per run and kind, oldest first; the rest wait for the next
# run (reports read their events meanwhile, so nothing is missing in the meantime).
PENDING_PER_RUN = 100


def _totals(start: datetime, end: datetime) -> list[dict[str, Any]]:
    """One row per tenant x agent x capability, from one query grouped by outcome too."""
    per_outcome = (
        # Agent calls: tool calls have a report of their own (selectors.tool_usage).
        UsageEvent.objects.filter(occurred_at__gte=start, occurred_at__lt=end,
                                  tool__isnull=True)
        .order_by()  # Meta.ordering must not leak into the GROUP BY
        .values(*_GROUP, "outcome")
        .annotate(
            calls=Count("id"),
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            cost=Sum("cost", output_field=_COST_SUM),
            latency_ms_total=Sum("latency_ms"),
        )
    )
    rows: dict[tuple, dict[str, Any]] = {}
    for raw in per_outcome:
        key = tuple(raw[field] for field in _GROUP)
        row = rows.get(key)
        if row is None:
            row = rows[key] = {
                **dict(zip(_GROUP, key, strict=True)), "requests": 0, "errors": 0,
                "input_tokens": 0, "output_tokens": 0, "cost": Decimal(0),
                "latency_ms_total": 0, "errors_by_reason": {},
            }
        row["requests"] += raw["calls"]
        for field in _SUMS:
            row[field] += raw[field] or 0
        if raw["outcome"] != Outcome.SUCCESS:
            row["errors"] += raw["calls"]
            row["errors_by_reason"][raw["outcome"]] = raw["calls"]
    for row in rows.values():
        row["errors_by_reason"] = sorted_reasons(row["errors_by_reason"])
    return list(rows.values())


def _advisory_lock(name: str, *, shared: bool = False) -> None:
    """A transaction-scoped PostgreSQL advisory lock; SQLite allows one writer anyway."""
    if connection.vendor == "postgresql":
        function = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {function}(%s)", [zlib.crc32(name.encode())])


def _serialise(kind: str, period: datetime | date) -> None:
    """Two rollups of one period at once would both delete, then collide on insert."""
    _advisory_lock(f"metering.rollup:{kind}:{period.isoformat()}")


def _pending_lock_name(kind: str, start: datetime) -> str:
    return f"metering.pending:{kind}:{start.isoformat()}"


def _replace(model: type[models.Model], period_field: str, period: datetime | date,
             totals: list[dict]) -> int:
    model.objects.filter(**{period_field: period}).delete()
    model.objects.bulk_create([model(**{period_field: period}, **row) for row in totals])
    return len(totals)


def _hour_floor(hour: datetime) -> datetime:
    if hour.tzinfo is None:
        hour = hour.replace(tzinfo=UTC)
    return hour.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


# ---- pending periods -------------------------------------------------------------------


def pending_mark(moments: Iterable[datetime]) -> None:
    """Mark the UTC hours and days of ``moments`` (event times) pending.

    Call it inside the transaction that stores those events. It holds a shared lock
    per period until that transaction ends, and ``_pending_clear`` takes the same
    lock exclusively: a rollup either waits for these events to commit (and then
    sees them) or clears the mark first (and the mark made here survives it).
    """
    periods: set[tuple[str, datetime]] = set()
    for moment in moments:
        hour = _hour_floor(moment)
        periods.add((PendingRollup.HOUR, hour))
        periods.add((PendingRollup.DAY, hour.replace(hour=0)))
    if not periods:
        return
    for kind, start in sorted(periods):  # one lock order for every consumer
        _advisory_lock(_pending_lock_name(kind, start), shared=True)
    PendingRollup.objects.bulk_create(
        [PendingRollup(kind=kind, start=start) for kind, start in sorted(periods)],
        ignore_conflicts=True,
    )


@transaction.atomic
def _pending_clear(kind: str, start: datetime) -> None:
    # Short on purpose: consumers storing into this period wait only for the delete,
    # not for the rebuild that follows in its own transaction.
    _advisory_lock(_pending_lock_name(kind, start))
    PendingRollup.objects.filter(kind=kind, start=start).delete()


def pending_days(start: date, end: date) -> set[date]:
    """Days in ``[start, end]`` whose rollup rows may lag their events."""
    starts = PendingRollup.objects.filter(
        kind=PendingRollup.DAY, start__gte=_day_start(start),
        start__lt=_day_start(end + timedelta(days=1)),
    ).values_list("start", flat=True)
    return {moment.astimezone(UTC).date() for moment in starts}


def _oldest_pending(kind: str, limit: int) -> list[datetime]:
    return list(PendingRollup.objects.filter(kind=kind).order_by("start")
                .values_list("start", flat=True)[:limit])


# ---- rebuilding ------------------------------------------------------------------------


@transaction.atomic
def _rebuild_hour(start: datetime) -> int:
    _serialise("hour", start)
    return _replace(UsageHourly, "hour", start, _totals(start, start + timedelta(hours=1)))


@transaction.atomic
def _rebuild_day(day: date) -> int:
    start = _day_start(day)
    _serialise("day", day)
    return _replace(UsageDaily, "day", day, _totals(start, start + timedelta(days=1)))


def rollup_hour(hour: datetime) -> int:
    """Rebuild ``UsageHourly`` for the UTC hour containing ``hour``; returns rows written."""
    start = _hour_floor(hour)
    _pending_clear(PendingRollup.HOUR, start)
    return _rebuild_hour(start)


def rollup_day(day: date) -> int:
    """Rebuild ``UsageDaily`` for one UTC day; returns rows written."""
    if isinstance(day, datetime):
        day = _hour_floor(day).date()
    _pending_clear(PendingRollup.DAY, _day_start(day))
    return _rebuild_day(day)


def rollup_range(start: date, end: date) -> dict[str, int]:
    """Rebuild every hour and day of ``[start, end]`` (UTC), e.g. after a restore."""
    hours = days = 0
    for offset in range((end - start).days + 1):
        day = start + timedelta(days=offset)
        days += rollup_day(day)
        hours += sum(rollup_hour(_day_start(day) + timedelta(hours=h)) for h in range(24))
    return {"hours": hours, "days": days}


def rollup_recent(now: datetime, *, pending_limit: int = PENDING_PER_RUN) -> dict[str, int]:
    """The current and the previous hour and day (late events land in either), and the
    oldest ``pending_limit`` pending hours and days.

    One transaction per period, so a long backlog does not hold one lock for all.
    """
    hour = _hour_floor(now)
    today = hour.date()
    days = {today - timedelta(days=1), today} | {
        start.astimezone(UTC).date() for start in _oldest_pending(PendingRollup.DAY,
                                                                  pending_limit)
    }
    hours = {hour - timedelta(hours=1), hour} | {
        start.astimezone(UTC) for start in _oldest_pending(PendingRollup.HOUR, pending_limit)
    }
    # Days first: the reports read them.
    return {
        "days": sum(rollup_day(day) for day in sorted(days)),
        "hours": sum(rollup_hour(start) for start in sorted(hours)),
    }
