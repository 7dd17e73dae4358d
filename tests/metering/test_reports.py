"""Usage and cost reports: the selectors' sums, the REST report / CSV / allocation
endpoints, and the admin report page, always scoped to the caller's tenants."""

from __future__ import annotations

import csv
import datetime as dt
import io
import itertools
import re
from dataclasses import dataclass
from decimal import Decimal
from html import unescape

import pytest
from django.urls import reverse
from django.utils import timezone

from metering import selectors
from metering.models import BudgetAlert, PendingRollup, UsageDaily, UsageEvent
from metering.reports import REASON_COLUMNS
from metering.rollups import pending_mark, rollup_day
from tests import factories
from tests.conftest import key_client

D = Decimal
START = dt.date(2025, 3, 1)
END = dt.date(2025, 3, 3)
PERIOD = {"start": "2025-03-01", "end": "2025-03-03"}
_ids = itertools.count(1)


def at(day: int, hour: int = 12, minute: int = 0, second: int = 0) -> dt.datetime:
    return dt.datetime(2025, 3, day, hour, minute, second, tzinfo=dt.UTC)


def event(tenant, agent, capability, when: dt.datetime, *, cost: str = "0", tokens=(0, 0),
          latency: int = 0, outcome: str = "success") -> UsageEvent:
    return UsageEvent.objects.create(
        request_id=f"req-{next(_ids)}", tenant=tenant, agent=agent, capability=capability,
        outcome=outcome, input_tokens=tokens[0], output_tokens=tokens[1], cost=D(cost),
        latency_ms=latency, occurred_at=when,
    )


# Every day events are made on, the period's neighbours included.
DAYS = [dt.date(2025, 2, 28) + dt.timedelta(days=n) for n in range(5)]


def settle(how: str) -> None:
    """Put the days where the reports read them: their rollup rows ("rollups"), their
    events (every day pending: "events"), or both ("mixed": rolled up, then March 2
    pending, its rollup rows falsified to prove the report reads its events instead)."""
    if how in ("rollups", "mixed"):
        for day in DAYS:
            rollup_day(day)
    if how == "events":
        pending_mark(at(1) + dt.timedelta(days=n) for n in range(-1, 4))
    if how == "mixed":
        UsageDaily.objects.filter(day=dt.date(2025, 3, 2)).update(
            requests=999, errors=999, cost=D(999), errors_by_reason={"overloaded": 999})
        pending_mark([at(2)])


@pytest.fixture(params=["rollups", "events", "mixed"])
def stored_as(request) -> str:
    return request.param


@dataclass
class Usage:
    world: object
    writer: object  # tenant A's second agent


@pytest.fixture
def usage(world, stored_as) -> Usage:
    a, b = world.tenant_a, world.tenant_b
    translate = factories.capability(agent=world.agent_a, capability_id="translate.text")
    detect = factories.capability(agent=world.agent_a, capability_id="translate.detect")
    writer = factories.agent(owner=a, name="alpha-writer")
    draft = factories.capability(agent=writer, capability_id="write.draft")
    summarise = factories.capability(agent=world.agent_b, capability_id="summarise.text")

    # Tenant A: 7 events in the period.
    event(a, world.agent_a, translate, at(1, 0, 0, 0), cost="0.100000", tokens=(10, 20),
          latency=100)
    event(a, world.agent_a, translate, at(1, 9), cost="0.200000", tokens=(5, 5), latency=200)
    event(a, world.agent_a, detect, at(1, 10), outcome="upstream_error", latency=50)
    event(a, world.agent_a, translate, at(2), cost="0.333333", tokens=(7, 3), latency=90)
    event(a, None, None, at(2, 13), cost="0.050000", tokens=(1, 1), latency=10)  # agent gone
    event(a, writer, draft, at(3), cost="1.000001", tokens=(100, 400), latency=1000)
    event(a, writer, draft, at(3, 23, 59, 59), cost="0.000002", outcome="upstream_timeout",
          latency=3000)
    # Just outside the period on either side: never counted.
    event(a, world.agent_a, translate, at(1) - dt.timedelta(days=1), cost="50")
    event(a, world.agent_a, translate, at(3, 0) + dt.timedelta(days=1), cost="50")

    # Tenant B: 4 events, much larger numbers so a leak would show.
    for hour in (1, 2, 3):
        event(b, world.agent_b, summarise, at(1, hour), cost="9.500000", tokens=(900, 900),
              latency=700)
    event(b, world.agent_b, summarise, at(2), cost="20.000000", tokens=(5000, 5000),
          latency=900, outcome="rate_limited")
    settle(stored_as)
    return Usage(world=world, writer=writer)


A_TOTALS = {
    "requests": 7, "errors": 2, "errors_by_reason": {"upstream_timeout": 1, "upstream_error": 1},
    "input_tokens": 123, "output_tokens": 429,
    "cost": D("1.683336"), "latency_ms_avg": round(4450 / 7, 1),
}


def report(tenant_ids, group_by, start=START, end=END) -> list[dict]:
    return selectors.usage_report(tenant_ids=tenant_ids, start=start, end=end, group_by=group_by)


