"""The task engine of a Celery worker process: asynchronous tasks run here in production.

``celery -A reach_platform worker`` imports this module (``CELERY_IMPORTS``). Each process
that runs Celery tasks (each prefork child; the worker itself with ``--pool solo`` or
``threads``) starts one engine in a thread of its own: its own event loop, its own gateway
(route table followed from the database and the bus, upstream pools, breakers, limits,
budgets, usage shipped to the metering stream), claiming due tasks from the database and
woken by the gateways' rings. ``REACH_TASK_CONCURRENCY=0`` keeps a worker out of it.

A worker that dies (even ``kill -9``) loses nothing: the tasks it held are run again by
another once their leases lapse (``tasks.sweep``).
"""

from __future__ import annotations

import asyncio
import logging
import threading

from celery.signals import worker_process_init, worker_ready
from django.conf import settings

logger = logging.getLogger(__name__)

_started = threading.Event()


def start() -> None:
    """Start this process's engine, once."""
    if settings.TASK_CONCURRENCY <= 0 or _started.is_set():
        return
    _started.set()
    threading.Thread(target=_serve, name="task-engine", daemon=True).start()


def _serve() -> None:
    from reach_platform.gateway_factory import following_gateway

    gateway = following_gateway(run_tasks=True)
    logger.info("task engine: running up to %s tasks at once", settings.TASK_CONCURRENCY)
    asyncio.run(_run(gateway))


async def _run(gateway) -> None:
    try:
        await gateway.run_background()
    finally:
        await gateway.close()


@worker_process_init.connect
def _in_a_pool_process(**_) -> None:
    start()


@worker_ready.connect
def _in_the_worker(sender=None, **_) -> None:
    # A prefork worker's children run the engines (above); a worker that runs its tasks
    # itself (solo, threads) runs one here.
    pool = getattr(sender, "pool", None)
    if pool is not None and "prefork" not in type(pool).__module__:
        start()
