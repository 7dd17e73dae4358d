"""The task table's rules, against the database: claims, races, the sweep, deliveries."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from metering.models import UsageEvent
from tasks.models import CallbackDelivery, Task
from tasks.services import (
    Outcome,
    Report,
    Submission,
    TaskRefused,
    delivery_record,
    delivery_retrigger,
    signing_secret_create,
    task_cancel,
    task_claim,
    task_finish,
    task_report,
    task_submit,
    tasks_sweep,
)
from tests import factories

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def submission(tenant, n: int = 0, **kw) -> Submission:
    return Submission(tenant_id=tenant.pk, request_id=f"r{n}",
                      request={"body": {"capability": "c", "input": {"n": n}}},
                      capability="c", fingerprint=f"f{n}", **kw)


@pytest.mark.django_db
def test_the_same_key_gives_the_same_task_and_another_body_is_refused():
    tenant = factories.tenant()
    first, created = task_submit(submission=submission(tenant, 1, idempotency_key="k"))
    again, created_again = task_submit(submission=submission(tenant, 1, idempotency_key="k"))
    with pytest.raises(TaskRefused) as refused:
        task_submit(submission=Submission(**{**submission(tenant, 1).__dict__,
                                             "idempotency_key": "k", "fingerprint": "other"}))
    other_tenant, _ = task_submit(submission=submission(factories.tenant(), 1,
                                                        idempotency_key="k"))
    assert (created, created_again, again.pk) == (True, False, first.pk)
    assert refused.value.code == "idempotency_key_reused"
    assert other_tenant.pk != first.pk  # keys are per tenant


@pytest.mark.django_db
def test_a_callback_needs_a_signing_secret_of_that_name():
    tenant = factories.tenant()
    with pytest.raises(TaskRefused, match="no signing secret named 'default'"):
        task_submit(submission=submission(tenant, callback_url="http://127.0.0.1:9/"))
    signing_secret_create(tenant=tenant)
    task, _ = task_submit(submission=submission(tenant, callback_url="http://127.0.0.1:9/"))
    with pytest.raises(TaskRefused) as taken:
        signing_secret_create(tenant=tenant)
    assert task.signing_secret.name == "default" and taken.value.code == "conflict"


needs_postgres = pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="row locks need PostgreSQL (.ci/run sets it)")


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_workers_claiming_at_once_never_claim_the_same_task():
    tenant = factories.tenant()
    for n in range(60):
        task_submit(submission=submission(tenant, n))
    claimed: dict[str, list] = {}
    start = threading.Barrier(3)

    def claim(worker: str) -> None:
        start.wait()
        try:
            got = []
            while batch := task_claim(worker=worker, limit=7):
                got += [c.task.pk for c in batch]
            claimed[worker] = got
        finally:
            close_old_connections()

    threads = [threading.Thread(target=claim, args=(f"w{n}",)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    every = [pk for got in claimed.values() for pk in got]
    assert len(every) == 60 and len(set(every)) == 60
    assert all(Task.objects.filter(state="working").values_list("attempts", flat=True))


@pytest.mark.django_db
def test_a_cancel_and_a_finish_never_both_win():
    tenant = factories.tenant()
    task_submit(submission=submission(tenant, 1))
    (claimed,) = task_claim(worker="w", limit=1)
    task_cancel(task=claimed.task)
    finished = task_finish(task_id=claimed.task.pk, claim=claimed.claim,
                           outcome=Outcome(state="completed", result={"x": 1}))
    task = Task.objects.get(pk=claimed.task.pk)
    assert finished is False and task.state == "canceled" and task.result is None

    task_submit(submission=submission(tenant, 2))
    (other,) = task_claim(worker="w", limit=1)
    assert task_finish(task_id=other.task.pk, claim=other.claim,
                       outcome=Outcome(state="completed", result={"x": 2}))
    with pytest.raises(TaskRefused) as late:
        task_cancel(task=other.task)
    assert late.value.code == "conflict"
    # A stale claim (its lease lapsed, the task handed on) finishes nothing either.
    assert task_finish(task_id=other.task.pk, claim="w:stale",
                       outcome=Outcome(state="failed")) is False


@pytest.mark.django_db
def test_the_sweep_hands_on_lapsed_claims_fails_the_lost_and_the_late():
    tenant = factories.tenant()
    for n in range(3):
        task_submit(submission=submission(tenant, n), now=NOW)
    claims = task_claim(worker="w", limit=3, now=NOW)
    lost = claims[1].task
    Task.objects.filter(pk=lost.pk).update(attempts=settings.TASK_MAX_ATTEMPTS)
    late = claims[2].task
    Task.objects.filter(pk=late.pk).update(state="input-required", claim="",
                                           deadline_at=NOW + dt.timedelta(seconds=30))

    later = NOW + dt.timedelta(seconds=settings.TASK_LEASE_S + 31)
    counts = tasks_sweep(now=later)

    states = dict(Task.objects.values_list("pk", "state"))
    assert counts == {"requeued": 1, "lost": 1, "expired": 1}
    assert states[claims[0].task.pk] == "submitted"
    assert states[lost.pk] == "failed" and states[late.pk] == "failed"
    assert Task.objects.get(pk=lost.pk).error["code"] == "worker_lost"
    assert Task.objects.get(pk=late.pk).error["code"] == "deadline_exceeded"
    # The claim is gone: the worker that lost it cannot finish it any more.
    assert task_finish(task_id=claims[0].task.pk, claim=claims[0].claim,
                       outcome=Outcome(state="completed")) is False
    (again,) = task_claim(worker="w2", limit=5, now=later)
    assert again.task.pk == claims[0].task.pk and again.task.attempts == 2
    # Each lost attempt is metered (its worker's own event died with it), once: a
    # break test found tasks failed as worker_lost with no usage row at all.
    lost_events = UsageEvent.objects.filter(outcome="worker_lost")
    assert sorted(lost_events.values_list("request_id", "tenant_id")) == [
        ("r0", tenant.pk), ("r1", tenant.pk)]
    # Lost again: the second attempt is metered too; a sweep that finds nothing new
    # stores nothing.
    much_later = later + dt.timedelta(seconds=settings.TASK_LEASE_S + 1)
    assert tasks_sweep(now=much_later)["requeued"] == 1
    tasks_sweep(now=much_later)
    assert sorted(lost_events.values_list("request_id", flat=True)) == ["r0", "r0", "r1"]


@pytest.mark.django_db
def test_a_transient_failure_runs_the_task_again_later_until_attempts_run_out():
    tenant = factories.tenant()
    task_submit(submission=submission(tenant), now=NOW)
    (claimed,) = task_claim(worker="w", limit=1, now=NOW)
    error = {"code": "upstream_timeout", "message": "the agent took too long"}
    task_finish(task_id=claimed.task.pk, claim=claimed.claim, now=NOW,
                outcome=Outcome(state="failed", error=error, retry_after_s=4))
    assert task_claim(worker="w", limit=1, now=NOW + dt.timedelta(seconds=3)) == []
    (again,) = task_claim(worker="w", limit=1, now=NOW + dt.timedelta(seconds=4))
    Task.objects.filter(pk=again.task.pk).update(attempts=settings.TASK_MAX_ATTEMPTS)
    task_finish(task_id=again.task.pk, claim=again.claim, now=NOW,
                outcome=Outcome(state="failed", error=error, retry_after_s=4))
    task = Task.objects.get(pk=again.task.pk)
    assert (task.state, task.error["code"]) == ("failed", "upstream_timeout")


@pytest.mark.django_db
def test_a_try_that_called_no_agent_uses_no_attempt_and_waits_for_the_deadline():
    """A breaker open longer than the attempts' backoff must not fail the tasks behind it."""
    tenant = factories.tenant()
    task_submit(submission=submission(tenant), now=NOW)
    refused = {"code": "circuit_open", "message": "the breaker is open"}
    at = NOW
    for _ in range(settings.TASK_MAX_ATTEMPTS * 3):
        (claimed,) = task_claim(worker="w", limit=1, now=at)
        task_finish(task_id=claimed.task.pk, claim=claimed.claim, now=at,
                    outcome=Outcome(state="failed", error=refused, retry_after_s=2,
                                    reached_agent=False))
        at += dt.timedelta(seconds=2)
    task = Task.objects.get(pk=claimed.task.pk)
    assert (task.state, task.attempts) == ("submitted", 0)
    (claimed,) = task_claim(worker="w", limit=1, now=at)
    task_finish(task_id=claimed.task.pk, claim=claimed.claim, now=at,
                outcome=Outcome(state="completed", result={"output": {"ok": True}}))
    assert Task.objects.get(pk=claimed.task.pk).state == "completed"


