"""Failed authentication on the REST API, throttled per client address.

After ``AUTH_FAILURE_LIMIT`` (default 20) failed authentications from one address
within a fixed ``AUTH_FAILURE_WINDOW_S`` window (60 s), every further request from that
address that presents credentials gets 429 ``too_many_requests`` with ``Retry-After``
(the seconds left in the window), even with a correct key: guessing keys gets no
answer either way. Counted in process; with ``REDIS_URL`` counted in Redis under
``REACH_REDIS_KEY_PREFIX`` so every process of a deployment shares the count (when
Redis is unreachable each process counts on its own).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from django.conf import settings

from reach_core import outage

logger = logging.getLogger(__name__)

_KEY = "authfail:"


class _LocalCounts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, str], int] = {}

    def incr(self, window: int, address: str) -> int:
        with self._lock:
            # Forget finished windows: the dict never grows past one window's addresses.
            for stale in [k for k in self._counts if k[0] < window]:
                del self._counts[stale]
            key = (window, address)
            self._counts[key] = self._counts.get(key, 0) + 1
            return self._counts[key]

    def get(self, window: int, address: str) -> int:
        with self._lock:
            return self._counts.get((window, address), 0)

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


_local = _LocalCounts()
_redis_client = None
_redis_lock = threading.Lock()
clock: Callable[[], float] = time.time


def _redis():
    global _redis_client
    if not settings.REDIS_URL:
        return None
    with _redis_lock:
        if _redis_client is None:
            import redis

            _redis_client = redis.Redis.from_url(
                settings.REDIS_URL, socket_timeout=0.5, socket_connect_timeout=0.5)
        return _redis_client


def _window() -> tuple[int, float]:
    """The current window's number and the seconds left in it."""
    size = settings.AUTH_FAILURE_WINDOW_S
    now = clock()
    window = int(now // size)
    return window, (window + 1) * size - now


def _redis_key(window: int, address: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}{_KEY}{window}:{address}"


def retry_after(address: str) -> int | None:
    """Seconds until ``address`` may try again, or ``None`` when it is not throttled."""
    if not address or settings.AUTH_FAILURE_LIMIT <= 0:
        return None
    window, left = _window()
    count = _local.get(window, address)
    client = _redis()
    if client is not None and not outage.REDIS.away():
        import redis

        try:
            count = max(count, int(client.get(_redis_key(window, address)) or 0))
        except redis.RedisError as exc:
            outage.REDIS.failed()
            logger.warning("auth throttle: redis unreachable (%s)", type(exc).__name__)
    if count < settings.AUTH_FAILURE_LIMIT:
        return None
    return max(1, math.ceil(left))


def record_failure(address: str) -> None:
    if not address or settings.AUTH_FAILURE_LIMIT <= 0:
        return
    window, _ = _window()
    _local.incr(window, address)
    client = _redis()
    if client is None or outage.REDIS.away():
        return
    import redis

    key = _redis_key(window, address)
    try:
        pipe = client.pipeline()
        pipe.incr(key)
        pipe.expire(key, int(settings.AUTH_FAILURE_WINDOW_S) + 1)
        pipe.execute()
    except redis.RedisError as exc:
        outage.REDIS.failed()
        logger.warning("auth throttle: redis unreachable (%s)", type(exc).__name__)


def reset() -> None:
    """Forget every count (tests)."""
    _local.clear()
    client = _redis()
    if client is not None:
        for key in client.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}{_KEY}*", count=500):
            client.delete(key)
