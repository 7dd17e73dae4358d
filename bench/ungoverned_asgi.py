"""The platform's ASGI app without admission and metering: bench/metering.py's baseline."""

from __future__ import annotations

import gc
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")

import django

django.setup()

from reach_platform.gateway_factory import build_application  # noqa: E402

application, gateway_application = build_application(governed=False)
gc.collect()
gc.freeze()