@needs_postgres
@pytest.mark.django_db
def test_a_nul_from_the_caller_is_a_400_and_one_from_the_agent_is_kept_replaced():
    """PostgreSQL stores no U+0000: the caller hears why; the agent's work is not lost."""
    tenant = factories.tenant()
    bad = Submission(**{**submission(tenant).__dict__,
                        "request": {"body": {"capability": "c", "input": {"t": "a\x00b"}}}})
    with pytest.raises(TaskRefused) as refused:
        task_submit(submission=bad)
    with pytest.raises(TaskRefused, match="idempotency_key contains U"):
        task_submit(submission=submission(tenant, idempotency_key="k\x00"))
    task_submit(submission=submission(tenant), now=NOW)
    (claimed,) = task_claim(worker="w", limit=1, now=NOW)
    task_finish(task_id=claimed.task.pk, claim=claimed.claim, now=NOW, outcome=Outcome(
        state="completed", result={"output": {"t\x00": ["x\x00y"]}}, message="m\x00"))
    task = Task.objects.get(pk=claimed.task.pk)
    assert refused.value.code == "invalid_input" and "input: input.t" in refused.value.message
    assert task.state == "completed" and task.attempts == 1
    assert task.result == {"output": {"t\ufffd": ["x\ufffdy"]}} and task.message == "m\ufffd"