# ---- selectors -------------------------------------------------------------------------


@pytest.mark.django_db
def test_report_sums_per_agent_capability_and_day(usage):
    rows = report([usage.world.tenant_a.pk], ["agent", "capability", "day"])
    summary = [(r["agent"], r["capability"], r["day"], r["requests"], r["errors"],
                r["input_tokens"], r["output_tokens"], r["cost"], r["latency_ms_avg"])
               for r in rows]
    assert summary == [
        ("(no agent)", "(no capability)", "2025-03-02", 1, 0, 1, 1, D("0.050000"), 10.0),
        ("alpha-translator", "translate.detect", "2025-03-01", 1, 1, 0, 0, D("0"), 50.0),
        ("alpha-translator", "translate.text", "2025-03-01", 2, 0, 15, 25, D("0.3"), 150.0),
        ("alpha-translator", "translate.text", "2025-03-02", 1, 0, 7, 3, D("0.333333"), 90.0),
        ("alpha-writer", "write.draft", "2025-03-03", 2, 1, 100, 400, D("1.000003"), 2000.0),
    ]
    assert all(r["cost"].as_tuple().exponent == -6 for r in rows)
    totals = selectors.usage_totals(tenant_ids=[usage.world.tenant_a.pk], start=START, end=END)
    assert totals == A_TOTALS


@pytest.mark.django_db
@pytest.mark.parametrize("group_by", [
    ["tenant"], ["day"], ["capability"], ["agent"], ["day", "agent"],
    ["tenant", "agent", "capability", "day"], [],
])
def test_every_grouping_adds_up_to_the_totals(usage, group_by):
    rows = report(None, group_by)
    totals = selectors.usage_totals(tenant_ids=None, start=START, end=END)
    assert totals["requests"] == 11
    for metric in ("requests", "errors", "input_tokens", "output_tokens", "cost"):
        assert sum(r[metric] for r in rows) == totals[metric], metric
    for row in rows:
        assert list(row)[: len(group_by)] == group_by


@pytest.mark.django_db
def test_group_by_tenant_and_day(usage):
    rows = report(None, ["tenant", "day"])
    assert [(r["tenant"], r["day"], r["requests"], r["cost"]) for r in rows] == [
        ("alpha", "2025-03-01", 3, D("0.3")),
        ("alpha", "2025-03-02", 2, D("0.383333")),
        ("alpha", "2025-03-03", 2, D("1.000003")),
        ("beta", "2025-03-01", 3, D("28.5")),
        ("beta", "2025-03-02", 1, D("20")),
    ]
    # A capability id is one group across agents and days.
    by_capability = {r["capability"]: r["requests"] for r in report(None, ["capability"])}
    assert by_capability == {"(no capability)": 1, "summarise.text": 4, "translate.detect": 1,
                             "translate.text": 3, "write.draft": 2}


@pytest.mark.django_db
def test_period_is_whole_utc_days_and_unknown_keys_are_refused(usage):
    one_day = report([usage.world.tenant_a.pk], ["day"], start=END, end=END)
    assert [(r["day"], r["requests"]) for r in one_day] == [("2025-03-03", 2)]
    assert report([usage.world.tenant_a.pk], ["day"], start=dt.date(2025, 2, 28),
                  end=dt.date(2025, 2, 28))[0]["cost"] == D("50")
    assert report([], ["day"]) == []
    with pytest.raises(ValueError, match="colour"):
        report(None, ["colour"])


@pytest.mark.django_db
def test_allocation_costs_and_shares_add_up_exactly(usage):
    rows = selectors.cost_allocation(start=START, end=END, tenant_ids=None)
    assert [r["tenant"] for r in rows] == ["beta", "alpha"]
    total = D("48.5") + A_TOTALS["cost"]
    assert sum(r["cost"] for r in rows) == total
    assert sum(r["share"] for r in rows) == D(1)
    assert rows[1]["share"] == (A_TOTALS["cost"] / total).quantize(D("0.000001"))


@pytest.mark.django_db
def test_allocation_remainder_goes_to_the_largest_share(world, stored_as):
    third = factories.tenant(slug="gamma")
    for tenant, cost in ((world.tenant_a, "1"), (world.tenant_b, "1"), (third, "1.000001")):
        event(tenant, None, None, at(2), cost=cost)
    settle(stored_as)
    rows = selectors.cost_allocation(start=START, end=END, tenant_ids=None)
    # 1/3 each rounds to 0.333333 three times: the missing millionth goes to gamma.
    assert [(r["tenant"], r["share"]) for r in rows] == [
        ("gamma", D("0.333334")), ("alpha", D("0.333333")), ("beta", D("0.333333")),
    ]
    assert sum(r["share"] for r in rows) == 1
    assert sum(r["cost"] for r in rows) == D("3.000001")


@pytest.mark.django_db
def test_allocation_without_cost_has_zero_shares(world, stored_as):
    event(world.tenant_a, None, None, at(2))
    settle(stored_as)
    rows = selectors.cost_allocation(start=START, end=END, tenant_ids=None)
    assert [(r["tenant"], r["cost"], r["share"]) for r in rows] == [("alpha", 0, 0)]
    assert selectors.cost_allocation(start=START, end=END, tenant_ids=[]) == []


