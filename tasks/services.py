"""Writes for asynchronous tasks: submission, claims and leases, results, agents' reports,
cancelling, continuing, the sweep, and callback deliveries' bookkeeping.

Every state change is a conditional update on the state it was read in (and, for a worker,
on its claim), so two writers never both win: a cancel that lands while a worker finishes
leaves exactly one of them in the row, and the other is told it lost. A result is written in
the same transaction as the delivery that will announce it, so no callback can arrive before
``GET /v1/tasks/<id>`` shows the result.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import random
import secrets
import uuid
from dataclasses import dataclass, field, replace

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from reach_core.kinds import FINAL_TASK_STATES, INTERRUPTED_TASK_STATES
from tasks import doorbell
from tasks.choices import DeliveryStatus, TaskState
from tasks.models import CallbackDelivery, Delivery, SigningSecret, Task, TaskEvent
from tenants import crypto

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 4000


# ---- what a task row can hold ---------------------------------------------------------
# PostgreSQL's text and jsonb refuse U+0000. A caller's NUL is refused with a 400 (not a
# database error retried forever); an agent's answer is kept, each NUL made U+FFFD, since
# refusing it would lose work the agent has done and run it again.


def nul_at(value, path: str = "") -> str | None:
    """The path of the first U+0000 in ``value`` (JSON data), or None."""
    if isinstance(value, str):
        return path or "value" if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            found = nul_at(key, f"{path}(key)") or nul_at(item, f"{path}.{key}" if path
                                                      else str(key))
            if found:
                return found
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = nul_at(item, f"{path}[{index}]")
            if found:
                return found
    return None


def without_nul(value):
    """``value`` with every U+0000 in its strings (and keys) made U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {without_nul(k): without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_nul(item) for item in value]
    return value


def _refuse_nul(**fields) -> None:
    for name, value in fields.items():
        found = nul_at(value)
        if found:
            where = name if found == "value" else f"{name}: {found}"
            raise TaskRefused("invalid_input", f"{where} contains U+0000 (\\u0000), which an "
                              "asynchronous task cannot store; remove it or send the call "
                              "synchronously.")


class TaskRefused(Exception):
    """A request about a task that cannot be done: ``code`` is a catalogue code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---- signing secrets ------------------------------------------------------------------


def signing_secret_create(*, tenant, name: str = "default") -> tuple[SigningSecret, str]:
    """A new secret for ``tenant`` under ``name``; returns it and its plaintext, which is
    never shown again. A name already taken is refused (delete the old one first)."""
    plaintext = "whsec_" + secrets.token_urlsafe(32)
    try:
        with transaction.atomic():
            secret = SigningSecret.objects.create(
                tenant=tenant, name=name, secret_ciphertext=crypto.encrypt(plaintext))
    except IntegrityError:
        raise TaskRefused("conflict", f"A signing secret named {name!r} exists; delete it "
                          "first to replace it.") from None
    return secret, plaintext


def signing_secret_value(secret: SigningSecret) -> str:
    return crypto.decrypt(secret.secret_ciphertext)


# ---- submission -----------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    tenant_id: int
    request_id: str
    request: dict
    capability: str
    fingerprint: str
    idempotency_key: str | None = None  # the caller's
    callback_url: str = ""
    signing_secret: str = "default"  # noqa: S105  (the name of one, not a secret)


def _event(task: Task, state: str, now: dt.datetime, message: str = "",
           progress: float | None = None) -> None:
    TaskEvent.objects.create(task=task, at=now, state=state, message=message[:MAX_MESSAGE_CHARS],
                             progress=progress)


def task_submit(*, submission: Submission, now: dt.datetime | None = None
                ) -> tuple[Task, bool]:
    """The task for ``submission``, committed; ``(task, created)``. With an idempotency key
    already used by this tenant the earlier task is returned, or ``idempotency_key_reused``
    raised if it was submitted with another body. Rings the workers' doorbell."""
    now = now or timezone.now()
    _refuse_nul(input=submission.request.get("body"), request=submission.request,
                idempotency_key=submission.idempotency_key,
                callback_url=submission.callback_url,
                callback_secret=submission.signing_secret)
    secret = None
    if submission.callback_url:
        secret = SigningSecret.objects.filter(tenant_id=submission.tenant_id,
                                              name=submission.signing_secret).first()
        if secret is None:
            raise TaskRefused("invalid_input", f"This tenant has no signing secret named "
                              f"{submission.signing_secret!r} to sign callbacks with: create "
                              "one with POST /api/v1/signing-secrets/.")
    key = submission.idempotency_key
    try:
        with transaction.atomic():
            task = Task.objects.create(
                tenant_id=submission.tenant_id, request_id=submission.request_id,
                idempotency_key=key or f"task-{uuid.uuid4().hex}", caller_key=key is not None,
                fingerprint=submission.fingerprint, request=submission.request,
                capability=submission.capability, run_after=now,
                deadline_at=now + dt.timedelta(seconds=settings.TASK_DEADLINE_S),
                callback_url=submission.callback_url, signing_secret=secret)
            _event(task, TaskState.SUBMITTED, now)
    except IntegrityError:
        if key is None:
            raise
        # The same key again (a retried submission, or two at once): one task.
        task = Task.objects.get(tenant_id=submission.tenant_id, idempotency_key=key)
        if not hmac.compare_digest(task.fingerprint, submission.fingerprint):
            raise TaskRefused("idempotency_key_reused", "This Idempotency-Key was used "
                              "with a different request body.") from None
        return task, False
    transaction.on_commit(doorbell.ring)
    return task, True


