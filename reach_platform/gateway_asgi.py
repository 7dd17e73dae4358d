"""ASGI entry point of a gateway process: the data plane only.

    uvicorn reach_platform.gateway_asgi:application --workers N

Serves ``/v1/``, ``/metrics``, ``/healthz`` and ``/readyz``; every other path is a 404
naming the control plane. Django is set up with ``reach_platform.gateway_settings``
(whatever ``DJANGO_SETTINGS_MODULE`` says: the platform's environment variables configure
both kinds of process alike), so the admin, the API and Celery are never imported.
"""

from __future__ import annotations

import os

os.environ["DJANGO_SETTINGS_MODULE"] = "reach_platform.gateway_settings"

from reach_platform.asgi import application, gateway_application

__all__ = ["application", "gateway_application"]
