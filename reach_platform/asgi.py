"""ASGI entry point: ``/v1/`` and ``/metrics`` go to the gateway (data plane), the rest
to Django; ``lifespan`` goes to the gateway (it owns the background jobs and the
upstream pools); ``websocket`` to the gateway (the reverse tunnel at ``/v1/tunnel``; other
paths are refused cleanly). Built by ``reach_platform.gateway_factory``.
"""

from __future__ import annotations

import gc
import os

# Everything built from here on (Django, the route table, the intent index) lives as long
# as the process: collecting while it is built finds nothing to free and, at 10,000
# agents, cost a third of the first table load (0.4 of 1.5 s). Frozen at the end instead.
gc.disable()
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")

import django  # noqa: E402

django.setup()

from reach_platform.gateway_factory import build_application  # noqa: E402

try:
    application, gateway_application = build_application()
finally:
    # Out of every later garbage-collector pass, and collection on again for what calls
    # allocate. No collection first: what import and the build left as garbage is small,
    # and a full pass over the table cost 0.2 s of first serve.
    gc.freeze()
    gc.enable()