@pytest.mark.django_db
def test_deliveries_back_off_doubling_with_jitter_and_stop_after_five_retries():
    tenant = factories.tenant()
    signing_secret_create(tenant=tenant)
    task, _ = task_submit(submission=submission(tenant, callback_url="http://127.0.0.1:9/"))
    (claimed,) = task_claim(worker="w", limit=1)
    task_finish(task_id=task.pk, claim=claimed.claim, outcome=Outcome(state="completed"))
    delivery = CallbackDelivery.objects.get(task=task)
    delays = []
    for _ in range(6):
        at = timezone.now()
        delivery = delivery_record(delivery=delivery, status=500, error="HTTP 500", now=at)
        delays.append((delivery.next_attempt_at - at).total_seconds())
    base = settings.CALLBACK_BACKOFF_S
    for n, delay in enumerate(delays[:5]):
        assert 0.8 * base * 2 ** n <= delay <= 1.2 * base * 2 ** n
    assert delivery.status == "exhausted" and delivery.attempts == 6
    delivery = delivery_retrigger(delivery=delivery)
    assert (delivery.status, delivery.attempts) == ("pending", 0)
    delivery = delivery_record(delivery=delivery, status=204)
    assert delivery.status == "delivered"


@pytest.mark.django_db
def test_only_the_agent_holding_a_task_reports_on_it_and_never_after_the_end():
    tenant = factories.tenant()
    holder = factories.agent(owner=tenant)
    other = factories.agent(owner=tenant, name="other-agent")
    task, _ = task_submit(submission=submission(tenant))
    Task.objects.filter(pk=task.pk).update(state="working", agent=holder)
    with pytest.raises(TaskRefused) as foreign:
        task_report(task=task, agent_id=other.pk, report=Report(state="completed"))
    working = task_report(task=task, agent_id=holder.pk,
                          report=Report(state="working", progress=0.4, message="reading"))
    done = task_report(task=task, agent_id=holder.pk,
                       report=Report(state="completed", output={"ok": True}))
    with pytest.raises(TaskRefused) as after:
        task_report(task=task, agent_id=holder.pk, report=Report(state="failed"))
    assert foreign.value.code == "not_found"
    assert (working.state, working.progress) == ("working", 0.4)
    assert done.state == "completed" and done.result["output"] == {"ok": True}
    assert after.value.code == "conflict"
