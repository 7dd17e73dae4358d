"""ASGI entry point: ``/v1/`` goes to the gateway (data plane), the rest to Django."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")

from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application
from django.urls import re_path

django_application = get_asgi_application()

from gateway.app import application as gateway_application  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": URLRouter(
            [
                re_path(r"^v1/", gateway_application),
                re_path(r"", django_application),
            ]
        ),
    }
)
