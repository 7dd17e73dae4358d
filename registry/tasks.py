"""Periodic registry jobs. Thin: each calls one service. Celery beat runs them in
production; the run command's in-process scheduler runs the same functions."""

from __future__ import annotations

import functools
import logging
import os
import socket
from pathlib import Path

import redis
from celery import shared_task
from django.conf import settings

from registry.agents_file import watched_file_apply
from registry.learning import route_feedback_consume, route_feedback_learn
from registry.probe import instances_probe
from registry.services import instances_sweep

logger = logging.getLogger(__name__)


@shared_task(name="registry.sweep_leases", ignore_result=True)
def sweep_leases() -> dict[str, int]:
    return instances_sweep()


@shared_task(name="registry.probe_instances", ignore_result=True)
def probe_instances() -> dict[str, int]:
    return instances_probe()


@shared_task(name="registry.apply_agents_file", ignore_result=True, expires=5)
def apply_agents_file() -> str | None:
    """``REACH_AGENTS_FILE``, applied again when it changed (every second)."""
    if not settings.AGENTS_FILE:
        return None
    outcome = watched_file_apply(path=Path(settings.AGENTS_FILE),
                                 tenant_slug=settings.AGENTS_TENANT,
                                 prune=settings.AGENTS_PRUNE)
    if outcome is not None:
        logger.log(logging.WARNING if outcome.startswith(("refused", "cannot", "no tenant"))
                   else logging.INFO, "agents file %s: %s", settings.AGENTS_FILE, outcome)
    return outcome


# acks_late: a worker killed mid-task leaves the message to be redelivered, like the
# stream entries it held. expires: stale ones queued while workers were away are dropped.
@shared_task(name="registry.consume_route_feedback", ignore_result=True, acks_late=True,
             expires=30, bind=True)
def consume_route_feedback(self) -> int:
    if not settings.REDIS_URL:
        return 0  # embedded mode: the gateway's queue is drained in-process
    # The worker's node name survives a restart, so it re-reads what it held at once.
    consumer = self.request.hostname or f"{socket.gethostname()}-{os.getpid()}"
    return route_feedback_consume(client=_redis(settings.REDIS_URL), consumer=consumer)


@shared_task(name="registry.learn_routes", ignore_result=True)
def learn_routes() -> dict[str, int]:
    return route_feedback_learn()


@functools.cache
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)
