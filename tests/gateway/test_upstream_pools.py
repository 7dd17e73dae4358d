"""Upstream connections do not grow with the fleet: agents share one pool per keep-alive
setting, idle connections are kept for a bounded number of agents, and the per-agent slots
of agents no longer called are forgotten (unless a call still holds one)."""

from __future__ import annotations

import asyncio

from gateway.upstream import UpstreamPools
from reach_core.endpoints import EndpointPolicy
from tests.support.clock import FakeClock
from tests.support.inprocess import start_scripted_agent, stop_process
from tests.support.servers import free_port

POLICY = EndpointPolicy.from_setting(("127.0.0.1/32",), ())


def test_agents_share_a_pool_and_idle_connections_are_kept_for_a_bounded_few():
    agents = [start_scripted_agent(free_port()) for _ in range(5)]
    try:
        async def go():
            pools = UpstreamPools(POLICY, connect_timeout_s=1)
            pools.MAX_IDLE_HOSTS = 2
            sessions = set()
            for n, agent in enumerate(agents):
                session = pools.session(n, 4, 90)
                sessions.add(id(session))
                async with await session.post(f"{agent.endpoint}echo", data=b"{}",
                                              headers={}) as reply:
                    assert reply.status == 200
                    await reply.read()
            kept = pools.idle_connections()
            other = pools.session(99, 4, 30)  # another keep-alive: a pool of its own
            await pools.close()
            return len(sessions), kept, id(other) in sessions

        shared, kept, same = asyncio.run(go())
    finally:
        for agent in agents:
            stop_process(agent.proc)

    assert shared == 1 and not same
    assert kept == 2  # five agents called; idle connections kept for two


def test_the_slots_of_agents_no_longer_called_are_forgotten_unless_busy():
    clock = FakeClock()

    async def go():
        pools = UpstreamPools(POLICY, connect_timeout_s=1, clock=clock)
        await pools.slot(1, 4, 1)
        (await pools.slot(1, 4, 1)).release()  # agent 1: one call still holds a slot
        (await pools.slot(2, 4, 1)).release()  # agent 2: done
        clock.advance(pools.SLOT_IDLE_S - 1)
        early = await pools.close_idle()
        clock.advance(2)
        late = await pools.close_idle()
        return early, late, sorted(pools._slots)

    early, late, left = asyncio.run(go())
    assert (early, late) == (0, 1)
    assert left == [(1, 4)]
