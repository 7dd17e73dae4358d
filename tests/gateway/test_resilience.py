"""Retries, circuit breakers and outages, against real processes."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from django.conf import settings

from registry.models import Instance
from registry.services import agent_register
from registry.spec import AgentSpec, CapabilitySpec
from tests.gateway.conftest import start_scripted_agent, stop
from tests.servers import free_port, postgres_stopped


def _metric(gateway, pattern: str) -> float | None:
    text = httpx.get(f"{gateway.base}/metrics").text
    match = re.search(pattern + r" ([0-9.e+-]+)", text)
    return float(match.group(1)) if match else None


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
    deadline = time.monotonic() + 15
    while client.post("/v1/invoke", json={"capability": "twin.echo", "input": {}}
                      ).status_code != 200:
        assert time.monotonic() < deadline, "the gateway never learnt about the agent"
        time.sleep(0.2)

    for n in range(12):
        call(n)  # every call succeeds: a refused connection is retried elsewhere
    retries = _metric(gateway, "reach_retries_total")
    assert retries and retries >= 2
    assert _metric(gateway, f'reach_breaker_open{{instance="{dead.pk}"}}') == 1.0
    for n in range(10):
        call(n)  # the open breaker keeps the dead instance out: no more retries
    assert _metric(gateway, "reach_retries_total") == retries

    revived = start_scripted_agent(dead_port)
    try:
        deadline = time.monotonic() + 15
        while _metric(gateway, f'reach_breaker_open{{instance="{dead.pk}"}}') is not None:
            assert time.monotonic() < deadline, "the half-open probe never closed the breaker"
            call(0)
            time.sleep(0.1)
        seen = httpx.get(f"http://127.0.0.1:{dead_port}/_seen").json()
        assert seen, "the recovered instance got no traffic"
    finally:
        stop(revived)
        client.close()


@pytest.mark.skipif(not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
                    reason="stops the machine's PostgreSQL; runs under .ci/run")
def test_calls_keep_succeeding_while_postgresql_is_stopped(gateway):
    from django.db import connections

    with gateway.client() as client:
        before = client.post("/v1/invoke", json={"capability": "translate.text",
                                                 "input": {"text": "hello", "dest_lang": "ja"}})
        assert before.status_code == 200
        with postgres_stopped():
            for _ in range(5):
                during = client.post("/v1/invoke", json={
                    "capability": "translate.text",
                    "input": {"text": "thank you", "dest_lang": "zh"}})
                assert during.status_code == 200, during.text
                assert during.json()["reply_content"] == "谢谢"
            ready = httpx.get(f"{gateway.base}/readyz", timeout=10)
            assert ready.status_code == 503  # the control plane knows it is degraded
        connections.close_all()
