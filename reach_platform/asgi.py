"""ASGI entry point: ``/v1/`` goes to the gateway (data plane), the rest to Django.

This is the one place the two planes are wired together: the gateway gets a
callable returning the current route table, kept current by the subscriber.
"""

from __future__ import annotations

import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")

from channels.routing import ProtocolTypeRouter
from django.core.asgi import get_asgi_application

django_application = get_asgi_application()

from django.conf import settings  # noqa: E402

from gateway.app import GatewayApp  # noqa: E402
from gateway.breaker import CircuitBreakers  # noqa: E402
from gateway.config import GatewayConfig  # noqa: E402
from reach_platform.routes_runtime import start_route_subscriber  # noqa: E402
from registry.services import endpoint_policy  # noqa: E402
from routing.embedders import configured_embedder  # noqa: E402
from routing.router import IntentIndexHolder, Router  # noqa: E402

_runtime = start_route_subscriber()
_intents = IntentIndexHolder(embedder=configured_embedder(settings.INTENT_EMBEDDER),
                             threshold=settings.INTENT_THRESHOLD)
_intents.follow(_runtime.subscriber)
_router = Router(index=_intents)
gateway_application = GatewayApp(
    table=lambda: _runtime.subscriber.table,
    router=_router,
    config=GatewayConfig(
        policy=endpoint_policy(),
        credential_keys=tuple(settings.CREDENTIAL_KEYS),
        max_body_bytes=settings.GATEWAY_MAX_BODY_BYTES,
        stream_idle_timeout_s=settings.GATEWAY_STREAM_IDLE_S,
        internal_networks=settings.GATEWAY_INTERNAL_NETWORKS,
    ),
    breakers=CircuitBreakers(
        window_seconds=settings.GATEWAY_BREAKER_WINDOW_S,
        failure_ratio=settings.GATEWAY_BREAKER_FAILURE_RATIO,
        min_volume=settings.GATEWAY_BREAKER_MIN_VOLUME,
        cooldown_seconds=settings.GATEWAY_BREAKER_COOLDOWN_S,
    ),
    governed=settings.GATEWAY_GOVERNED,
)
if settings.REDIS_URL:
    # Shared by every gateway process: idempotency records, usage stream.
    import redis.asyncio as aioredis

    from gateway.idempotency import RedisStore
    from gateway.usage import ship_to_redis

    _redis = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=1,
                                     socket_connect_timeout=1)
    gateway_application.idempotency = RedisStore(_redis, settings.REDIS_KEY_PREFIX)
    from gateway.governance import Governor, RedisUsageCounters
    from gateway.limits import LeasingLimiter, RedisLimiter
    from gateway.metrics import LIMITS_DEGRADED

    gateway_application.governor = Governor(
        limiter=LeasingLimiter(RedisLimiter(_redis, prefix=settings.REDIS_KEY_PREFIX,
                                            fail_open=settings.RATE_LIMIT_FAIL_OPEN,
                                            on_degraded=LIMITS_DEGRADED.inc)),
        counters=RedisUsageCounters(_redis, settings.REDIS_KEY_PREFIX),
        on_degraded=LIMITS_DEGRADED.inc,
    )
    gateway_application.background.append(
        lambda: ship_to_redis(gateway_application.usage, _redis,
                              settings.REDIS_KEY_PREFIX + "usage"))
# The router skips instances whose breaker is open: the gateway's breakers feed it.
_router.set_open_breakers(gateway_application.breakers.open_instances)

async def http_application(scope, receive, send) -> None:
    """``/v1/…`` and ``/metrics`` to the gateway, the rest to Django.

    A prefix test rather than Channels' ``URLRouter``: this runs for every gateway
    call, and URL resolution plus a scope copy cost more than the test does."""
    path = scope["path"]
    if path.startswith("/v1/") or path == "/metrics":
        await gateway_application(scope, receive, send)
    else:
        await django_application(scope, receive, send)


application = ProtocolTypeRouter({"http": http_application})

# Everything built so far (Django, the route table, the intent index) lives as
# long as the process: keep it out of every garbage-collector pass.
gc.collect()
gc.freeze()
