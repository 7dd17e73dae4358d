"""What the operations console shows, read from the usage events (the call log): calls
per minute, the reach success rate and its failure reasons, latency percentiles, and one
agent's activity over time. Every function takes the tenants the viewer may see (None:
all) so a tenant's staff see their own calls only.

The reasons are ``reach_core.kinds.reason_of`` of the outcomes: the same split the
gateways' ``reach_agent_calls_total`` carries, so the console and /metrics agree.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Count, Q, QuerySet
from django.db.models.functions import Trunc

from metering.models import UsageEvent
from reach_core.kinds import NOT_THE_PLATFORMS, Reason, reason_of

# Latency percentiles are computed from at most this many of the newest calls: enough
# for a stable p99 (a hundred above it), bounded whatever the traffic.
PERCENTILE_SAMPLE = 20_000


def _calls(tenant_ids: Iterable[int] | None) -> QuerySet:
    calls = UsageEvent.objects.filter(tool__isnull=True)  # agent calls (tools: their own)
    return calls if tenant_ids is None else calls.filter(tenant_id__in=list(tenant_ids))


@dataclass
class Summary:
    """The calls of a period: by outcome, by reason, and the reach success rate."""

    total: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)
    by_reason: dict[str, int] = field(default_factory=dict)
    p50_ms: float | None = None
    p99_ms: float | None = None

    @property
    def considered(self) -> int:
        """The calls the rate is over: all but the callers' own errors and cancellations."""
        return self.total - sum(self.by_reason.get(str(r), 0) for r in NOT_THE_PLATFORMS)

    @property
    def success_rate(self) -> float | None:
        if not self.considered:
            return None
        return self.by_reason.get(str(Reason.SUCCESS), 0) / self.considered

    @property
    def failures(self) -> list[tuple[str, str, int]]:
        """(reason, its label, count) of every failure reason seen, most first."""
        return sorted(((reason, Reason(reason).label, count)
                       for reason, count in self.by_reason.items()
                       if reason != Reason.SUCCESS and count),
                      key=lambda item: (-item[2], item[0]))


def summary(tenant_ids: Iterable[int] | None, *, since: dt.datetime,
            until: dt.datetime, agent_id: int | None = None) -> Summary:
    calls = _calls(tenant_ids).filter(occurred_at__gte=since, occurred_at__lt=until)
    if agent_id is not None:
        calls = calls.filter(agent_id=agent_id)
    by_outcome = dict(calls.values_list("outcome").annotate(n=Count("id")).order_by())
    by_reason: Counter[str] = Counter()
    for outcome, count in by_outcome.items():
        by_reason[str(reason_of(outcome))] += count
    p50, p99 = percentiles(calls)
    return Summary(total=sum(by_outcome.values()), by_outcome=by_outcome,
                   by_reason=dict(by_reason), p50_ms=p50, p99_ms=p99)


def percentiles(calls: QuerySet) -> tuple[float | None, float | None]:
    latencies = sorted(calls.order_by("-occurred_at").values_list("latency_ms", flat=True)
                       [:PERCENTILE_SAMPLE])
    return _percentile(latencies, 0.50), _percentile(latencies, 0.99)


def _percentile(ordered: list[int], q: float) -> float | None:
    if not ordered:
        return None
    return float(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)])


@dataclass(frozen=True)
class Bucket:
    start: dt.datetime
    ok: int
    failed: int
    p50_ms: float | None = None

    @property
    def total(self) -> int:
        return self.ok + self.failed

    @property
    def success_rate(self) -> float | None:
        return self.ok / self.total if self.total else None


def buckets(tenant_ids: Iterable[int] | None, *, until: dt.datetime, count: int,
            width: dt.timedelta, agent_id: int | None = None,
            instance_id: int | None = None) -> list[Bucket]:
    """``count`` consecutive buckets of ``width`` ending at ``until`` (oldest first):
    calls that reached their agent (ok) and the platform's failures (callers' own
    errors left out, as in the rate). ``width`` is a whole number of minutes."""
    minutes = int(width.total_seconds() // 60)
    end = until.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    start = end - count * width
    calls = _calls(tenant_ids).filter(occurred_at__gte=start, occurred_at__lt=end)
    if agent_id is not None:
        calls = calls.filter(agent_id=agent_id)
    if instance_id is not None:
        calls = calls.filter(instance_id=instance_id)
    counted = [o for o in UsageEvent._meta.get_field("outcome").choices
               if reason_of(o[0]) not in NOT_THE_PLATFORMS]
    rows = (calls.filter(outcome__in=[o for o, _ in counted])
            .annotate(minute=Trunc("occurred_at", "minute"))
            .values("minute")
            .annotate(ok=Count("id", filter=Q(outcome="success")), n=Count("id"))
            .order_by())
    tally: dict[int, list[int]] = {}
    for row in rows:
        index = int((row["minute"] - start).total_seconds() // 60) // minutes
        if 0 <= index < count:
            ok_n = tally.setdefault(index, [0, 0])
            ok_n[0] += row["ok"]
            ok_n[1] += row["n"]
    return [Bucket(start=start + i * width, ok=tally.get(i, [0, 0])[0],
                   failed=tally.get(i, [0, 0])[1] - tally.get(i, [0, 0])[0])
            for i in range(count)]
