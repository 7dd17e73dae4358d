"""Rate limits through real gateways: shared across processes via Redis, fail-open."""

from __future__ import annotations

import concurrent.futures
import time

import httpx
import pytest
from django.conf import settings

from tenants.models import Quota
from tests.support.metrics import scrape
from tests.support.servers import free_port, platform_env, running, uvicorn_args
from tests.support.waiting import wait_for

needs_redis = pytest.mark.skipif(not settings.REDIS_URL,
                                 reason="needs the machine's Redis (.ci/run sets REDIS_URL)")


def _wait_for_429(client, body, timeout=15.0) -> None:
    wait_for(lambda: client.post("/v1/invoke", json=body).status_code == 429,
             timeout=timeout, interval=0, message="the limit to take effect")


def test_a_tenant_limit_answers_429_with_retry_after(gateway):
    Quota.objects.create(tenant=gateway.tenant, requests_per_minute=60, burst=2)
    body = {"capability": "echo.all", "input": {}}
    with gateway.client() as client:
        _wait_for_429(client, body)  # the gateway learns of the quota from the route table
        response = client.post("/v1/invoke", json=body)
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited"
    assert response.json()["error"]["retryable"] is True
    assert int(response.headers["retry-after"]) >= 1


@needs_redis
def test_two_gateway_processes_share_one_limit_exactly(gateway, tmp_path):
    """A burst of 10 with a refill of one a minute: over two gateways and four clients,
    exactly the burst is admitted (plus one per whole minute, should the machine stall
    that long). No wall-clock tolerance: the refill is too slow to matter."""
    from registry.snapshot import current_version
    from tests.gateway.conftest import database_url

    Quota.objects.create(tenant=gateway.tenant, requests_per_minute=1, burst=10)
    version = current_version()
    port = free_port()
    env = platform_env(tmp_path, DATABASE_URL=database_url(),
                       REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS),
                       REDIS_URL=settings.REDIS_URL,
                       REACH_REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX)
    body = {"capability": "echo.all", "input": {}}
    with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "gw2.log") as second:
        bases = (gateway.base, second)
        for base in bases:  # both follow the table that has the quota: nothing spent yet
            wait_for(lambda base=base: (scrape(base, "reach_route_table_version") or 0)
                     >= version, timeout=15, interval=0.05, message="the quota to propagate")
        clients = [httpx.Client(base_url=base, timeout=10,
                                headers={"Authorization": f"Bearer {gateway.key}"})
                   for base in bases]
        started = time.monotonic()

        def hammer(client) -> list[int]:
            return [client.post("/v1/invoke", json=body).status_code for _ in range(15)]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(hammer, clients * 2))
        elapsed = time.monotonic() - started
        for client in clients:
            client.close()
    statuses = [status for result in results for status in result]
    assert set(statuses) <= {200, 429}
    allowed = statuses.count(200)
    assert 10 <= allowed <= 10 + int(elapsed // 60), (allowed, elapsed)
    assert all(429 in result for result in results)  # both processes refused, too


@needs_redis
@pytest.mark.gateway_via_forwarders
def test_calls_continue_fail_open_while_redis_is_unreachable(gateway):
    # Only the gateway loses Redis: it goes through a forwarder this test owns and cuts.
    assert gateway.redis.accepted, "the gateway does not reach Redis via the forwarder"
    # Burst 10: leases of one token, so every call asks Redis.
    Quota.objects.create(tenant=gateway.tenant, requests_per_minute=6000, burst=10)
    body = {"capability": "echo.all", "input": {}}
    with gateway.client() as client:
        assert client.post("/v1/invoke", json=body).status_code == 200
        with gateway.redis.outage():
            for _ in range(5):
                response = client.post("/v1/invoke", json=body)
                assert response.status_code == 200, response.text
            degraded = scrape(gateway.base, "reach_limits_degraded_total")
    assert degraded is not None and degraded >= 5


def test_a_monthly_request_budget_is_enforced(gateway):
    Quota.objects.create(tenant=gateway.tenant, monthly_requests=3)
    body = {"capability": "echo.all", "input": {}}
    statuses = []
    with gateway.client() as client:

        def refused_yet() -> bool:
            statuses.append(client.post("/v1/invoke", json=body).status_code)
            return statuses[-1] == 429

        wait_for(refused_yet, timeout=15, interval=0, message="the budget to take effect")
        refused = client.post("/v1/invoke", json=body)
    assert refused.json()["error"]["code"] == "quota_exceeded"
    # The gateway counted every call it let through, and stopped at the budget.
    assert statuses.count(200) >= 3
