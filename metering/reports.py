"""What the REST report endpoints and the admin report page share besides the queries:
the period rules, tenant narrowing, the CSV layout and the cost chart's geometry."""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.utils import timezone

from metering.choices import ERROR_REASONS
from metering.selectors import GROUP_KEYS, METRIC_KEYS
from tenants.models import Tenant

MAX_PERIOD_DAYS = 366
DEFAULT_GROUP_BY: tuple[str, ...] = ("agent", "capability", "day")


class PeriodError(ValueError):
    """A report period the caller must fix; ``field`` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def utc_today() -> dt.date:
    return timezone.now().astimezone(dt.UTC).date()


def resolve_period(
    start: dt.date | None, end: dt.date | None, *, today: dt.date | None = None
) -> tuple[dt.date, dt.date]:
    """Fill in the defaults (month to date) and enforce the period rules.

    A missing ``start`` is the first of ``end``'s month, so ``?end=`` alone
    still means "that month up to that day" rather than an inverted period.
    """
    end = end or today or utc_today()
    start = start or end.replace(day=1)
    if start > end:
        raise PeriodError("start", "Must be on or before end.")
    if end >= dt.date.max:
        # The period's upper bound is the day after ``end``: none after the last one.
        raise PeriodError("end", f"Must be before {dt.date.max.isoformat()}.")
    if (end - start).days + 1 > MAX_PERIOD_DAYS:
        raise PeriodError("end", f"The period may span at most {MAX_PERIOD_DAYS} days.")
    return start, end


def parse_group_by(raw: str | None) -> list[str]:
    """``"agent, day"`` -> ``["agent", "day"]``; ``None`` -> the default grouping."""
    if raw is None:
        return list(DEFAULT_GROUP_BY)
    keys = [part.strip() for part in raw.split(",") if part.strip()]
    if not keys:
        raise ValueError(f"Name at least one of: {', '.join(GROUP_KEYS)}.")
    unknown = [key for key in keys if key not in GROUP_KEYS]
    if unknown:
        raise ValueError(
            f"Unknown group key(s) {', '.join(unknown)}; choose from {', '.join(GROUP_KEYS)}."
        )
    return list(dict.fromkeys(keys))


def narrow_to_tenant(tenant_ids: Iterable[int] | None, slug: str | None) -> frozenset[int] | None:
    """The caller's readable tenants, or just ``slug`` among them.

    Raises ``Tenant.DoesNotExist`` both for an unknown slug and for a tenant
    the caller may not read, so the answer never confirms another tenant exists.
    """
    if not slug:
        return None if tenant_ids is None else frozenset(tenant_ids)
    tenant = Tenant.objects.for_tenants(tenant_ids).only("pk").get(slug=slug)
    return frozenset({tenant.pk})


def readable_tenants(tenant_ids: Iterable[int] | None):
    return Tenant.objects.for_tenants(tenant_ids).order_by("slug")


# One column per outcome but success, in every export whatever occurred: the header
# is the same for every period, so exports concatenate and import alike.
REASON_COLUMNS: tuple[str, ...] = tuple(f"errors_{reason}" for reason in ERROR_REASONS)


def csv_columns(group_by: Sequence[str]) -> list[str]:
    """The group keys, the metrics, then ``errors_<outcome>`` for every error outcome."""
    return [*group_by, *METRIC_KEYS, *REASON_COLUMNS]


def _csv_cell(value: Any) -> str:
    # f-format keeps small and zero costs plain ("0.000000", never "0E-6").
    return f"{value:f}" if isinstance(value, Decimal) else str(value)


def report_csv(rows: Iterable[dict[str, Any]], group_by: Sequence[str]) -> str:
    columns = csv_columns(group_by)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        reasons = row["errors_by_reason"]
        cells = {**row, **{f"errors_{reason}": reasons.get(reason, 0)
                           for reason in ERROR_REASONS}}
        writer.writerow([_csv_cell(cells[column]) for column in columns])
    return buffer.getvalue()


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    day: dt.date
    cost: Decimal


@dataclass(frozen=True)
class CostChart:
    """Geometry of an inline SVG bar chart; the template only draws it."""

    width: int
    height: int
    plot_top: int
    plot_bottom: int
    bars: list[Bar]
    max_cost: Decimal
    first_day: dt.date | None
    last_day: dt.date | None


def cost_chart(
    points: Sequence[tuple[dt.date, Decimal]], *, width: int = 760, height: int = 200
) -> CostChart:
    plot_top, plot_bottom = 16, height - 24
    plot_height = plot_bottom - plot_top
    max_cost = max((cost for _, cost in points), default=Decimal(0))
    slot = width / max(len(points), 1)
    gap = min(2.0, slot * 0.2)
    bars: list[Bar] = []
    for index, (day, cost) in enumerate(points):
        bar_height = float(cost / max_cost) * plot_height if max_cost else 0.0
        bars.append(Bar(
            x=round(index * slot + gap / 2, 2), y=round(plot_bottom - bar_height, 2),
            width=round(max(slot - gap, 0.5), 2), height=round(bar_height, 2), day=day, cost=cost,
        ))
    return CostChart(
        width=width, height=height, plot_top=plot_top, plot_bottom=plot_bottom, bars=bars,
        max_cost=max_cost, first_day=points[0][0] if points else None,
        last_day=points[-1][0] if points else None,
    )
