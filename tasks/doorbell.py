"""Telling task workers that work is due, so they need not wait for their next poll.

A ring is a hint, never the truth: workers find due tasks in the database (and poll it
every second when idle), so a lost ring costs a second, never a task. With Redis, rings
are published on ``<prefix>tasks`` for the worker processes; in the embedded mode the
in-process engine registers itself with ``listen``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache

from django.conf import settings

from reach_core import outage

logger = logging.getLogger(__name__)

_listeners: list[Callable[[], None]] = []


def channel() -> str:
    return f"{settings.REDIS_KEY_PREFIX}tasks"


def listen(callback: Callable[[], None]) -> None:
    """Call ``callback`` (from any thread) on every ring of this process."""
    _listeners.append(callback)


def ring() -> None:
    for callback in _listeners:
        callback()
    if settings.REDIS_URL and not outage.REDIS.away():
        try:
            _client(settings.REDIS_URL).publish(channel(), b"1")
        except Exception as exc:  # the workers' poll finds the task anyway
            logger.warning("task doorbell: publish failed (%s)", type(exc).__name__)
            outage.REDIS.failed()


@cache
def _client(url: str):
    import redis

    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
