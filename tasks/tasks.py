"""Periodic task jobs. Thin: each calls one service. Celery beat runs them in production
(``reach_platform.celery.PERIODIC``); the embedded run's scheduler runs the same functions.
The tasks themselves run in the workers' task engines (``reach_platform.task_worker``)."""

from __future__ import annotations

from celery import shared_task

from tasks.callbacks import deliver_due
from tasks.services import tasks_sweep


# expires: beat queues one every period; after an outage the stale ones are dropped.
@shared_task(name="tasks.sweep", ignore_result=True, expires=10)
def sweep() -> dict[str, int]:
    return tasks_sweep()


@shared_task(name="tasks.deliver_callbacks", ignore_result=True, expires=10)
def deliver_callbacks() -> dict[str, int]:
    return deliver_due()
