"""Hourly and daily usage totals, rebuilt from ``UsageEvent``.

Each period is recomputed whole (delete, then insert) in one transaction, so a
rollup can run any number of times, late events are picked up by the next run,
and a group that disappeared (its agent deleted and set NULL) leaves no stale row.
Periods are UTC hours and days, whatever time zone the admin displays.
"""

from __future__ import annotations

import zlib
from datetime import UTC, date, datetime, time, timedelta

from django.db import connection, models, transaction
from django.db.models import Count, DecimalField, Q, Sum

from metering.choices import Outcome
from metering.models import UsageDaily, UsageEvent, UsageHourly

_GROUP = ("tenant_id", "agent_id", "capability_id")
# Wider than a row's cost: SQLite's converter quantizes a sum within the field's max_digits.
_COST_SUM = DecimalField(max_digits=24, decimal_places=6)


def _totals(start: datetime, end: datetime) -> list[dict]:
    return list(
        UsageEvent.objects.filter(occurred_at__gte=start, occurred_at__lt=end)
        .order_by()  # Meta.ordering must not leak into the GROUP BY
        .values(*_GROUP)
        .annotate(
            requests=Count("id"),
            errors=Count("id", filter=~Q(outcome=Outcome.SUCCESS)),
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            cost=Sum("cost", output_field=_COST_SUM),
            latency_ms_total=Sum("latency_ms"),
        )
    )


def _serialise(kind: str, period: datetime | date) -> None:
    """Two rollups of one period at once would both delete, then collide on insert."""
    if connection.vendor == "postgresql":
        key = zlib.crc32(f"metering.rollup:{kind}:{period.isoformat()}".encode())
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
    # SQLite allows one writer at a time anyway.


def _replace(model: type[models.Model], period_field: str, period: datetime | date,
             totals: list[dict]) -> int:
    model.objects.filter(**{period_field: period}).delete()
    model.objects.bulk_create([model(**{period_field: period}, **row) for row in totals])
    return len(totals)


def _hour_floor(hour: datetime) -> datetime:
    if hour.tzinfo is None:
        hour = hour.replace(tzinfo=UTC)
    return hour.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


@transaction.atomic
def rollup_hour(hour: datetime) -> int:
    """Rebuild ``UsageHourly`` for the UTC hour containing ``hour``; returns rows written."""
    start = _hour_floor(hour)
    _serialise("hour", start)
    return _replace(UsageHourly, "hour", start, _totals(start, start + timedelta(hours=1)))


@transaction.atomic
def rollup_day(day: date) -> int:
    """Rebuild ``UsageDaily`` for one UTC day; returns rows written."""
    if isinstance(day, datetime):
        day = _hour_floor(day).date()
    start = datetime.combine(day, time.min, tzinfo=UTC)
    _serialise("day", day)
    return _replace(UsageDaily, "day", day, _totals(start, start + timedelta(days=1)))


def rollup_recent(now: datetime) -> dict[str, int]:
    """The current and the previous hour and day: late events land in either.

    One transaction per period, so a long backlog does not hold one lock for all.
    """
    hour = _hour_floor(now)
    today = hour.date()
    return {
        "hours": rollup_hour(hour - timedelta(hours=1)) + rollup_hour(hour),
        "days": rollup_day(today - timedelta(days=1)) + rollup_day(today),
    }
