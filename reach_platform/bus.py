"""The process's route-table bus: Redis pub/sub when ``REDIS_URL`` is set, else in-process."""

from __future__ import annotations

from functools import cache

from django.conf import settings

from routing.bus import InProcessBus, RedisBus


@cache
def route_bus() -> InProcessBus | RedisBus:
    if settings.REDIS_URL:
        return RedisBus(settings.REDIS_URL, channel=f"{settings.REDIS_KEY_PREFIX}routes")
    return InProcessBus()
