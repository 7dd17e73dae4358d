"""Retries, circuit breakers and outages, against real processes."""

from __future__ import annotations

import httpx
import pytest
from django.conf import settings

from registry.models import Instance
from registry.services import agent_register
from registry.spec import AgentSpec, CapabilitySpec
from tests.gateway.conftest import start_scripted_agent, stop
from tests.support.metrics import scrape
from tests.support.servers import free_port
from tests.support.waiting import wait_for


@pytest.mark.gateway_env(REACH_BREAKER_MIN_VOLUME="4", REACH_BREAKER_COOLDOWN_S="1")
def test_retry_then_breaker_then_half_open_recovery(gateway):
    dead_port = free_port()
    spec = AgentSpec(name="twin", capabilities=(
        CapabilitySpec(capability_id="twin.echo", path="/echo"),))
    from dataclasses import replace

    agent_register(tenant=gateway.tenant,
                   spec=replace(spec, endpoint=f"http://127.0.0.1:{gateway.agent_port}/"))
    agent_register(tenant=gateway.tenant,
                   spec=replace(spec, endpoint=f"http://127.0.0.1:{dead_port}/"))
    dead = Instance.objects.get(endpoint=f"http://127.0.0.1:{dead_port}/")
    client = gateway.client()

    def call(n: int) -> None:
        response = client.post("/v1/invoke", json={"capability": "twin.echo",
                                                   "input": {"n": n}})
        assert response.status_code == 200, response.text

    # The gateway learns about the new agent through the route-table bus or its
    # periodic check; wait (bounded) until it routes to it.
    wait_for(lambda: client.post("/v1/invoke", json={"capability": "twin.echo", "input": {}}
                                 ).status_code == 200,
             timeout=15, interval=0.2, message="the gateway to learn about the agent")

    breaker = {"instance": str(dead.pk)}
    for n in range(12):
        call(n)  # every call succeeds: a refused connection is retried elsewhere
    retries = scrape(gateway.base, "reach_retries_total")
    assert retries and retries >= 2
    assert scrape(gateway.base, "reach_breaker_open", breaker) == 1.0
    for n in range(10):
        call(n)  # the open breaker keeps the dead instance out: no more retries
    assert scrape(gateway.base, "reach_retries_total") == retries

    revived = start_scripted_agent(dead_port)
    try:
        def closed_after_a_call() -> bool:
            call(0)  # the half-open probe needs traffic
            return scrape(gateway.base, "reach_breaker_open", breaker) is None

        wait_for(closed_after_a_call, timeout=15, interval=0.1,
                 message="the half-open probe to close the breaker")
        seen = httpx.get(f"http://127.0.0.1:{dead_port}/_seen").json()
        assert seen, "the recovered instance got no traffic"
    finally:
        stop(revived)
        client.close()


@pytest.mark.skipif(not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
                    reason="needs PostgreSQL over TCP to cut; runs under .ci/run")
@pytest.mark.gateway_via_forwarders
def test_calls_keep_succeeding_while_postgresql_is_unreachable(gateway):
    # Only the gateway loses PostgreSQL: its connections go through a forwarder this test
    # owns and cuts; the machine's server, and this process's connections, are untouched.
    assert gateway.postgres.accepted, "the gateway does not reach PostgreSQL via the forwarder"
    with gateway.client() as client:
        before = client.post("/v1/invoke", json={"capability": "translate.text",
                                                 "input": {"text": "hello", "dest_lang": "ja"}})
        assert before.status_code == 200
        with gateway.postgres.outage():
            for _ in range(5):
                during = client.post("/v1/invoke", json={
                    "capability": "translate.text",
                    "input": {"text": "thank you", "dest_lang": "zh"}})
                assert during.status_code == 200, during.text
                assert during.json()["reply_content"] == "谢谢"
            ready = httpx.get(f"{gateway.base}/readyz", timeout=10)
            assert ready.status_code == 503  # the control plane knows it is degraded
    # Reachable again: the gateway reconnects by itself.
    wait_for(lambda: httpx.get(f"{gateway.base}/readyz", timeout=10).status_code == 200,
             timeout=30, interval=0.2, message="/readyz to pass after the outage")
