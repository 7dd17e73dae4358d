"""Overload, against a real gateway process: past its cap on calls in flight it answers
only 200, 429 or 503 (with Retry-After), at once, never a 504 or a time-out, and once
the overload stops it serves normal calls again. The lag-driven limit itself is checked
with an injected clock. ``bench/overload.py`` measures the same at 5x a real load."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from gateway.app import LoadShedder

CAP = 8
RATE = 100  # calls per second, open loop: sent on schedule whatever the answers do
SECONDS = 3


async def open_loop(gateway, body: dict, *, rate: int, seconds: float) -> list:
    """``(status, retry_after)`` per call, or ``("timeout", None)`` for a call that got no
    answer within the client's 10 s."""
    async with httpx.AsyncClient(base_url=gateway.base, timeout=10,
                                 limits=httpx.Limits(max_connections=rate * 3),
                                 headers={"Authorization": f"Bearer {gateway.key}"}) as client:
        async def one():
            try:
                reply = await client.post("/v1/invoke", json=body)
            except httpx.TimeoutException:
                return "timeout", None
            return reply.status_code, reply.headers.get("retry-after")

        loop = asyncio.get_running_loop()
        start, calls = loop.time(), []
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
            calls.append(asyncio.ensure_future(one()))
        return await asyncio.gather(*calls)


# The count cap alone: the lag bound depends on how busy the machine is (unit-tested below);
# one tenant's share of the cap is tests/gateway/test_tenant_share.py's subject.
@pytest.mark.gateway_env(REACH_GATEWAY_MAX_IN_FLIGHT=str(CAP), REACH_GATEWAY_MAX_LOOP_LAG_MS="0",
                         REACH_GATEWAY_TENANT_SHARE="1")
def test_well_past_its_cap_a_gateway_sheds_with_retry_after_and_then_serves(gateway):
    # slow.op answers after 2 s: CAP calls at once serve 4 a second, RATE are offered.
    results = asyncio.run(open_loop(gateway, {"capability": "slow.op", "input": {}},
                                    rate=RATE, seconds=SECONDS))
    statuses = Counter(status for status, _ in results)
    assert set(statuses) <= {200, 429, 503}, statuses  # no 504, no time-out
    assert statuses[503] >= RATE * SECONDS - 3 * CAP  # well past the cap: most are shed
    assert 0 < statuses[200] <= 3 * CAP
    assert all(retry_after == "1" for status, retry_after in results if status in (429, 503))

    with gateway.client() as client:  # after the overload: a burst of normal calls
        after = asyncio.run(open_loop(gateway, {"capability": "echo.all", "input": {}},
                                      rate=50, seconds=1))
        assert Counter(status for status, _ in after) == {200: 50}
        assert client.post("/v1/invoke", json={"capability": "echo.all",
                                               "input": {}}).status_code == 200


def test_a_loop_late_tick_after_tick_cuts_the_limit_and_an_on_time_one_grows_it_back():
    shedder = LoadShedder(max_in_flight=512, max_loop_lag_s=0.02)
    shedder.in_flight = 200
    shedder.observe(0.05, now=1.0)
    shedder.observe(0.05, now=1.01)
    assert shedder.limit == 512  # a late tick or two is noise (a GC pass, a neighbour)
    shedder.observe(0.05, now=1.02)
    assert shedder.limit == 100  # half the calls in flight
    shedder.observe(0.05, now=1.03)
    assert shedder.limit == 100  # settling: the cut's effect is not seen yet
    shedder.in_flight = 100
    shedder.observe(0.05, now=1.2)
    assert shedder.limit == 50
    for tick in range(10):
        shedder.observe(0.001, now=2 + tick / 100)
    assert shedder.limit == 60  # on time again: one more per tick
    for tick in range(1000):
        shedder.observe(0.001, now=3 + tick / 100)
    assert shedder.limit == 512  # and back to the count cap, no higher


def test_the_lag_limit_never_drops_below_its_floor_and_can_be_turned_off():
    shedder = LoadShedder(max_in_flight=512, max_loop_lag_s=0.02)
    for tick in range(100):
        shedder.observe(1.0, now=tick)
    assert shedder.limit == LoadShedder.FLOOR
    off = LoadShedder(max_in_flight=512, max_loop_lag_s=0)
    off.in_flight = 100
    for tick in range(10):
        off.observe(1.0, now=tick)
    assert off.limit == 512 and off.loop_lag_s == 1.0