# ---- claims ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    """A task a worker now runs, with what it needs to run it."""

    task: Task
    claim: str
    push_token: str  # for an A2A agent's push notifications about this attempt


def task_claim(*, worker: str, limit: int, now: dt.datetime | None = None,
               ids: list | None = None) -> list[Claimed]:
    """Claim up to ``limit`` submitted tasks that are due (oldest first), or those of
    ``ids``: each with a conditional update and a lease of ``TASK_LEASE_S``. Locked rows
    are skipped, so workers claiming at once share the work instead of queueing on it."""
    now = now or timezone.now()
    lease = now + dt.timedelta(seconds=settings.TASK_LEASE_S)
    out = []
    with transaction.atomic():
        due = Task.objects.filter(state=TaskState.SUBMITTED, run_after__lte=now)
        if ids is not None:
            due = due.filter(pk__in=ids)
        picked = list(due.select_for_update(skip_locked=True).order_by("run_after")
                      .values_list("pk", flat=True)[:limit])
        for pk in picked:
            claim = f"{worker}:{uuid.uuid4().hex[:12]}"
            token = secrets.token_urlsafe(24)
            if Task.objects.filter(pk=pk, state=TaskState.SUBMITTED).update(
                    state=TaskState.WORKING, claim=claim, lease_expires_at=lease,
                    attempts=F("attempts") + 1, push_token_hash=_digest(token)):
                task = Task.objects.get(pk=pk)
                _event(task, TaskState.WORKING, now, f"attempt {task.attempts}")
                out.append(Claimed(task, claim, token))
    return out


