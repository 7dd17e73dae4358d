"""Periodic metering jobs. Thin: each calls one service. Celery beat runs them in
production (``reach_platform.celery.PERIODIC``)."""

from __future__ import annotations

import functools
import os
import socket

import redis
from celery import shared_task
from django.conf import settings
from django.utils import timezone

from metering import alerts
from metering.alerts import alerts_check
from metering.budgets import budget_counters_restore
from metering.ingest import CLAIM_IDLE_MS, usage_stream_consume
from metering.rollups import rollup_recent

# One task stores at most this many batches, then leaves the worker to the next
# scheduled one: a backlog is worked off across tasks, none runs unbounded.
_MAX_BATCHES = 200


@functools.cache
def _redis(url: str) -> redis.Redis:
    # Longer than the blocking read, or the read would time out as an error.
    return redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=5)


def _consumer_name(node: str | None) -> str:
    # The worker's node name ("metering@host") survives a restart, so a restarted worker
    # re-reads what it held at once instead of waiting for the idle takeover. Prefork
    # children of one node share it: they may read each other's pending entries, which
    # costs a duplicate delivery, never a duplicate row.
    return node or f"{socket.gethostname()}-{os.getpid()}"


# acks_late: a worker killed mid-task leaves the message to be redelivered, like
# the stream entries it held. expires: beat queues one per second; when workers
# were away those pile up, and stale ones are dropped instead of run.
@shared_task(name="metering.consume_usage", ignore_result=True, acks_late=True, expires=30,
             bind=True)
def consume_usage(self, *, batch: int = 500, block_ms: int = 1000,
                  max_batches: int = _MAX_BATCHES, claim_idle_ms: int = CLAIM_IDLE_MS) -> int:
    if not settings.REDIS_URL:
        return 0  # embedded mode: the gateway's queue is drained in-process
    return usage_stream_consume(
        client=_redis(settings.REDIS_URL), consumer=_consumer_name(self.request.hostname),
        batch=batch,
        block_ms=block_ms, max_batches=max_batches, claim_idle_ms=claim_idle_ms,
    )


@shared_task(name="metering.rollup", ignore_result=True)
def rollup() -> dict[str, int]:
    return rollup_recent(timezone.now())


@shared_task(name="metering.restore_budget_counters", ignore_result=True)
def restore_budget_counters() -> int:
    if not settings.REDIS_URL:
        return 0  # embedded mode: the gateway's counters live and die with the process
    return budget_counters_restore(client=_redis(settings.REDIS_URL),
                                   prefix=settings.REDIS_KEY_PREFIX, now=timezone.now())


@shared_task(name="metering.check_alerts", ignore_result=True)
def check_alerts() -> dict[str, int]:
    return alerts_check(now=timezone.now())


@shared_task(name="metering.deliver_alerts", ignore_result=True)
def deliver_alerts() -> dict[str, int]:
    return alerts.deliver_alerts()
