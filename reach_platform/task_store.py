"""The task table for the gateway (``gateway.tasks.TaskStore``): the ``tasks`` app's services
and selectors, run off the event loop.

Only asynchronous tasks come here: a synchronous call never touches the database. With the
database away a task request is answered 503 ``service_unavailable`` with Retry-After, as
the control plane answers, never a 500.
"""

from __future__ import annotations

import asyncio
import functools

from django.conf import settings
from django.db import Error as DatabaseError
from django.db import close_old_connections
from psycopg_pool import PoolTimeout

from gateway.tasks import Submission, TaskClaim, TaskOutcome
from reach_core.errors import ReachError
from tasks import selectors, services
from tasks.models import Task


async def _db(function, /, *args, **kwargs):
    def run():
        close_old_connections()
        try:
            return function(*args, **kwargs)
        finally:
            close_old_connections()

    try:
        return await asyncio.to_thread(run)
    except services.TaskRefused as refused:
        raise ReachError(refused.code, refused.message) from None
    except (DatabaseError, PoolTimeout) as exc:
        raise ReachError("service_unavailable", "Tasks cannot be reached right now "
                         f"({type(exc).__name__}); retry shortly.",
                         retry_after=settings.DB_UNAVAILABLE_RETRY_AFTER) from None


def _mine(tenant_pk: int, task_id: str) -> Task:
    task = selectors.task_for_tenant(tenant_pk, task_id)
    if task is None:
        raise services.TaskRefused("not_found", "No such task.")
    return task


def push_url(task_id) -> str:
    return f"{settings.PUBLIC_URL}/api/v1/tasks/{task_id}/a2a-push"


class DjangoTaskStore:
    async def submit(self, submission: Submission) -> tuple[dict, bool]:
        def submit():
            task, created = services.task_submit(submission=services.Submission(
                tenant_id=submission.tenant_pk, request_id=submission.request_id,
                request=submission.request, capability=submission.capability,
                fingerprint=submission.fingerprint,
                idempotency_key=submission.idempotency_key,
                callback_url=submission.callback_url,
                signing_secret=submission.signing_secret))
            return selectors.task_view(task, history=False), created
        return await _db(submit)

    async def get(self, tenant_pk: int, task_id: str) -> dict:
        return await _db(lambda: selectors.task_view(_mine(tenant_pk, task_id)))

    async def list(self, tenant_pk: int, state, limit: int, offset: int):
        def listing():
            tasks, count = selectors.tasks_for_tenant(tenant_pk, state=state, limit=limit,
                                                      offset=offset)
            return [selectors.task_view(t, history=False) for t in tasks], count
        return await _db(listing)

    async def cancel(self, tenant_pk: int, task_id: str) -> dict:
        return await _db(lambda: selectors.task_view(
            services.task_cancel(task=_mine(tenant_pk, task_id))))

    async def add_message(self, tenant_pk: int, task_id: str, message: dict) -> dict:
        return await _db(lambda: selectors.task_view(
            services.task_continue(task=_mine(tenant_pk, task_id), message=message)))

    async def events_after(self, tenant_pk: int, task_id: str, after: int):
        def events():
            task = _mine(tenant_pk, task_id) if after == 0 else None
            found, state = selectors.events_after(task.pk if task else task_id, after)
            return [selectors.event_view(e) for e in found], state
        return await _db(events)

    async def claim(self, worker: str, limit: int) -> list[TaskClaim]:
        claimed = await _db(services.task_claim, worker=worker, limit=limit)
        return [TaskClaim(
            task_id=str(c.task.pk), claim=c.claim, tenant_pk=c.task.tenant_id,
            request=c.task.request, request_id=c.task.request_id,
            idempotency_key=c.task.idempotency_key, attempt=c.task.attempts,
            messages=tuple(c.task.messages), instance_pk=c.task.instance_id,
            agent_task_id=c.task.agent_task_id, agent_context_id=c.task.agent_context_id,
            push_url=push_url(c.task.pk), push_token=c.push_token) for c in claimed]

    async def renew(self, worker: str, task_ids: list[str]) -> set[str]:
        return await _db(services.task_renew, worker=worker, ids=task_ids)

    async def finish(self, claim: TaskClaim, outcome: TaskOutcome) -> bool:
        return await _db(functools.partial(
            services.task_finish, task_id=claim.task_id, claim=claim.claim,
            outcome=services.Outcome(
                state=outcome.state, result=outcome.result, error=outcome.error,
                message=outcome.message, capability=outcome.capability,
                agent_id=outcome.agent_pk, instance_id=outcome.instance_pk,
                agent_task_id=outcome.agent_task_id,
                agent_context_id=outcome.agent_context_id,
                retry_after_s=outcome.retry_after_s, reached_agent=outcome.reached_agent)))