def task_renew(*, worker: str, ids: list, now: dt.datetime | None = None) -> set[str]:
    """Extend the leases of the tasks ``worker`` runs; returns the ids it still holds (a
    task canceled, or handed on after a lapsed lease, is no longer its to run)."""
    if not ids:
        return set()
    now = now or timezone.now()
    mine = Task.objects.filter(pk__in=ids, state=TaskState.WORKING,
                               claim__startswith=f"{worker}:")
    mine.update(lease_expires_at=now + dt.timedelta(seconds=settings.TASK_LEASE_S))
    return {str(pk) for pk in mine.values_list("pk", flat=True)}


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended. ``retry_after_s``: the failure may pass (no healthy
    instance, a limit, an agent's error): run the task again that much later, while
    attempts are left; a try that called no agent (``reached_agent`` False) uses none."""

    state: str
    result: dict | None = None
    error: dict | None = None
    message: str = ""
    capability: str = ""
    agent_id: int | None = None
    instance_id: int | None = None
    agent_task_id: str = ""
    agent_context_id: str = ""
    retry_after_s: float | None = None
    reached_agent: bool = True  # False: no agent was called, the try is not an attempt
    extra: dict = field(default_factory=dict)


def task_finish(*, task_id, claim: str, outcome: Outcome, now: dt.datetime | None = None
                ) -> bool:
    """Record how ``claim``'s attempt ended. False when the claim no longer holds (the task
    was cancelled, or its lease lapsed and it was handed on): the attempt's result is then
    not the task's."""
    now = now or timezone.now()
    outcome = replace(outcome, result=without_nul(outcome.result),
                      error=without_nul(outcome.error), message=without_nul(outcome.message),
                      agent_task_id=without_nul(outcome.agent_task_id),
                      agent_context_id=without_nul(outcome.agent_context_id))
    with transaction.atomic():
        held = Task.objects.select_for_update().filter(
            pk=task_id, state=TaskState.WORKING, claim=claim).first()
        if held is None:
            return False
        held.capability = outcome.capability or held.capability
        if outcome.agent_id is not None:
            held.agent_id, held.instance_id = outcome.agent_id, outcome.instance_id
        held.agent_task_id = outcome.agent_task_id or held.agent_task_id
        held.agent_context_id = outcome.agent_context_id or held.agent_context_id
        held.claim, held.lease_expires_at = "", None
        if outcome.retry_after_s is not None and (
                not outcome.reached_agent or held.attempts < settings.TASK_MAX_ATTEMPTS):
            if not outcome.reached_agent:  # the task's deadline bounds these retries
                held.attempts = max(0, held.attempts - 1)
            held.state = TaskState.SUBMITTED
            held.run_after = now + dt.timedelta(seconds=outcome.retry_after_s)
            held.error = outcome.error
            held.save()
            _event(held, TaskState.SUBMITTED, now,
                   f"retrying in {outcome.retry_after_s:g} s: "
                   f"{(outcome.error or {}).get('message', '')}")
            return True
        state = TaskState.FAILED if outcome.retry_after_s is not None else outcome.state
        _settle(held, state, now, result=outcome.result, error=outcome.error,
                message=outcome.message)
    return True


def _settle(task: Task, state: str, now: dt.datetime, *, result=None, error=None,
            message: str = "", progress: float | None = None) -> None:
    """Write ``state`` (and what comes with it) to a row locked or just claimed, with its
    event and, for a state the caller must hear of, its callback delivery."""
    task.state = state
    task.message = (message or "")[:MAX_MESSAGE_CHARS]
    if progress is not None:
        task.progress = progress
    if result is not None:
        task.result = result
    if error is not None or state not in (TaskState.FAILED, TaskState.REJECTED):
        task.error = error
    if state in FINAL_TASK_STATES:
        task.finished_at = now
        task.claim, task.lease_expires_at = "", None
    task.save()
    _event(task, state, now, task.message, progress)
    if task.callback_url and (state in FINAL_TASK_STATES or state in INTERRUPTED_TASK_STATES):
        CallbackDelivery.objects.create(task=task, state=state, next_attempt_at=now)


# ---- what callers and agents do to a task ------------------------------------------------


def task_cancel(*, task: Task, now: dt.datetime | None = None) -> Task:
    now = now or timezone.now()
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        if locked.state in FINAL_TASK_STATES:
            raise TaskRefused("conflict", f"The task is {locked.state}; it cannot be "
                              "canceled.")
        _settle(locked, TaskState.CANCELED, now, message="canceled by the caller")
    return locked


def task_continue(*, task: Task, message: dict, now: dt.datetime | None = None) -> Task:
    """The caller's answer to an agent that asked for input: the task goes on, with the
    same instance while it is alive."""
    now = now or timezone.now()
    _refuse_nul(input=message.get("input"))
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        if locked.state not in INTERRUPTED_TASK_STATES:
            raise TaskRefused("conflict", f"The task is {locked.state}; only a task that is "
                              "input-required or auth-required takes a message.")
        locked.messages = [*locked.messages, message]
        locked.state = TaskState.SUBMITTED
        locked.run_after = now
        locked.save()
        _event(locked, TaskState.SUBMITTED, now, "the caller answered")
    transaction.on_commit(doorbell.ring)
    return locked


REPORTABLE = {TaskState.WORKING, TaskState.INPUT_REQUIRED, TaskState.AUTH_REQUIRED,
              TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED, TaskState.REJECTED}