# ---- REST ------------------------------------------------------------------------------


def alpha_key(world):
    return key_client(factories.api_key(tenant=world.tenant_a).plaintext)


@pytest.fixture(params=["key", "staff"])
def alpha_client(request, world, api):
    """Tenant A's API key, or A's viewer logged in: both read only tenant A."""
    if request.param == "key":
        return alpha_key(world)
    api.force_login(world.member)
    return api


def rest_report(client, **params):
    response = client.get("/api/v1/usage/report/", {**PERIOD, **params})
    assert response.status_code == 200, response.content
    return response.json()


@pytest.mark.django_db
def test_rest_report_matches_the_selector(usage, alpha_client):
    body = rest_report(alpha_client)
    assert body["start"] == "2025-03-01" and body["end"] == "2025-03-03"
    assert body["group_by"] == ["agent", "capability", "day"]
    assert len(body["rows"]) == 5
    first = body["rows"][2]
    assert first == {
        "agent": "alpha-translator", "capability": "translate.text", "day": "2025-03-01",
        "requests": 2, "errors": 0, "errors_by_reason": {}, "input_tokens": 15,
        "output_tokens": 25, "cost": "0.300000", "latency_ms_avg": 150.0,
    }
    assert body["totals"] == {**A_TOTALS, "cost": "1.683336"}


@pytest.mark.django_db
def test_tenant_a_never_sees_tenant_b(usage, alpha_client):
    body = rest_report(alpha_client, group_by="tenant,agent,capability")
    assert {row["tenant"] for row in body["rows"]} == {"alpha"}
    assert "beta" not in str(body) and "summarise" not in str(body)
    assert body["totals"]["cost"] == "1.683336"
    csv_text = alpha_client.get("/api/v1/usage/report.csv",
                                {**PERIOD, "group_by": "tenant"}).content.decode()
    assert "beta" not in csv_text and "alpha" in csv_text
    allocation = alpha_client.get("/api/v1/usage/allocation/", PERIOD).json()
    assert allocation["tenants"] == [
        {"tenant": "alpha", "requests": 7, "cost": "1.683336", "share": "1.000000"}
    ]
    assert allocation["total_cost"] == "1.683336"


@pytest.mark.django_db
def test_another_tenant_by_name_is_not_found(usage, alpha_client):
    for url in ("/api/v1/usage/report/", "/api/v1/usage/report.csv",
                "/api/v1/usage/allocation/"):
        for slug in ("beta", "no-such-tenant"):
            response = alpha_client.get(url, {**PERIOD, "tenant": slug})
            assert response.status_code == 404, (url, slug)
            assert response["Content-Type"].startswith("application/json")
            assert response.json()["error"]["code"] == "not_found"
    own = rest_report(alpha_client, tenant="alpha", group_by="tenant")
    assert [row["tenant"] for row in own["rows"]] == ["alpha"]


@pytest.mark.django_db
def test_a_report_parameter_given_twice_is_refused_not_last_one_wins(usage, alpha_client):
    for url in ("/api/v1/usage/report/", "/api/v1/usage/report.csv",
                "/api/v1/usage/allocation/"):
        response = alpha_client.get(url, {**PERIOD, "tenant": ["alpha", "beta"]})
        assert response.status_code == 400, url
        assert response.json()["error"]["details"] == {"tenant": ["give it once"]}
    # Nor is a parameter a report does not know ignored (a time zone it would not apply,
    # a misspelt filter): a break test got the whole report for "tz=Europe/Paris".
    for url in ("/api/v1/usage/report/", "/api/v1/usage/report.csv",
                "/api/v1/usage/allocation/", "/api/v1/usage/tools/"):
        response = alpha_client.get(url, {**PERIOD, "tz": "Europe/Paris", "tenat": "beta"})
        assert response.status_code == 400, url
        assert set(response.json()["error"]["details"]) == {"tz", "tenat"}, url
    # The daily list has no filters: one given is refused, not ignored (?tenant=beta had
    # answered the caller's own rows).
    daily = alpha_client.get("/api/v1/usage/daily/", {"tenant": "beta"})
    assert daily.status_code == 400
    assert set(daily.json()["error"]["details"]) == {"tenant"}
    assert alpha_client.get("/api/v1/usage/daily/", {"limit": "5"}).status_code == 200


@pytest.mark.django_db
def test_superuser_reads_every_tenant_and_can_narrow_to_one(usage, api):
    api.force_login(usage.world.superuser)
    body = rest_report(api, group_by="tenant")
    assert [(r["tenant"], r["requests"], r["cost"]) for r in body["rows"]] == [
        ("alpha", 7, "1.683336"), ("beta", 4, "48.500000"),
    ]
    beta = rest_report(api, group_by="agent", tenant="beta")
    assert [(r["agent"], r["errors"]) for r in beta["rows"]] == [("beta-summariser", 1)]
    allocation = api.get("/api/v1/usage/allocation/", PERIOD).json()
    assert allocation["total_cost"] == "50.183336"
    shares = [D(row["share"]) for row in allocation["tenants"]]
    assert sum(shares) == 1
    assert sum(D(row["cost"]) for row in allocation["tenants"]) == D("50.183336")


