"""What a call leaves for operators: /metrics by outcome and reason that equal the usage
rows, and one JSON log line per call with its request id and four moments in order.

A real gateway process (uvicorn) in front of the scripted agent; usage goes through the
Redis stream and the metering consumer into PostgreSQL, as in production.
"""

from __future__ import annotations

import collections
import uuid

import httpx
import orjson
import pytest
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from registry.services import agent_register
from registry.spec import AgentSpec, CapabilitySpec
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(
    not (settings.DATABASES["default"]["ENGINE"].endswith("postgresql") and settings.REDIS_URL),
    reason="usage rows come through the Redis stream (.ci/run sets PostgreSQL and Redis)",
)


def agent_calls(base: str, tenant: str) -> dict[tuple[str, str], float]:
    """reach_agent_calls_total of ``tenant``: (outcome, reason) -> count."""
    out: dict[tuple[str, str], float] = collections.Counter()
    text = httpx.get(f"{base}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "reach_agent_calls_total" and sample.labels["tenant"] == tenant:
                out[(sample.labels["outcome"], sample.labels["reason"])] += sample.value
    return dict(out)


def store_usage(request_ids: list[str], tenant) -> dict[str, str]:
    import redis as redis_sync

    from metering.ingest import usage_stream_consume
    from metering.models import UsageEvent

    mine = UsageEvent.objects.filter(tenant=tenant, request_id__in=request_ids)
    client = redis_sync.Redis.from_url(settings.REDIS_URL)
    try:
        def stored() -> bool:
            usage_stream_consume(client=client, consumer="observe-test", block_ms=100,
                                 max_batches=10)
            return mine.count() >= len(request_ids)

        wait_for(stored, timeout=30, interval=0.1, message="every call's usage row")
    finally:
        client.close()
    return dict(mine.values_list("request_id", "outcome"))


@pytest.mark.gateway_env(REACH_BREAKER_MIN_VOLUME="2", REACH_BREAKER_FAILURE_RATIO="0.5",
                         REACH_LOG_FORMAT="json")
def test_metrics_by_reason_equal_the_usage_rows_and_each_call_logs_one_line(
        gateway, tmp_path, django_user_model):
    endpoint = f"http://127.0.0.1:{gateway.agent_port}/"
    agent_register(tenant=gateway.tenant, spec=AgentSpec(
        name="observed", endpoint=endpoint, capabilities=(
            CapabilitySpec(capability_id="observed.fail", path="/fail"),
            CapabilitySpec(capability_id="observed.limited", path="/echo", qps=1, burst=2),
        )))
    slug = gateway.tenant.slug
    before = agent_calls(gateway.base, slug)
    sent: dict[str, str] = {}  # request id -> the outcome the call should end with

    with gateway.client() as client:
        def call(body: dict, expected: str, **headers) -> httpx.Response:
            rid = uuid.uuid4().hex
            reply = client.post("/v1/invoke", json=body,
                                headers={"X-Request-ID": rid, **headers})
            sent[rid] = expected
            return reply

        wait_for(lambda: client.get("/v1/route", params={"capability": "observed.fail"})
                 .status_code == 200, timeout=15, interval=0.05, message="the new agent")
        for _ in range(3):
            call({"capability": "echo.all", "input": {"text": "hi"}}, "success")
        call({"capability": "slow.op", "input": {}}, "deadline_exceeded",
             **{"X-Reach-Deadline-Ms": "300"})
        for expected in ("success", "success", "rate_limited"):
            call({"capability": "observed.limited", "input": {}}, expected)
        call({"capability": "no.such.capability", "input": {}}, "no_capability")
        call({"intent": "qwxz vbnm plkj", "input": {}}, "no_capability")
        # Two failures open the instance's breaker (volume 2, half failing); the third
        # call is refused for it.
        for _ in range(2):
            call({"capability": "observed.fail", "input": {}}, "upstream_error")
        reply = call({"capability": "observed.fail", "input": {}}, "circuit_open")
        assert reply.json()["error"]["code"] == "circuit_open"
        # An authenticated call with the wrong body type is metered too.
        call({"capability": "echo.all", "input": {}}, "unsupported_media_type",
             **{"Content-Type": "text/plain"})

    # The console sees the open breaker, as the gateway process publishes it.
    from django.test import Client
    from django.urls import reverse

    from registry.models import Instance

    fail_instance = Instance.objects.get(agent__name="observed")
    console = Client()
    console.force_login(django_user_model.objects.create_superuser("ops", "o@x", "pw"))

    def breaker_shown() -> bool:
        page = console.get(reverse("admin:index")).content.decode()
        table = page.split('id="reach-breakers"', 1)[-1].split("</table>")[0] \
            if 'id="reach-breakers"' in page else ""
        return f"<td>{fail_instance.pk} " in table

    wait_for(breaker_shown, timeout=15, interval=0.2, message="the open breaker on the console")

    # The control plane: Django's own warning about a 400 carries the request's id.
    api_rid = uuid.uuid4().hex
    refused = httpx.post(f"{gateway.base}/api/v1/agents/register", json={"agent_id": "zz"},
                         headers={"Authorization": f"Bearer {gateway.key}",
                                  "X-Request-ID": api_rid}, timeout=10)
    assert refused.status_code in (400, 403) and refused.headers["x-request-id"] == api_rid

    rows = store_usage(list(sent), gateway.tenant)
    assert rows == sent  # one usage row per call, with the outcome it ended with

    after = agent_calls(gateway.base, slug)
    delta = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    by_outcome = collections.Counter()
    for (outcome, _reason), count in delta.items():
        by_outcome[outcome] += count
    assert {k: v for k, v in by_outcome.items() if v} == collections.Counter(rows.values())
    reasons = {outcome: reason for (outcome, reason), count in delta.items() if count}
    assert reasons == {
        "success": "success", "deadline_exceeded": "timeout", "rate_limited": "limited",
        "no_capability": "route_miss", "upstream_error": "agent_error",
        "circuit_open": "circuit_open", "unsupported_media_type": "caller",
    }

    # The log: JSON throughout, one call line per call, its moments in order.
    # Every line, uvicorn's own included, is one JSON object.
    lines = [orjson.loads(line) for line in (tmp_path / "gw.log").read_text().splitlines()
             if line.strip()]
    api_lines = [line for line in lines if line.get("logger") == "django.request"]
    assert api_lines and all(line["request_id"] == api_rid for line in api_lines), api_lines
    calls = [line for line in lines if line.get("event") == "call"]
    mine = {line["request_id"]: line for line in calls if line["request_id"] in sent}
    assert len(mine) == len(sent)
    assert sum(1 for line in calls if line["request_id"] in sent) == len(sent)
    for rid, line in mine.items():
        assert line["outcome"] == sent[rid] and line["tenant"] == slug
        moments = [line[k] for k in ("entered_at", "routed_at", "answered_at", "returned_at")]
        if sent[rid] in ("success", "upstream_error"):
            times = moments
            assert times == sorted(times), line
            assert line["instance"] is not None and line["route_score"] is not None
        if sent[rid] == "no_capability":
            assert line["routed_at"] is None and line["agent"] is None