@dataclass(frozen=True)
class Report:
    """An agent's word on a task it holds (``POST /api/v1/tasks/<id>/status``, or an A2A
    push notification)."""

    state: str
    message: str = ""
    progress: float | None = None
    output: object = None
    error: str = ""


def task_report(*, task: Task, agent_id: int, report: Report,
                now: dt.datetime | None = None) -> Task:
    """Record ``report`` from the agent that holds ``task``. A task in a final state takes
    no report (409); another agent's report is refused (404: it does not see the task)."""
    now = now or timezone.now()
    report = replace(report, message=without_nul(report.message),
                     output=without_nul(report.output), error=without_nul(report.error))
    if report.state not in REPORTABLE:
        raise TaskRefused("invalid_input", f"'state' must be one of {sorted(REPORTABLE)}.")
    with transaction.atomic():
        locked = Task.objects.select_for_update().get(pk=task.pk)
        if locked.agent_id != agent_id:
            raise TaskRefused("not_found", "No such task for this agent.")
        if locked.state in FINAL_TASK_STATES:
            raise TaskRefused("conflict", f"The task is already {locked.state}.")
        if locked.state == TaskState.WORKING and locked.claim:
            # A worker still has the attempt that handed the task over: the report is
            # the later word, so the worker's own finish will find its claim gone.
            locked.claim, locked.lease_expires_at = "", None
        result = error = None
        if report.state == TaskState.COMPLETED:
            result = {"request_id": locked.request_id, "capability": locked.capability,
                      "agent": locked.agent.name if locked.agent else None,
                      "reply_content": report.message or None, "output": report.output}
        elif report.state in (TaskState.FAILED, TaskState.REJECTED):
            error = {"code": "upstream_error" if report.state == TaskState.FAILED
                     else "upstream_refused",
                     "message": report.error or report.message or f"the agent reported "
                                                                  f"{report.state}"}
        _settle(locked, report.state, now, result=result, error=error,
                message=report.message, progress=report.progress)
    return locked


def push_token_matches(task: Task, token: str | None) -> bool:
    return bool(token and task.push_token_hash) and hmac.compare_digest(
        task.push_token_hash, _digest(token))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# ---- the sweep ------------------------------------------------------------------------


def tasks_sweep(*, now: dt.datetime | None = None) -> dict[str, int]:
    """Tasks nobody will finish otherwise: a worker's lapsed claim is handed on (or, after
    ``TASK_MAX_ATTEMPTS`` attempts, failed as ``worker_lost``); a task past its deadline
    fails as ``deadline_exceeded``. Every attempt carries the task's Idempotency-Key, so an
    agent that already had the call can tell the repeat. Returns counts."""
    now = now or timezone.now()
    counts = {"requeued": 0, "lost": 0, "expired": 0}
    lapsed = Task.objects.filter(state=TaskState.WORKING, lease_expires_at__lt=now) \
        .exclude(claim="").values_list("pk", flat=True)
    for pk in list(lapsed[:1000]):
        with transaction.atomic():
            task = Task.objects.select_for_update(skip_locked=True).filter(
                pk=pk, state=TaskState.WORKING, lease_expires_at__lt=now).exclude(
                claim="").first()
            if task is None:
                continue
            # The lost attempt's own usage event died with its worker: it is stored
            # here, in this transaction, so the attempt is metered once either way.
            _lost_attempt_store(task, now)
            if task.attempts >= settings.TASK_MAX_ATTEMPTS:
                _settle(task, TaskState.FAILED, now, error={
                    "code": "worker_lost", "message": f"the worker running it was lost "
                    f"{task.attempts} times"})
                counts["lost"] += 1
                continue
            task.state, task.claim, task.lease_expires_at = TaskState.SUBMITTED, "", None
            task.run_after = now
            task.save()
            _event(task, TaskState.SUBMITTED, now, "the worker running it was lost; "
                                                   "running it again")
            counts["requeued"] += 1
    expired = Task.objects.filter(deadline_at__lt=now).exclude(
        state__in=FINAL_TASK_STATES).values_list("pk", flat=True)
    for pk in list(expired[:1000]):
        with transaction.atomic():
            task = Task.objects.select_for_update(skip_locked=True).filter(
                pk=pk, deadline_at__lt=now).exclude(state__in=FINAL_TASK_STATES).first()
            if task is not None:
                _settle(task, TaskState.FAILED, now, error={
                    "code": "deadline_exceeded", "message": "the task did not finish within "
                    f"{settings.TASK_DEADLINE_S} s"})
                counts["expired"] += 1
    if counts["requeued"]:
        doorbell.ring()
    return counts