def parse_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.django_db
@pytest.mark.parametrize("group_by", ["agent,capability,day", "day,tenant", "capability"])
def test_csv_has_the_json_rows_and_numbers(usage, api, group_by):
    api.force_login(usage.world.superuser)
    body = rest_report(api, group_by=group_by)
    response = api.get("/api/v1/usage/report.csv", {**PERIOD, "group_by": group_by})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    text = response.content.decode()
    header = text.splitlines()[0].split(",")
    keys = group_by.split(",")
    assert header == [*keys, "requests", "errors", "input_tokens", "output_tokens", "cost",
                      "latency_ms_avg", *REASON_COLUMNS]
    expected = [
        {column: str(row[column] if column in row
                     else row["errors_by_reason"].get(column.removeprefix("errors_"), 0))
         for column in header}
        for row in body["rows"]
    ]
    assert parse_csv(text) == expected
    assert sum(D(row["cost"]) for row in parse_csv(text)) == D(body["totals"]["cost"])


@pytest.mark.django_db
def test_csv_honours_accept_text_csv(usage, world):
    client = alpha_key(world)
    response = client.get("/api/v1/usage/report.csv", PERIOD, HTTP_ACCEPT="text/csv")
    assert response.status_code == 200
    assert len(parse_csv(response.content.decode())) == 5


@pytest.mark.django_db
def test_defaults_are_month_to_date(world):
    today = timezone.now().astimezone(dt.UTC).date()
    event(world.tenant_a, world.agent_a, None, timezone.now(), cost="0.25")
    body = alpha_key(world).get("/api/v1/usage/report/").json()
    assert body["start"] == today.replace(day=1).isoformat()
    assert body["end"] == today.isoformat()
    assert body["group_by"] == ["agent", "capability", "day"]
    assert body["totals"]["cost"] == "0.250000"


@pytest.mark.django_db
@pytest.mark.parametrize(("params", "field"), [
    ({"start": "2025-13-01"}, "start"),
    ({"end": "yesterday"}, "end"),
    ({"start": "2025-03-05", "end": "2025-03-01"}, "start"),
    ({"start": "2024-01-01", "end": "2025-01-01"}, "end"),  # 367 days
    ({"group_by": "agent,colour"}, "group_by"),
    ({"group_by": ""}, "group_by"),
    ({"tenant": "not a slug!"}, "tenant"),
])
def test_bad_query_parameters_are_structured_400s(world, params, field):
    client = alpha_key(world)
    for url in ("/api/v1/usage/report/", "/api/v1/usage/report.csv"):
        response = client.get(url, params)
        assert response.status_code == 400, (url, response.content)
        assert response["Content-Type"].startswith("application/json")
        error = response.json()["error"]
        assert error["code"] == "invalid_input"
        assert field in error["details"], error
        assert error["request_id"]


@pytest.mark.django_db
def test_a_full_leap_year_is_allowed(world):
    response = alpha_key(world).get(
        "/api/v1/usage/report/", {"start": "2024-01-01", "end": "2024-12-31"}
    )
    assert response.status_code == 200


@pytest.mark.django_db
def test_reports_need_a_readable_tenant(world, api):
    assert api.get("/api/v1/usage/report/").status_code == 401
    invoke_only = factories.api_key(tenant=world.tenant_a, scopes=["invoke"])
    response = key_client(invoke_only.plaintext).get("/api/v1/usage/allocation/")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


# ---- admin -----------------------------------------------------------------------------

REPORT_URL = "/admin/metering/usagedaily/report/"


def page(client, **params):
    response = client.get(REPORT_URL, params)
    assert response.status_code == 200
    return response, response.content.decode()


@pytest.mark.django_db
def test_admin_report_for_tenant_staff_shows_only_their_tenant(usage, client):
    assert reverse("admin:metering_usagedaily_report") == REPORT_URL
    client.force_login(usage.world.owner)
    response, html = page(client, **PERIOD)
    # The chart is inline SVG; nothing is loaded from elsewhere.
    assert '<svg class="reach-chart"' in html and html.count('<rect class="bar"') == 3
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "alpha-translator" in html and "alpha-writer" in html
    for leak in ("beta", "summarise", "48.5", "9.5"):
        assert leak not in html, leak
    report_ctx = response.context["report"]
    assert report_ctx["totals"] == A_TOTALS
    assert len(report_ctx["chart"].bars) == 3
    assert [r["tenant"] for r in report_ctx["allocation"]] == ["alpha"]
    # The tenant filter offers only the user's tenants.
    options = re.findall(r'<option value="([^"]*)"', html)
    assert options == ["", "alpha"]

    csv_url = unescape(re.search(r'href="([^"]*report\.csv[^"]*)"', html).group(1))
    exported = client.get(csv_url)
    assert exported.status_code == 200
    rows = parse_csv(exported.content.decode())
    assert len(rows) == len(report_ctx["rows"]) == 5
    assert {row["agent"] for row in rows} == {"(no agent)", "alpha-translator", "alpha-writer"}
    assert sum(D(row["cost"]) for row in rows) == A_TOTALS["cost"]


