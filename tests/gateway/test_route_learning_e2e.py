"""Learning from use, end to end on a real gateway: tenant A's feedback changes A's
intent routing and never B's, though both see the same (public) capabilities."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest
import redis
from django.conf import settings
from django.utils import timezone

from registry.learning import route_feedback_consume, route_feedback_learn
from registry.models import Instance, RouteFeedback
from registry.services import agent_register
from registry.snapshot import current_version
from registry.spec import AgentSpec, CapabilitySpec
from tenants.choices import ApiKeyScope
from tests import factories
from tests.gateway.conftest import gateway_env, wait_for_table
from tests.support.servers import free_port, running, uvicorn_args
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(
    not settings.REDIS_URL, reason="the gateway ships feedback through Redis (.ci/run sets it)")

# Says nothing the capabilities' texts say: the router cannot know it means a report.
PHRASE = "wrap up the quarter for the board"


@pytest.fixture
def two_tenants(transactional_db, tmp_path):
    factories.seed_defaults()
    owner, a, b = factories.tenant(), factories.tenant(), factories.tenant()
    for name, port, capability, description in [
        ("reporter", 9601, "report.build", "Build a sales report from the order data"),
        ("summariser", 9602, "summarize.text", "Summarise long documents into bullet points"),
    ]:
        agent = agent_register(tenant=owner, spec=AgentSpec(
            name=name, endpoint=f"http://127.0.0.1:{port}/",
            capabilities=(CapabilitySpec(capability_id=capability,
                                         description=description),))).agent
        agent.visibility = "public"
        agent.save()
    Instance.objects.update(lease_expires_at=timezone.now() + dt.timedelta(hours=1))
    keys = {t: factories.api_key(tenant=t, scopes=[ApiKeyScope.INVOKE]).plaintext
            for t in (a, b)}
    port = free_port()
    with running(uvicorn_args(port), env=gateway_env(tmp_path), port=port,
                 log=tmp_path / "gw.log") as base:
        clients = {t: httpx.Client(base_url=base, timeout=10,
                                   headers={"Authorization": f"Bearer {k}"})
                   for t, k in keys.items()}
        yield base, a, b, clients
        for client in clients.values():
            client.close()


def dry_run(client: httpx.Client) -> tuple[int, str | None]:
    response = client.get("/v1/route", params={"intent": PHRASE})
    body = response.json()
    return response.status_code, (body.get("capability") if response.status_code == 200
                                  else (body.get("route") or {}).get("capability"))


def test_a_tenants_feedback_changes_its_routing_and_not_anothers(two_tenants):
    base, a, b, clients = two_tenants
    before_a, before_b = dry_run(clients[a]), dry_run(clients[b])
    assert before_a[1] != "report.build"

    response = clients[a].post("/v1/route/feedback", json={
        "intent": PHRASE, "capability": "report.build", "routed_to": before_a[1] or ""})
    assert response.status_code == 202, response.text
    stream = redis.Redis.from_url(settings.REDIS_URL)
    wait_for(lambda: route_feedback_consume(client=stream, consumer="e2e") >= 0
             and RouteFeedback.objects.filter(tenant=a).exists(), timeout=20,
             message="the feedback to reach the database")
    assert route_feedback_learn()["published"] == 1
    wait_for_table([base], current_version())

    assert dry_run(clients[a]) == (200, "report.build")
    assert dry_run(clients[b]) == before_b
