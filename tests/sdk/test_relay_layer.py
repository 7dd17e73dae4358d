"""The channel layer the tunnel relay listens on, as production configures it."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer

from tests.sdk.conftest import needs_services

pytestmark = needs_services


def test_an_idle_relay_inbox_waits_quietly_past_the_redis_block():
    """channels-redis blocks on Redis 5 s per receive: a socket timeout shorter than that
    turned every idle receive into an error (and a warning and a 1 s pause in the relay)."""
    layer = get_channel_layer()
    assert type(layer).__name__ == "RedisChannelLayer"

    async def idle_then_message() -> dict:
        channel = await layer.new_channel("tunnel.")
        with pytest.raises(asyncio.TimeoutError):  # ours, not Redis': nothing came
            await asyncio.wait_for(layer.receive(channel), 6.5)
        await layer.send(channel, {"type": "tunnel.request", "call": "x"})
        return await asyncio.wait_for(layer.receive(channel), 5)

    assert asyncio.run(idle_then_message())["call"] == "x"