@pytest.mark.django_db
def test_admin_report_refuses_another_tenant_in_the_filter(usage, client):
    client.force_login(usage.world.owner)
    response, html = page(client, **PERIOD, tenant="beta")
    assert response.context["report"] is None
    assert "errorlist" in html and "summarise" not in html


@pytest.mark.django_db
def test_admin_report_rejects_bad_periods(usage, client):
    client.force_login(usage.world.owner)
    response, html = page(client, start="2025-03-05", end="2025-03-01")
    assert response.context["report"] is None
    assert "Must be on or before end." in html


@pytest.mark.django_db
def test_admin_report_defaults_to_month_to_date(world, client):
    event(world.tenant_a, world.agent_a, None, timezone.now(), cost="0.25")
    client.force_login(world.member)
    response, _ = page(client)
    today = timezone.now().astimezone(dt.UTC).date()
    assert response.context["report"]["start"] == today.replace(day=1)
    assert response.context["report"]["totals"]["cost"] == D("0.25")


@pytest.mark.django_db
def test_superuser_sees_both_tenants_in_the_admin_report(usage, client):
    client.force_login(usage.world.superuser)
    response, html = page(client, **PERIOD)
    assert "alpha-translator" in html and "beta-summariser" in html
    assert response.context["report"]["group_by"][0] == "tenant"
    allocation = response.context["report"]["allocation"]
    assert sum(row["share"] for row in allocation) == 1
    narrowed, html = page(client, **PERIOD, tenant="beta")
    assert "alpha-translator" not in html
    assert narrowed.context["report"]["totals"]["cost"] == D("48.5")


@pytest.mark.django_db
def test_admin_report_needs_staff_with_a_tenant(world, client, django_user_model):
    assert client.get(REPORT_URL).status_code == 302  # anonymous: to the login page
    lonely = factories.staff_user(username="lonely")  # staff, but member of no tenant
    client.force_login(lonely)
    assert client.get(REPORT_URL).status_code == 403
    customer = django_user_model.objects.create_user("customer", password="pw")
    client.force_login(customer)
    response = client.get(REPORT_URL)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.django_db
def test_changelist_links_to_the_report(world, client):
    client.force_login(world.owner)
    html = client.get(reverse("admin:metering_usagedaily_changelist")).content.decode()
    assert f'href="{REPORT_URL}"' in html
    assert "beta" not in html  # the tenant filter lists only the user's tenants


@pytest.mark.django_db
def test_budget_alerts_are_listed_read_only_per_tenant(world, client):
    month = dt.date(2025, 3, 1)
    mine = BudgetAlert.objects.create(tenant=world.tenant_a, month=month, metric="cost",
                                      used=D("80.5"), budget=D("100"))
    theirs = BudgetAlert.objects.create(tenant=world.tenant_b, month=month, metric="requests",
                                        used=D("9000"), budget=D("10000"))
    client.force_login(world.owner)
    listing = client.get(reverse("admin:metering_budgetalert_changelist"))
    assert listing.status_code == 200
    html = listing.content.decode()
    assert "80.5 / 100 (80%)" in html and "2025-03" in html
    assert "9000" not in html
    assert client.get(reverse("admin:metering_budgetalert_change", args=[theirs.pk])
                      ).status_code == 403
    assert client.get(reverse("admin:metering_budgetalert_change", args=[mine.pk])
                      ).status_code == 200
    assert client.get(reverse("admin:metering_budgetalert_add")).status_code == 403


def test_the_usage_root_lists_the_callers_events(world):
    from django.utils import timezone

    from metering.models import UsageEvent
    from tests.conftest import key_client

    UsageEvent.objects.create(request_id="root-a", tenant=world.tenant_a, outcome="success",
                              occurred_at=timezone.now())
    UsageEvent.objects.create(request_id="root-b", tenant=world.tenant_b, outcome="success",
                              occurred_at=timezone.now())
    body = key_client(factories.api_key(tenant=world.tenant_a).plaintext).get(
        "/api/v1/usage/").json()
    assert [e["request_id"] for e in body["results"]] == ["root-a"]


