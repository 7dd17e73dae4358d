"""Liveness and readiness.

``/healthz`` says the process answers. ``/readyz`` says it can do its work:
the database answers, and Redis too when ``REDIS_URL`` is set. A balancer
takes a not-ready process out of rotation; it does not restart it.

Every 503 carries ``Retry-After`` (``REACH_DB_UNAVAILABLE_RETRY_AFTER`` seconds), as
every other 503 of the platform does: the answer is retryable and says when.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import connections
from django.http import JsonResponse
from django.views.decorators.http import require_safe

logger = logging.getLogger(__name__)


def _check_database() -> str | None:
    try:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        # The exception text can carry the DSN; log the class only.
        logger.warning("readyz: database unreachable (%s)", type(exc).__name__)
        return f"database unreachable ({type(exc).__name__})"
    return None


def _check_redis() -> str | None:
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        logger.warning("readyz: redis unreachable (%s)", type(exc).__name__)
        return f"redis unreachable ({type(exc).__name__})"
    finally:
        client.close()
    return None


@require_safe
def healthz(request):
    return JsonResponse({"status": "ok"})


@require_safe
def readyz(request):
    checks = {"database": _check_database}
    if settings.REDIS_URL:
        checks["redis"] = _check_redis
    results = {}
    ready = True
    for name, check in checks.items():
        started = time.perf_counter()
        problem = check()
        results[name] = {
            "ok": problem is None,
            "ms": round((time.perf_counter() - started) * 1000, 1),
            **({"error": problem} if problem else {}),
        }
        ready = ready and problem is None
    response = JsonResponse(
        {"status": "ready" if ready else "not_ready", "checks": results},
        status=200 if ready else 503,
    )
    if not ready:
        response["Retry-After"] = str(settings.DB_UNAVAILABLE_RETRY_AFTER)
    return response