def _lost_attempt_store(task: Task, now: dt.datetime) -> None:
    """The usage event of the attempt a lost worker was running: ``worker_lost``, with
    what the task knows of it (the agent and instance it ran on, when known). Its id
    names the task and the attempt, so it is stored once however often it is made."""
    # Here, not at the top: the gateway process imports this module (its task store)
    # without the metering app, and only the control plane's sweep stores usage.
    from metering.ingest import usage_events_store
    from registry.models import Capability

    capability = None
    if task.agent_id is not None and task.capability:
        capability = Capability.objects.filter(
            agent_id=task.agent_id, capability_id=task.capability).values_list(
            "pk", flat=True).first()
    usage_events_store([{
        "event_id": f"task-{task.pk}-attempt-{task.attempts}-lost",
        "request_id": task.request_id, "tenant": task.tenant_id, "agent": task.agent_id,
        "capability": capability, "instance": task.instance_id, "outcome": "worker_lost",
        "occurred_at": now.timestamp()}])


# ---- callback deliveries --------------------------------------------------------------


DELIVERY_HOLD_S = 60.0  # a sender's hold on a delivery it posts (longer than its deadline)


def deliveries_claim(*, limit: int, now: dt.datetime | None = None,
                     model: type[Delivery] = CallbackDelivery) -> list:
    """Due deliveries of ``model`` (task callbacks, or alerts), each held for
    ``DELIVERY_HOLD_S`` by the caller (a sender that dies mid-post lets go when the hold
    lapses)."""
    now = now or timezone.now()
    hold = now + dt.timedelta(seconds=DELIVERY_HOLD_S)
    with transaction.atomic():
        due = list(model.objects.select_for_update(skip_locked=True).filter(
            Q(claimed_until__isnull=True) | Q(claimed_until__lt=now),
            status=DeliveryStatus.PENDING, next_attempt_at__lte=now,
        ).order_by("next_attempt_at")[:limit])
        model.objects.filter(pk__in=[d.pk for d in due]).update(claimed_until=hold)
    return due


def delivery_record(*, delivery: Delivery, status: int | None, error: str = "",
                    now: dt.datetime | None = None) -> Delivery:
    """One attempt's answer: a 2xx acknowledges; anything else is retried after 1 s, 2 s,
    4 s, ... (jittered) until ``CALLBACK_RETRIES`` retries are spent."""
    now = now or timezone.now()
    delivery.attempts += 1
    delivery.last_status = status
    delivery.last_error = error[:2000]
    delivery.claimed_until = None
    if status is not None and 200 <= status < 300:
        delivery.status = DeliveryStatus.DELIVERED
        delivery.delivered_at = now
    elif delivery.attempts > settings.CALLBACK_RETRIES:
        delivery.status = DeliveryStatus.EXHAUSTED
    else:
        delay = settings.CALLBACK_BACKOFF_S * 2 ** (delivery.attempts - 1)
        delivery.next_attempt_at = now + dt.timedelta(seconds=delay * random.uniform(0.8, 1.2))
    delivery.save(update_fields=["attempts", "last_status", "last_error", "claimed_until",
                                 "status", "delivered_at", "next_attempt_at"])
    return delivery


def delivery_retrigger(*, delivery: Delivery, now: dt.datetime | None = None) -> Delivery:
    """Deliver again, now, an undelivered (or delivered) announcement: same delivery id,
    a fresh set of retries."""
    now = now or timezone.now()
    type(delivery).objects.filter(pk=delivery.pk).update(
        status=DeliveryStatus.PENDING, attempts=0, next_attempt_at=now, claimed_until=None,
        delivered_at=None)
    delivery.refresh_from_db()
    return delivery