def test_usage_events_filter_by_outcome_capability_agent_time_and_tenant(world):
    """Finance narrows the events list; a filter that does not exist is a 400 naming it
    (silently ignored, ``?outcome=success`` read as applied while listing every call)."""
    from django.utils import timezone

    from metering.models import UsageEvent
    from tests.conftest import key_client

    now = timezone.now()
    translate = factories.capability(agent=world.agent_a, capability_id="translate.text")
    rows = [("f-ok", "success", translate, now), ("f-old", "success", translate,
                                                  now - dt.timedelta(days=2)),
            ("f-cut", "client_cancelled", None, now)]
    for request_id, outcome, capability, when in rows:
        UsageEvent.objects.create(request_id=request_id, tenant=world.tenant_a, outcome=outcome,
                                  agent=world.agent_a if capability else None,
                                  capability=capability, occurred_at=when)
    UsageEvent.objects.create(request_id="f-theirs", tenant=world.tenant_b, outcome="success",
                              occurred_at=now)
    UsageEvent.objects.create(request_id="r.dot:1", tenant=world.tenant_a, outcome="upstream_error",
                              occurred_at=now - dt.timedelta(days=3))
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)

    def listed(**params) -> list[str]:
        reply = client.get("/api/v1/usage/", params)
        assert reply.status_code == 200, reply.content
        return sorted(e["request_id"] for e in reply.json()["results"])

    assert listed(outcome="success") == ["f-ok", "f-old"]
    assert listed(capability="translate.text", agent="alpha-translator") == ["f-ok", "f-old"]
    assert listed(since=(now - dt.timedelta(days=1)).isoformat()) == ["f-cut", "f-ok"]
    assert listed(until=(now - dt.timedelta(days=1)).isoformat(), limit=5) == [
        "f-old", "r.dot:1"]
    assert listed(tenant="alpha", outcome="client_cancelled") == ["f-cut"]
    for bad, field in (({"outcom": "success"}, "outcom"), ({"outcome": "fine"}, "outcome"),
                       ({"since": "yesterday"}, "since"),
                       ({"outcome": ["success", "client_cancelled"]}, "outcome")):
        refused = client.get("/api/v1/usage/events/", bad)
        assert refused.status_code == 400, refused.content
        assert field in refused.json()["error"]["details"]
    assert client.get("/api/v1/usage/", {"tenant": "beta"}).status_code == 404
    # Any request id the gateway accepts is found by it, dots included.
    assert client.get("/api/v1/usage/events/r.dot:1/").json()["request_id"] == "r.dot:1"


# ---- errors by reason ------------------------------------------------------------------


@pytest.fixture
def failures(world, stored_as):
    """Successes and failures of many kinds; calls refused before routing carry no agent
    and no capability, a rate limit decided on the agent carries the agent only."""
    a, b = world.tenant_a, world.tenant_b
    translate = factories.capability(agent=world.agent_a, capability_id="translate.text")
    writer = factories.agent(owner=a, name="alpha-writer")
    draft = factories.capability(agent=writer, capability_id="write.draft")
    summarise = factories.capability(agent=world.agent_b, capability_id="summarise.text")
    for hour in (1, 2):
        event(a, world.agent_a, translate, at(1, hour), cost="0.100000", tokens=(10, 20),
              latency=100)
    for minute in range(3):
        event(a, world.agent_a, translate, at(1, 5, minute), tokens=(5, 0), latency=30,
              outcome="upstream_error")
    event(a, world.agent_a, translate, at(2, 1), cost="0.000001", tokens=(5, 0),
          latency=2000, outcome="upstream_timeout")
    for minute in range(2):
        event(a, world.agent_a, translate, at(2, 2, minute), outcome="rate_limited")
    event(a, world.agent_a, None, at(3, 1), outcome="rate_limited")
    event(a, world.agent_a, translate, at(3, 2), cost="0.050000", tokens=(3, 1), latency=40,
          outcome="client_cancelled")
    for minute in range(2):
        event(a, None, None, at(1, 6, minute), outcome="no_capability")
    event(a, None, None, at(2, 6), outcome="invalid_input")
    event(a, writer, draft, at(3, 3), cost="1.000000", tokens=(100, 400), latency=900)
    # Tenant B: failures A must never see.
    for minute in range(5):
        event(b, None, None, at(1, 7, minute), outcome="internal_error")
    for minute in range(4):
        event(b, world.agent_b, summarise, at(2, 7, minute), cost="3.000000",
              tokens=(50, 50), outcome="upstream_error")
    event(b, world.agent_b, summarise, at(2, 8), cost="2.000000", tokens=(9, 9))
    settle(stored_as)
    return world


A_REASONS = {"client_cancelled": 1, "invalid_input": 1, "no_capability": 2,
             "rate_limited": 3, "upstream_timeout": 1, "upstream_error": 3}
A_FAILURE_TOTALS = {
    "requests": 14, "errors": 11, "errors_by_reason": A_REASONS, "input_tokens": 143,
    "output_tokens": 441, "cost": D("1.250001"),
    "latency_ms_avg": round((200 + 90 + 2000 + 40 + 900) / 14, 1),
}


