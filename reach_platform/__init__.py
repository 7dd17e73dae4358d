"""Agent-Reach platform: settings, URLs, the ASGI entry point and the run command."""

from reach_platform.celery import app as celery_app

__all__ = ["celery_app"]
