"""A hung Redis is waited on by one command, not by every call (``gateway.redis_gate``).

The gateway's own client (``redis_client``) against the machine's Redis through a
test-owned forwarder, frozen to play a hung server; the gate's clock is injected.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest
import redis.exceptions
from django.conf import settings
from django.utils import timezone

from gateway.redis_gate import RedisGate
from reach_platform.gateway_factory import redis_client
from registry.models import Instance
from registry.services import agent_register
from registry.spec import AgentSpec, CapabilitySpec
from tenants.models import Quota
from tests.support.clock import FakeClock
from tests.support.forwarder import Forwarder
from tests.support.metrics import scrape
from tests.support.waiting import wait_for

needs_redis = pytest.mark.skipif(not settings.REDIS_URL,
                                 reason="needs the machine's Redis (.ci/run sets REDIS_URL)")


def through_a_forwarder(scenario) -> None:
    """Run ``scenario(client, forwarder, clock)``: the gateway's Redis client, reaching
    the machine's Redis through a test-owned forwarder, its gate on an injected clock."""
    clock = FakeClock()

    async def run(forwarder: Forwarder) -> None:
        client = redis_client(forwarder.url(settings.REDIS_URL))
        client.gate = RedisGate(cooldown_s=1.0, clock=clock)
        try:
            await scenario(client, forwarder, clock)
        finally:
            await client.aclose()
            await client.connection_pool.disconnect()

    with Forwarder.for_url(settings.REDIS_URL) as forwarder:
        asyncio.run(run(forwarder))


@needs_redis
def test_one_time_out_shuts_the_gate_and_one_probe_at_a_time_opens_it():
    async def scenario(client, forwarder, clock) -> None:
        assert await client.ping()
        with forwarder.freeze():
            with pytest.raises(redis.exceptions.TimeoutError):
                await client.ping()  # the socket time-out: the one command that waits
            accepted = forwarder.accepted
            for _ in range(3):  # the others fail at once, without a connection
                with pytest.raises(redis.exceptions.ConnectionError, match="not asked"):
                    await client.ping()
            with pytest.raises(redis.exceptions.ConnectionError, match="not asked"):
                await client.pipeline(transaction=False).ping().execute()
            assert forwarder.accepted == accepted
            clock.advance(1.0)
            probe = asyncio.ensure_future(client.ping())  # the probe, still hung
            await asyncio.sleep(0)
            with pytest.raises(redis.exceptions.ConnectionError, match="not asked"):
                await client.ping()  # one probe at a time
            with pytest.raises(redis.exceptions.TimeoutError):
                await probe
            assert client.gate.shut  # the probe timed out: shut again
        with pytest.raises(redis.exceptions.ConnectionError, match="not asked"):
            await client.ping()  # answering again, but not yet asked
        clock.advance(1.0)
        assert await client.ping()  # the probe answers: open
        assert not client.gate.shut
        assert await client.pipeline(transaction=False).ping().execute() == [True]

    through_a_forwarder(scenario)


@needs_redis
def test_a_cancelled_command_neither_shuts_nor_opens_the_gate():
    """A caller's deadline cutting a command short says nothing of Redis; a cancelled
    probe lets the next command probe."""

    async def scenario(client, forwarder, clock) -> None:
        with forwarder.freeze():
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await client.ping()
            assert not client.gate.shut
            with pytest.raises(redis.exceptions.TimeoutError):
                await client.ping()
            clock.advance(1.0)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await client.ping()  # the probe, cancelled
        clock.advance(1.0)
        assert await client.ping()  # the next command is the probe
        assert not client.gate.shut

    through_a_forwarder(scenario)


@needs_redis
@pytest.mark.gateway_via_forwarders
def test_a_hung_redis_holds_no_call_past_its_deadline_nor_every_call_anew(gateway):
    """Break test (helper-34): Redis stopped with SIGSTOP, a tenant with a rate limit and
    a budget: calls with a 500 ms deadline answered after 3 to 4 s, and every call waited
    on Redis anew (p50 about 3 s under traffic)."""
    from registry.snapshot import current_version

    # Burst 10: leases of one token, so every call asks Redis; and a budget to reserve.
    Quota.objects.create(tenant=gateway.tenant, requests_per_minute=6000, burst=10,
                         monthly_requests=100_000)
    # A capability whose own timeout is the caller's deadline (helper-35: a 3,000 ms
    # deadline on a 3,000 ms capability answered after 5 s: only deadlines shorter than
    # the timeout were kept).
    agent_register(tenant=gateway.tenant, spec=AgentSpec(
        name="scripted-quick", protocol="http",
        endpoint=f"http://127.0.0.1:{gateway.agent_port}/", capabilities=(
            CapabilitySpec(capability_id="echo.quick", path="/echo", timeout_ms=300),)))
    Instance.objects.update(lease_expires_at=timezone.now() + dt.timedelta(hours=1))
    version = current_version()
    wait_for(lambda: (scrape(gateway.base, "reach_route_table_version") or 0) >= version,
             timeout=15, interval=0.05, message="the quota to reach the gateway")
    body = {"capability": "echo.all", "input": {}}
    quick = {"capability": "echo.quick", "input": {}}
    with gateway.client() as client:
        assert client.post("/v1/invoke", json=body).status_code == 200
        assert client.post("/v1/invoke", json=quick).status_code == 200
        with gateway.redis.freeze():
            equal = client.post("/v1/invoke", json=quick,
                                headers={"X-Reach-Deadline-Ms": "300"})
            started = time.monotonic()
            tight = client.post("/v1/invoke", json=body,
                                headers={"X-Reach-Deadline-Ms": "300"})
            tight_s = time.monotonic() - started
            later = []
            for _ in range(10):
                started = time.monotonic()
                response = client.post("/v1/invoke", json=body)
                later.append((response.status_code, time.monotonic() - started))
    for cut in (equal, tight):
        assert cut.status_code == 504, cut.text
        assert cut.json()["error"]["code"] == "deadline_exceeded"
    # Cut at its deadline, not after Redis's socket time-out (1 s, then the retry's).
    assert tight_s < 1.0, tight_s
    # The limits fail open and the budget admits without a reservation (documented);
    # one call waits out the socket time-out, and the others do not wait on Redis at all
    # but for a probe once a second: without the gate, every one waited on each command.
    assert [status for status, _ in later] == [200] * 10, later
    waited = [seconds for _, seconds in later if seconds >= 1.0]
    assert len(waited) <= 3, later