@pytest.mark.django_db
def test_errors_by_reason_per_agent_and_capability(failures):
    a = [failures.tenant_a.pk]
    rows = report(a, ["agent", "capability"])
    assert [(r["agent"], r["capability"], r["requests"], r["errors"], r["errors_by_reason"])
            for r in rows] == [
        ("(no agent)", "(no capability)", 3, 3, {"invalid_input": 1, "no_capability": 2}),
        ("alpha-translator", "(no capability)", 1, 1, {"rate_limited": 1}),
        ("alpha-translator", "translate.text", 9, 7, {
            "client_cancelled": 1, "rate_limited": 2, "upstream_timeout": 1,
            "upstream_error": 3}),
        ("alpha-writer", "write.draft", 1, 0, {}),
    ]
    # The reasons come in the catalogue's order; success is never one of them.
    assert list(rows[2]["errors_by_reason"]) == [
        "client_cancelled", "rate_limited", "upstream_timeout", "upstream_error"]
    for row in rows:
        assert sum(row["errors_by_reason"].values()) == row["errors"]
        assert "success" not in row["errors_by_reason"]
    totals = selectors.usage_totals(tenant_ids=a, start=START, end=END)
    assert totals == A_FAILURE_TOTALS
    assert list(totals["errors_by_reason"]) == [
        "client_cancelled", "invalid_input", "no_capability", "rate_limited",
        "upstream_timeout", "upstream_error"]


@pytest.mark.django_db
def test_errors_by_reason_per_tenant_and_day(failures):
    rows = report(None, ["tenant", "day"])
    assert [(r["tenant"], r["day"], r["requests"], r["errors_by_reason"]) for r in rows] == [
        ("alpha", "2025-03-01", 7, {"no_capability": 2, "upstream_error": 3}),
        ("alpha", "2025-03-02", 4, {"invalid_input": 1, "rate_limited": 2,
                                    "upstream_timeout": 1}),
        ("alpha", "2025-03-03", 3, {"client_cancelled": 1, "rate_limited": 1}),
        ("beta", "2025-03-01", 5, {"internal_error": 5}),
        ("beta", "2025-03-02", 5, {"upstream_error": 4}),
    ]
    # Every grouping splits the same totals.
    totals = selectors.usage_totals(tenant_ids=None, start=START, end=END)
    for group_by in (["tenant"], ["agent"], ["capability"], ["day"], ["agent", "day"]):
        merged: dict[str, int] = {}
        for row in report(None, group_by):
            for reason, count in row["errors_by_reason"].items():
                merged[reason] = merged.get(reason, 0) + count
        assert merged == totals["errors_by_reason"], group_by
    assert totals["errors"] == 20 and totals["cost"] == D("15.250001")


@pytest.mark.django_db
def test_rest_report_has_errors_by_reason_and_stays_in_the_callers_tenant(failures,
                                                                          alpha_client):
    body = rest_report(alpha_client, group_by="tenant,agent")
    assert [(r["tenant"], r["agent"], r["errors"], r["errors_by_reason"])
            for r in body["rows"]] == [
        ("alpha", "(no agent)", 3, {"invalid_input": 1, "no_capability": 2}),
        ("alpha", "alpha-translator", 8, {"client_cancelled": 1, "rate_limited": 3,
                                          "upstream_timeout": 1, "upstream_error": 3}),
        ("alpha", "alpha-writer", 0, {}),
    ]
    assert body["totals"] == {**A_FAILURE_TOTALS, "cost": "1.250001"}
    assert "internal_error" not in str(body) and "beta" not in str(body)
    for slug in ("beta", "no-such-tenant"):
        assert alpha_client.get("/api/v1/usage/report/",
                                {**PERIOD, "tenant": slug}).status_code == 404


@pytest.mark.django_db
def test_superuser_sees_every_tenants_reasons_and_can_narrow(failures, api):
    api.force_login(failures.superuser)
    body = rest_report(api, group_by="tenant")
    assert [(r["tenant"], r["errors_by_reason"]) for r in body["rows"]] == [
        ("alpha", A_REASONS), ("beta", {"internal_error": 5, "upstream_error": 4})]
    beta = rest_report(api, group_by="agent", tenant="beta")
    assert [(r["agent"], r["requests"], r["errors_by_reason"], r["cost"])
            for r in beta["rows"]] == [
        ("(no agent)", 5, {"internal_error": 5}, "0.000000"),
        ("beta-summariser", 5, {"upstream_error": 4}, "14.000000"),
    ]


@pytest.mark.django_db
def test_csv_has_a_column_per_reason_whatever_occurred(failures, alpha_client):
    response = alpha_client.get("/api/v1/usage/report.csv",
                                {**PERIOD, "group_by": "agent,capability"})
    assert response.status_code == 200
    text = response.content.decode()
    header = text.splitlines()[0].split(",")
    assert header[:8] == ["agent", "capability", "requests", "errors", "input_tokens",
                          "output_tokens", "cost", "latency_ms_avg"]
    assert header[8:] == list(REASON_COLUMNS)
    assert "errors_success" not in header and "errors_client_cancelled" in header
    rows = parse_csv(text)
    translator = next(r for r in rows if r["capability"] == "translate.text")
    assert {k: v for k, v in translator.items() if k.startswith("errors_") and v != "0"} == {
        "errors_client_cancelled": "1", "errors_rate_limited": "2",
        "errors_upstream_timeout": "1", "errors_upstream_error": "3"}
    unrouted = next(r for r in rows if r["agent"] == "(no agent)")
    assert (unrouted["errors"], unrouted["errors_no_capability"],
            unrouted["errors_invalid_input"], unrouted["errors_internal_error"]) == (
        "3", "2", "1", "0")
    for row in rows:
        assert sum(int(row[column]) for column in REASON_COLUMNS) == int(row["errors"])
    assert sum(D(row["cost"]) for row in rows) == A_FAILURE_TOTALS["cost"]
    assert sum(int(row["input_tokens"]) for row in rows) == 143
    # A period without errors has the same header.
    quiet = alpha_client.get("/api/v1/usage/report.csv",
                             {"start": "2024-01-01", "end": "2024-01-31"}).content.decode()
    assert quiet.splitlines() == [",".join(
        ["agent", "capability", "day", *header[2:]])]


