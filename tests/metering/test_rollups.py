"""Rollups equal the events they summarise, however often they run; budgets alert once."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from metering.budgets import budgets_check, month_usage
from metering.ingest import usage_events_store
from metering.models import BudgetAlert, PendingRollup, UsageDaily, UsageEvent, UsageHourly
from metering.rollups import pending_days, rollup_day, rollup_hour, rollup_range, rollup_recent
from tenants.models import Quota
from tests import factories

_ids = itertools.count(1)
HOUR = datetime(2025, 3, 14, 10, tzinfo=UTC)
SUMS = ("requests", "errors", "errors_by_reason", "input_tokens", "output_tokens", "cost",
        "latency_ms_total")


def usage(tenant, at: datetime, *, agent=None, capability=None, outcome: str = "success",
          input_tokens: int = 10, output_tokens: int = 20, cost: str = "0.125",
          latency_ms: int = 40) -> UsageEvent:
    return UsageEvent.objects.create(
        request_id=f"r-{next(_ids)}", tenant=tenant, agent=agent, capability=capability,
        outcome=outcome, input_tokens=input_tokens, output_tokens=output_tokens,
        cost=Decimal(cost), latency_ms=latency_ms, occurred_at=at,
    )


def expected(events) -> dict[tuple, dict]:
    """The totals computed in Python, keyed like the rollup rows."""
    out: dict[tuple, dict] = {}
    for e in events:
        row = out.setdefault((e.tenant_id, e.agent_id, e.capability_id),
                             dict.fromkeys(SUMS, 0) | {"cost": Decimal(0),
                                                       "errors_by_reason": {}})
        row["requests"] += 1
        if e.outcome != "success":
            row["errors"] += 1
            reasons = row["errors_by_reason"]
            reasons[e.outcome] = reasons.get(e.outcome, 0) + 1
        row["input_tokens"] += e.input_tokens
        row["output_tokens"] += e.output_tokens
        row["cost"] += e.cost
        row["latency_ms_total"] += e.latency_ms
    return out


def actual(rows) -> dict[tuple, dict]:
    return {(r.tenant_id, r.agent_id, r.capability_id): {f: getattr(r, f) for f in SUMS}
            for r in rows}


@pytest.fixture
def scene(db):
    """Two tenants, agents and capabilities; events in two hours of one day and the next."""
    a, b = factories.tenant(), factories.tenant()
    agent_a = factories.agent(owner=a)
    cap_a = factories.capability(agent=agent_a)
    agent_b = factories.agent(owner=b)
    first_hour = [
        usage(a, HOUR + timedelta(minutes=1), agent=agent_a, capability=cap_a),
        usage(a, HOUR + timedelta(minutes=59, seconds=59), agent=agent_a, capability=cap_a,
              outcome="upstream_error", input_tokens=7, output_tokens=0, cost="0.000001"),
        usage(a, HOUR + timedelta(minutes=5), outcome="no_capability", input_tokens=0,
              output_tokens=0, cost="0"),  # never reached an agent
        usage(b, HOUR, agent=agent_b, latency_ms=1000),
    ]
    second_hour = [
        usage(a, HOUR + timedelta(hours=1), agent=agent_a, capability=cap_a, cost="1.5"),
        usage(b, HOUR + timedelta(hours=1, minutes=30), agent=agent_b, outcome="rate_limited"),
    ]
    next_day = [usage(a, datetime(2025, 3, 15, 0, 0, tzinfo=UTC), agent=agent_a)]
    return {"tenants": (a, b), "agent_a": agent_a, "first_hour": first_hour,
            "second_hour": second_hour, "next_day": next_day}


def test_hourly_rows_sum_the_hours_events(scene):
    assert rollup_hour(HOUR + timedelta(minutes=17)) == 3  # any moment names its hour

    rows = UsageHourly.objects.filter(hour=HOUR)
    assert actual(rows) == expected(scene["first_hour"])
    assert UsageHourly.objects.count() == 3
    row = rows.get(tenant=scene["tenants"][0], agent=scene["agent_a"])
    assert (row.requests, row.errors, row.cost) == (2, 1, Decimal("0.125001"))

    rollup_hour(HOUR + timedelta(hours=1))
    assert actual(UsageHourly.objects.filter(hour=HOUR + timedelta(hours=1))) == expected(
        scene["second_hour"])


def test_daily_rows_sum_the_days_events(scene):
    assert rollup_day(date(2025, 3, 14)) == 3

    assert actual(UsageDaily.objects.filter(day=date(2025, 3, 14))) == expected(
        scene["first_hour"] + scene["second_hour"])
    rollup_day(date(2025, 3, 15))
    assert actual(UsageDaily.objects.filter(day=date(2025, 3, 15))) == expected(
        scene["next_day"])


def test_rerunning_a_rollup_changes_nothing_and_picks_up_late_events(scene):
    rollup_hour(HOUR)
    rollup_day(HOUR.date())
    before = (actual(UsageHourly.objects.all()), actual(UsageDaily.objects.all()))

    rollup_hour(HOUR)
    rollup_day(HOUR.date())
    assert (actual(UsageHourly.objects.all()), actual(UsageDaily.objects.all())) == before
    assert UsageHourly.objects.count() == 3

    late = usage(scene["tenants"][0], HOUR + timedelta(minutes=30), agent=scene["agent_a"])
    rollup_hour(HOUR)
    assert actual(UsageHourly.objects.filter(hour=HOUR)) == expected(
        [*scene["first_hour"], late])


def test_a_deleted_agent_moves_its_usage_and_leaves_no_stale_row(db, published):
    tenant = factories.tenant()
    agent = factories.agent(owner=tenant)
    capability = factories.capability(agent=agent)
    events = [usage(tenant, HOUR, agent=agent, capability=capability),
              usage(tenant, HOUR + timedelta(minutes=3), agent=agent, capability=capability)]
    rollup_hour(HOUR)
    agent.delete()  # events keep their rows, agent and capability set NULL

    rollup_hour(HOUR)

    for event in events:
        event.refresh_from_db()
    assert actual(UsageHourly.objects.all()) == expected(events)
    assert list(UsageHourly.objects.values_list("agent_id", "capability_id")) == [(None, None)]


def test_deleting_an_agent_whose_usage_merges_into_an_agentless_row(scene, published):
    rollup_hour(HOUR)  # rows (a, agent_a, cap_a) and (a, NULL, NULL) for the hour

    scene["agent_a"].delete()

    rollup_hour(HOUR)
    events = list(UsageEvent.objects.filter(occurred_at__gte=HOUR,
                                            occurred_at__lt=HOUR + timedelta(hours=1)))
    assert actual(UsageHourly.objects.filter(hour=HOUR)) == expected(events)


def test_rollup_recent_covers_this_and_the_previous_hour_and_day(scene):
    now = HOUR + timedelta(hours=1, minutes=10)

    assert rollup_recent(now) == {"hours": 5, "days": 3}

    assert set(UsageHourly.objects.values_list("hour", flat=True)) == {
        HOUR, HOUR + timedelta(hours=1)}
    assert set(UsageDaily.objects.values_list("day", flat=True)) == {HOUR.date()}


def test_the_celery_tasks_are_registered_and_call_the_services(scene):
    from metering import tasks
    from reach_platform.celery import app

    app.loader.import_default_modules()
    assert {"metering.consume_usage", "metering.rollup", "metering.check_alerts",
            "metering.deliver_alerts"} <= set(app.tasks)
    assert tasks.rollup() == {"hours": 0, "days": 0}  # nothing happened "now"
    assert tasks.check_alerts() == {"opened": 0, "resolved": 0}
    assert tasks.deliver_alerts() == {"attempted": 0}


def test_errors_are_counted_per_reason_and_success_never(db):
    tenant = factories.tenant()
    agent = factories.agent(owner=tenant)
    outcomes = ["success", "success", "upstream_error", "upstream_error", "rate_limited",
                "client_cancelled", "internal_error"]
    for minute, outcome in enumerate(outcomes):
        usage(tenant, HOUR + timedelta(minutes=minute), agent=agent, outcome=outcome)
    usage(tenant, HOUR, outcome="no_capability")  # refused before routing: no agent

    rollup_hour(HOUR)
    rollup_day(HOUR.date())

    for model in (UsageHourly, UsageDaily):
        routed = model.objects.get(agent=agent)
        assert (routed.requests, routed.errors) == (7, 5)
        # client_cancelled a reason of its own, no "success". (jsonb keeps no key order:
        # the reports put the reasons in the catalogue's order.)
        assert routed.errors_by_reason == {"client_cancelled": 1, "rate_limited": 1,
                                           "upstream_error": 2, "internal_error": 1}
        unrouted = model.objects.get(agent=None, capability=None)
        assert (unrouted.requests, unrouted.errors, unrouted.errors_by_reason) == (
            1, 1, {"no_capability": 1})
    only_successes = usage(factories.tenant(), HOUR)
    rollup_hour(HOUR)
    assert UsageHourly.objects.get(tenant_id=only_successes.tenant_id).errors_by_reason == {}


def wire(tenant, at: datetime, request_id: str, outcome: str = "success") -> dict:
    """An event as the gateway ships it to the consumer."""
    return {"request_id": request_id, "tenant": tenant.pk, "agent": None, "capability": None,
            "instance": None, "outcome": outcome, "input_tokens": 1, "output_tokens": 2,
            "cost": "0.5", "latency_ms": 3, "occurred_at": at.timestamp()}


def test_the_consumer_marks_periods_pending_and_a_run_rebuilds_them(db):
    tenant = factories.tenant()
    usage(tenant, HOUR)
    rollup_hour(HOUR)
    rollup_day(HOUR.date())
    assert not PendingRollup.objects.exists()

    # Three days later, long after that day's last scheduled rollup, a backlog drains.
    late = HOUR + timedelta(minutes=30)
    assert usage_events_store([wire(tenant, late, "late-1", "upstream_timeout"),
                               wire(tenant, late, "late-2")]) == 2
    assert set(PendingRollup.objects.values_list("kind", "start")) == {
        ("hour", HOUR), ("day", datetime(2025, 3, 14, tzinfo=UTC))}
    assert pending_days(date(2025, 3, 1), date(2025, 3, 31)) == {date(2025, 3, 14)}
    usage_events_store([wire(tenant, late, "late-1")])  # redelivered: nothing new to mark
    assert PendingRollup.objects.count() == 2

    counted = rollup_recent(HOUR + timedelta(days=3))

    assert counted == {"hours": 1, "days": 1}  # the pending ones; now's periods are empty
    assert not PendingRollup.objects.exists()
    for model in (UsageHourly, UsageDaily):
        row = model.objects.get(tenant=tenant)
        assert (row.requests, row.errors, row.errors_by_reason, row.cost) == (
            3, 1, {"upstream_timeout": 1}, Decimal("1.125"))


def test_a_run_rebuilds_at_most_its_share_of_pending_periods_oldest_first(db):
    tenant = factories.tenant()
    for day in (1, 2, 3):
        usage_events_store([wire(tenant, datetime(2025, 3, day, 12, tzinfo=UTC), f"d{day}")])
    later = datetime(2025, 6, 1, tzinfo=UTC)

    assert rollup_recent(later, pending_limit=2) == {"hours": 2, "days": 2}
    assert set(UsageDaily.objects.values_list("day", flat=True)) == {
        date(2025, 3, 1), date(2025, 3, 2)}
    assert pending_days(date(2025, 3, 1), date(2025, 3, 31)) == {date(2025, 3, 3)}
    rollup_recent(later, pending_limit=2)
    assert not PendingRollup.objects.exists()


def test_rollup_range_rebuilds_every_hour_and_day_of_a_period(scene):
    assert rollup_range(date(2025, 3, 14), date(2025, 3, 15)) == {"hours": 6, "days": 4}
    assert actual(UsageDaily.objects.filter(day=date(2025, 3, 14))) == expected(
        scene["first_hour"] + scene["second_hour"])
    assert rollup_range(date(2025, 3, 14), date(2025, 3, 15)) == {"hours": 6, "days": 4}


def test_the_migration_marks_every_period_with_events_pending(scene):
    import importlib

    from django.apps import apps

    migration = importlib.import_module(
        "metering.migrations.0007_rollups_count_errors_by_reason")
    migration.mark_every_period_with_events(apps, None)

    assert set(PendingRollup.objects.values_list("kind", "start")) == {
        ("hour", HOUR), ("hour", HOUR + timedelta(hours=1)),
        ("hour", datetime(2025, 3, 15, tzinfo=UTC)),
        ("day", datetime(2025, 3, 14, tzinfo=UTC)), ("day", datetime(2025, 3, 15, tzinfo=UTC)),
    }
    rollup_recent(datetime(2025, 6, 1, tzinfo=UTC))
    assert not PendingRollup.objects.exists()
    assert actual(UsageDaily.objects.filter(day=date(2025, 3, 14))) == expected(
        scene["first_hour"] + scene["second_hour"])


# ---- budgets ---------------------------------------------------------------------------

NOW = datetime(2025, 3, 20, 12, tzinfo=UTC)


def test_month_usage_counts_this_calendar_month_only(db):
    tenant = factories.tenant()
    agent = factories.agent(owner=tenant)
    usage(tenant, datetime(2025, 3, 1, tzinfo=UTC), agent=agent, cost="2.5")
    usage(tenant, datetime(2025, 3, 31, 23, 59, tzinfo=UTC), input_tokens=1, output_tokens=2)
    usage(tenant, datetime(2025, 2, 28, 23, 59, tzinfo=UTC))  # last month
    usage(tenant, datetime(2025, 4, 1, tzinfo=UTC))  # next month
    usage(factories.tenant(), NOW)  # someone else

    assert month_usage(tenant.pk, now=NOW) == {
        "requests": 2, "tokens": 33, "cost": Decimal("2.625")}
    assert month_usage(tenant.pk, agent.pk, now=NOW) == {
        "requests": 1, "tokens": 30, "cost": Decimal("2.5")}
    assert month_usage(factories.tenant().pk, now=NOW) == {
        "requests": 0, "tokens": 0, "cost": Decimal(0)}
    # A call its gateway died with counts as a request (the agent may have run it, and
    # the gateways' own counters charge a lapsed reservation); a failure does not.
    usage(tenant, NOW, outcome="worker_lost", input_tokens=0, output_tokens=0, cost="0")
    usage(tenant, NOW, outcome="upstream_error", input_tokens=0, output_tokens=0, cost="0")
    assert month_usage(tenant.pk, now=NOW)["requests"] == 3


def test_a_budget_alerts_once_at_80_percent(db):
    tenant = factories.tenant()
    quota = Quota.objects.create(tenant=tenant, monthly_requests=10)
    for _ in range(7):
        usage(tenant, NOW)

    assert budgets_check(now=NOW) == []  # 70 %

    usage(tenant, NOW)
    created = budgets_check(now=NOW)  # 80 %
    assert [(a.quota_id, a.metric, a.used, a.budget, a.month) for a in created] == [
        (quota.pk, "requests", Decimal(8), Decimal(10), date(2025, 3, 1))]
    assert created[0].tenant_id == tenant.pk and created[0].threshold == Decimal("0.80")

    usage(tenant, NOW)
    assert budgets_check(now=NOW) == []  # 90 %: already alerted this month
    assert BudgetAlert.objects.count() == 1

    # A new month is a new budget.
    april = datetime(2025, 4, 2, tzinfo=UTC)
    for _ in range(8):
        usage(tenant, april)
    assert [a.month for a in budgets_check(now=april)] == [date(2025, 4, 1)]


def test_tokens_and_cost_budgets_and_agent_scoped_quotas(db):
    tenant = factories.tenant()
    agent, other = factories.agent(owner=tenant), factories.agent(owner=tenant)
    tokens = Quota.objects.create(tenant=tenant, monthly_tokens=100)
    cost = Quota.objects.create(tenant=tenant, agent=agent, monthly_cost=Decimal("10"),
                                monthly_requests=1000)
    usage(tenant, NOW, agent=other, input_tokens=50, output_tokens=30, cost="9")  # 80 tokens
    usage(tenant, NOW, agent=agent, input_tokens=0, output_tokens=0, cost="7.99")

    created = budgets_check(now=NOW)

    # The agent-scoped cost budget counts only its agent's 7.99 of 10: under 80 %.
    assert [(a.quota_id, a.metric) for a in created] == [(tokens.pk, "tokens")]
    usage(tenant, NOW, agent=agent, input_tokens=0, output_tokens=0, cost="0.01")
    assert [(a.quota_id, a.metric, a.used) for a in budgets_check(now=NOW)] == [
        (cost.pk, "cost", Decimal("8.00"))]
    assert budgets_check(now=NOW) == []
