"""ASGI entry point: ``/v1/`` goes to the gateway (data plane), the rest to Django.

This is the one place the two planes are wired together: the gateway gets a
callable returning the current route table, kept current by the subscriber.
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")

from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application
from django.urls import re_path

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
        internal_networks=settings.GATEWAY_INTERNAL_NETWORKS,
    ),
    breakers=CircuitBreakers(
        window_seconds=settings.GATEWAY_BREAKER_WINDOW_S,
        failure_ratio=settings.GATEWAY_BREAKER_FAILURE_RATIO,
        min_volume=settings.GATEWAY_BREAKER_MIN_VOLUME,
        cooldown_seconds=settings.GATEWAY_BREAKER_COOLDOWN_S,
    ),
)
# The router skips instances whose breaker is open: the gateway's breakers feed it.
_router.set_open_breakers(gateway_application.breakers.open_instances)

application = ProtocolTypeRouter(
    {
        "http": URLRouter(
            [
                re_path(r"^v1/", gateway_application),
                re_path(r"^metrics$", gateway_application),
                re_path(r"", django_application),
            ]
        ),
    }
)