@pytest.mark.django_db
def test_admin_report_shows_errors_by_reason(failures, client):
    client.force_login(failures.owner)
    response, html = page(client, **PERIOD)
    report_ctx = response.context["report"]
    assert report_ctx["totals"] == A_FAILURE_TOTALS
    assert [(r["reason"], r["label"], r["count"]) for r in report_ctx["reasons"]] == [
        ("rate_limited", "Rate limited", 3), ("upstream_error", "Upstream error", 3),
        ("no_capability", "No capability", 2), ("client_cancelled", "Client cancelled", 1),
        ("invalid_input", "Invalid input", 1), ("upstream_timeout", "Upstream timeout", 1),
    ]
    table = html[html.index('id="reach-usage-reasons"'):]
    table = table[:table.index("</table>")]
    assert "Client cancelled" in table and "<code>no_capability</code>" in table
    assert "21.4 %" in table  # rate_limited: 3 of 14 calls
    rows = html[html.index('id="reach-usage-rows"'):]
    rows = rows[:rows.index("</table>")]
    assert "<th>Errors by reason</th>" in rows
    assert "(no agent)" in rows and "(no capability)" in rows
    assert "<code>upstream_error</code>&nbsp;3" in rows
    assert "<code>no_capability</code>&nbsp;2" in rows
    for leak in ("internal_error", "beta", "summarise"):
        assert leak not in html, leak
    csv_url = unescape(re.search(r'href="([^"]*report\.csv[^"]*)"', html).group(1))
    exported = parse_csv(client.get(csv_url).content.decode())
    assert sum(int(row["errors_rate_limited"]) for row in exported) == 3
    assert sum(int(row["errors"]) for row in exported) == 11


@pytest.mark.django_db
def test_admin_report_without_errors_says_so(world, client):
    event(world.tenant_a, world.agent_a, None, timezone.now(), cost="0.25")
    client.force_login(world.member)
    response, html = page(client)
    assert response.context["report"]["reasons"] == []
    assert "No errors in this period." in html


@pytest.mark.django_db
def test_a_late_event_is_reported_at_once_and_after_its_rollup(failures, alpha_client):
    from metering.ingest import usage_events_store
    from metering.rollups import rollup_recent

    before = rest_report(alpha_client, group_by="day")["rows"]
    # Stored through the consumer long after its day: that day is read from events
    # until the next rollup run has rebuilt it.
    usage_events_store([{
        "request_id": "late-overload", "tenant": failures.tenant_a.pk, "agent": None,
        "capability": None, "instance": None, "outcome": "overloaded", "input_tokens": 0,
        "output_tokens": 0, "cost": 0, "latency_ms": 1, "occurred_at": at(1).timestamp(),
    }])
    now = rest_report(alpha_client, group_by="day")["rows"]
    assert now[0]["errors_by_reason"] == {**before[0]["errors_by_reason"], "overloaded": 1}
    assert now[0]["requests"] == before[0]["requests"] + 1 and now[1:] == before[1:]

    rollup_recent(timezone.now())
    assert not PendingRollup.objects.exists()
    assert rest_report(alpha_client, group_by="day")["rows"] == now
    assert UsageDaily.objects.get(day=START, tenant=failures.tenant_a, agent=None
                                  ).errors_by_reason == {"no_capability": 2, "overloaded": 1}


@pytest.mark.django_db
def test_the_readmes_report_request_works_on_any_day(world):
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    request = re.search(r"GET (/api/v1/usage/report/[^`\s]*)", readme).group(1)
    assert "20" not in request, "no fixed dates: the default period is the current month"
    event(world.tenant_a, world.agent_a, None, timezone.now(), outcome="upstream_error")
    body = alpha_key(world).get(request).json()
    today = timezone.now().astimezone(dt.UTC).date()
    assert (body["start"], body["end"]) == (today.replace(day=1).isoformat(),
                                            today.isoformat())
    assert body["totals"]["errors_by_reason"] == {"upstream_error": 1}


def test_a_period_ending_on_the_last_representable_day_is_refused():
    """The period's bound is the day after its end: there is none after 9999-12-31."""
    from metering.reports import PeriodError, resolve_period

    with pytest.raises(PeriodError) as refused:
        resolve_period(None, dt.date.max)
    assert refused.value.field == "end"
    assert resolve_period(dt.date(9999, 12, 1), dt.date(9999, 12, 30))[1] == dt.date(9999, 12, 30)
