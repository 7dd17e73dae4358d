"""The request id is on every log line written while a request is handled, in the
gateway and in the control plane alike, and a call's own line has its moments in order."""

from __future__ import annotations

import asyncio
import logging
import uuid

import orjson
import pytest

from reach_platform.logs import JsonFormatter
from reach_platform.middleware import RequestIdLogFilter
from tests.support.inprocess import in_process, route_table, scripted_agents, with_instances
from tests.support.servers import free_port


@pytest.fixture
def captured(caplog):
    """caplog's handler with the platform's request-id filter, at INFO."""
    caplog.set_level(logging.INFO)
    caplog.handler.addFilter(RequestIdLogFilter())
    yield caplog
    caplog.handler.removeFilter(caplog.handler.filters[-1])


def test_every_line_of_a_retried_call_carries_its_request_id(scripted, captured):
    agents = scripted_agents(scripted.endpoint)
    # The first instance refuses connections: its attempt is retried on the second.
    agents[0] = with_instances(agents[0], f"http://127.0.0.1:{free_port()}/",
                               scripted.endpoint)
    table, key = route_table(agents)
    rids = [uuid.uuid4().hex for _ in range(2)]

    async def scenario():
        async with in_process(table, key) as gw:
            # Concurrently, so a context leaking from one call to the other would show.
            replies = await asyncio.gather(*(gw.post(
                "/v1/invoke", {"capability": "echo.all", "input": {"n": i}},
                x_request_id=rid) for i, rid in enumerate(rids)))
            return replies, list(captured.records)  # before the gateway closes

    replies, during = asyncio.run(scenario())
    assert [r.status_code for r in replies] == [200, 200]
    records = [r for r in during if r.name.startswith(("gateway", "reach."))]
    retries = [r for r in records if "retrying on instance" in r.getMessage()]
    assert retries, "the refused instance was tried first at least once"
    calls = [r for r in records if r.name == "reach.calls"]
    assert sorted(r.request_id for r in calls) == sorted(rids)
    for record in records:
        assert record.request_id in rids, record.getMessage()
    for record in retries:  # the retry's line names its own call
        line = next(c for c in calls if c.request_id == record.request_id)
        assert line.call["retried"] and len(line.call["attempts"]) == 2
    for record in calls:
        call = record.call
        moments = [call[k] for k in ("entered_at", "routed_at", "answered_at", "returned_at")]
        assert all(isinstance(m, float) for m in moments)
        assert moments == sorted(moments)
        assert call["agent"] == "default/scripted" and call["capability"] == "echo.all"


def test_the_json_format_is_one_object_per_line_with_the_call_fields(captured):
    record = logging.LogRecord("reach.calls", logging.INFO, __file__, 1, "call %s",
                               ("success",), None)
    record.request_id = "abc"
    record.call = {"request_id": "abc", "outcome": "success", "instance": 7}
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = orjson.loads(line)
    assert data["message"] == "call success" and data["instance"] == 7
    assert data["request_id"] == "abc" and data["logger"] == "reach.calls"


@pytest.mark.django_db
def test_a_control_plane_request_logs_under_its_request_id(client, captured):
    from registry.models import Namespace  # noqa: F401  (the default namespace is seeded)
    from tenants.choices import ApiKeyScope
    from tests import factories

    factories.seed_defaults()
    tenant = factories.tenant()
    key = factories.api_key(tenant=tenant, scopes=[ApiKeyScope.REGISTER]).plaintext
    rid = uuid.uuid4().hex
    reply = client.post("/api/v1/agents/register", data={
        "agent_id": "logged", "reach": {"protocol": "http",
                                        "endpoint": "http://127.0.0.1:9/"},
        "capabilities": [{"id": "logged.op", "path": "/op"}]},
        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}",
        HTTP_X_REQUEST_ID=rid)
    assert reply.status_code == 201, reply.content
    registered = [r for r in captured.records if "registered default/logged" in r.getMessage()]
    assert registered and all(r.request_id == rid for r in registered)
