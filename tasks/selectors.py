"""Reads of asynchronous tasks, in the one shape callers see (``/v1/tasks``, the API)."""

from __future__ import annotations

import uuid

from tasks.models import CallbackDelivery, Task, TaskEvent

MAX_PAGE = 1000


def _time(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def event_view(event: TaskEvent) -> dict:
    view = {"seq": event.pk, "state": event.state, "at": _time(event.at)}
    if event.message:
        view["message"] = event.message
    if event.progress is not None:
        view["progress"] = event.progress
    return view


def delivery_view(delivery: CallbackDelivery) -> dict:
    return {"id": str(delivery.pk), "state": delivery.state, "status": delivery.status,
            "attempts": delivery.attempts, "last_status": delivery.last_status,
            "last_error": delivery.last_error or None,
            "next_attempt_at": _time(delivery.next_attempt_at)
            if delivery.status == "pending" else None,
            "delivered_at": _time(delivery.delivered_at)}


def task_view(task: Task, *, history: bool = True, for_agent: bool = False) -> dict:
    """The task as a caller sees it. The callback URL is the caller's own; the signing
    secret is named, never shown. The agent holding the task (``for_agent``, perhaps
    another tenant's public agent) does not see the caller's callback."""
    view = {
        "id": str(task.pk), "state": task.state, "request_id": task.request_id,
        "idempotency_key": task.idempotency_key, "capability": task.capability or None,
        "agent": task.agent.name if task.agent_id and task.agent else None,
        "message": task.message or None, "progress": task.progress,
        "result": task.result, "error": task.error, "attempts": task.attempts,
        "created_at": _time(task.created_at), "updated_at": _time(task.updated_at),
        "finished_at": _time(task.finished_at), "deadline_at": _time(task.deadline_at),
    }
    if history:
        view["history"] = [event_view(e) for e in task.events.all()]
    if task.callback_url and not for_agent:
        view["callback"] = {
            "url": task.callback_url,
            "signing_secret": task.signing_secret.name if task.signing_secret else None,
            "deliveries": [delivery_view(d) for d in task.deliveries.all()],
        }
    return view


def task_for_tenant(tenant_id: int, task_id) -> Task | None:
    """The tenant's task ``task_id`` (any string), None if it is not the tenant's or not a
    task at all: another tenant's task is as absent as one that never existed."""
    try:
        pk = uuid.UUID(str(task_id))
    except ValueError:
        return None
    return (Task.objects.filter(tenant_id=tenant_id, pk=pk)
            .select_related("agent", "signing_secret").first())


def tasks_for_tenant(tenant_id: int, *, state: str | None = None, limit: int = 100,
                     offset: int = 0) -> tuple[list[Task], int]:
    rows = Task.objects.filter(tenant_id=tenant_id).select_related("agent", "signing_secret")
    if state:
        rows = rows.filter(state=state)
    return list(rows.order_by("-created_at")[offset:offset + limit]), rows.count()


def events_after(task_id, after: int) -> tuple[list[TaskEvent], str]:
    """The task's events after ``after`` (an event's ``seq``) and its state now."""
    events = list(TaskEvent.objects.filter(task_id=task_id, pk__gt=after).order_by("pk"))
    state = Task.objects.filter(pk=task_id).values_list("state", flat=True).first()
    return events, state
