"""Upstream sessions do not accumulate: one unused for longer than its keep-alive is closed,
unless its agent still has a call in flight; the next call opens a new one."""

from __future__ import annotations

import asyncio

from gateway.upstream import UpstreamPools
from reach_core.endpoints import EndpointPolicy
from tests.support.clock import FakeClock

POLICY = EndpointPolicy.from_setting(("127.0.0.1/32",), ())


def test_sessions_idle_past_their_keep_alive_are_closed_and_busy_ones_kept(scripted):
    clock = FakeClock()

    async def go():
        pools = UpstreamPools(POLICY, connect_timeout_s=1, clock=clock)
        idle = pools.session(1, 4, 90)
        async with idle.get(f"{scripted.endpoint}_seen") as reply:
            assert reply.status == 200
        busy = pools.session(2, 4, 90)
        held = await pools.slot(2, 4, wait_s=1)  # a call (a long stream) still running
        recent = pools.session(3, 4, 90)

        clock.advance(60)
        pools.session(3, 4, 90)  # used again: its 90 s start over
        assert await pools.close_idle() == 0  # nothing idle for 90 s yet

        clock.advance(31)
        closed = await pools.close_idle()
        state = (closed, idle.closed, busy.closed, recent.closed)

        held.release()
        clock.advance(91)
        closed_later = await pools.close_idle()
        again = pools.session(1, 4, 90)
        async with again.get(f"{scripted.endpoint}_seen") as reply:
            status = reply.status
        await pools.close()
        return state, (closed_later, busy.closed, recent.closed), (again is not idle, status)

    state, later, reopened = asyncio.run(go())

    assert state == (1, True, False, False)
    assert later == (2, True, True)
    assert reopened == (True, 200)
