"""ASGI entry point: ``/v1/`` and ``/metrics`` go to the gateway (data plane), the rest
to Django; ``lifespan`` goes to the gateway (it owns the background jobs and the
upstream pools); ``websocket`` to the gateway (the reverse tunnel at ``/v1/tunnel``; other
paths are refused cleanly). Built by ``reach_platform.gateway_factory``.
"""

from __future__ import annotations

import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")

import django

django.setup()

from reach_platform.gateway_factory import build_application  # noqa: E402

application, gateway_application = build_application()

# Everything built so far (Django, the route table, the intent index) lives as
# long as the process: keep it out of every garbage-collector pass.
gc.collect()
gc.freeze()
