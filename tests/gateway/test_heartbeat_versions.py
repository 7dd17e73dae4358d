"""A heartbeat changes no route-table version; a health transition does and reaches the
gateway. Real platform process, PostgreSQL and Redis (as CI runs it)."""

from __future__ import annotations

import httpx

from registry.models import Agent, Instance
from registry.snapshot import current_version
from registry.tokens import agent_token_issue
from tenants.choices import ApiKeyScope
from tests import factories
from tests.gateway.conftest import wait_for_table
from tests.support.metrics import scrape
from tests.support.waiting import wait_for


def test_heartbeats_move_no_version_and_a_transition_reaches_the_gateway(gateway):
    agent = Agent.objects.get(name="scripted")
    instance = Instance.objects.get(agent=agent)
    token = agent_token_issue(agent=agent)
    manager = factories.api_key(tenant=gateway.tenant, scopes=[ApiKeyScope.MANAGE]).plaintext
    start = current_version()
    wait_for_table([gateway.base], start)

    with httpx.Client(base_url=gateway.base, timeout=10) as api:
        for n in range(20):
            beat = api.post(f"/api/v1/instances/{instance.pk}/heartbeat",
                            json={"cpu": n / 40, "queue_depth": n},
                            headers={"Authorization": f"Bearer {token}"})
            assert beat.status_code == 200, beat.text
        assert current_version() == start
        assert scrape(gateway.base, "reach_route_table_version") == start

        drained = api.post(f"/api/v1/instances/{instance.pk}/drain",
                           headers={"Authorization": f"Bearer {manager}"})
        assert drained.status_code == 200, drained.text

    assert current_version() > start
    wait_for_table([gateway.base], current_version())
    with gateway.client() as caller:
        dry = wait_for(lambda: (d := caller.get("/v1/route", params={
            "capability": "echo.all"}).json()).get("error") and d,
            message="the gateway to stop routing to the drained instance")
    assert dry["error"]["code"] == "no_healthy_instance"

    # Lifting the drain is a transition too: the gateway routes there again.
    with httpx.Client(base_url=gateway.base, timeout=10) as api:
        resumed = api.post(f"/api/v1/instances/{instance.pk}/resume",
                           headers={"Authorization": f"Bearer {manager}"})
        assert resumed.status_code == 200 and resumed.json()["state"] == "healthy", resumed.text
    with gateway.client() as caller:
        wait_for(lambda: "error" not in caller.get("/v1/route", params={
            "capability": "echo.all"}).json(),
            message="the gateway to route to the resumed instance")
