"""Alerts: a budget threshold reached (80 %, 100 %) or an agent with no healthy instance,
recorded for the console and delivered to the tenant's webhook.

Delivery is the task callbacks' machinery (``tasks.services``: claim with a hold,
retry with backoff until a 2xx or the retries are spent; ``tasks.callbacks.signature``:
HMAC-SHA256 of ``<timestamp>.<body>``), on ``AlertDelivery`` rows. Headers::

    X-Reach-Delivery:  the delivery id (the same on every attempt)
    X-Reach-Alert:     the alert id
    X-Reach-Event:     opened | resolved
    X-Reach-Timestamp: seconds since the epoch, when this attempt was signed
    X-Reach-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">

signed with the tenant's signing secret named ``alerts``, else ``default``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter

import orjson
from django.db import IntegrityError, transaction

from metering.budgets import budgets_check
from metering.models import Alert, AlertDelivery, AlertKind, BudgetAlert
from reach_core.kinds import InstanceState
from registry.models import Agent, Instance
from tasks.callbacks import signed_post
from tasks.models import SigningSecret
from tasks.services import deliveries_claim, delivery_record, signing_secret_value

logger = logging.getLogger(__name__)

SECRET_NAMES = ("alerts", "default")


def alerts_check(*, now: dt.datetime) -> dict[str, int]:
    """Budgets checked (and their new thresholds alerted), agents without a healthy
    instance alerted, and alerts of agents that have one again resolved. Idempotent."""
    budgets_check(now=now)
    counts = Counter(opened=0, resolved=0)
    for budget in BudgetAlert.objects.filter(alert__isnull=True).select_related("tenant"):
        share = f"{budget.threshold:.0%}" if budget.budget else "any use of a zero"
        counts["opened"] += _open(
            tenant_id=budget.tenant_id, kind=AlertKind.BUDGET, now=now, budget_alert=budget,
            subject=f"{budget.metric} budget, {budget.month:%Y-%m}",
            message=f"{budget.tenant.slug} has used {budget.used.normalize():f} of its "
                    f"{budget.metric} budget of {budget.budget.normalize():f} for "
                    f"{budget.month:%Y-%m} ({share} reached).",
            details={"metric": budget.metric, "threshold": str(budget.threshold),
                     "used": str(budget.used.normalize()),
                     "budget": str(budget.budget.normalize()),
                     "month": f"{budget.month:%Y-%m}", "quota": budget.quota_id})
    down = _agents_without_a_healthy_instance(now)
    open_alerts = {a.agent_id: a for a in Alert.objects.filter(
        kind=AlertKind.NO_HEALTHY_INSTANCE, resolved_at__isnull=True)}
    for agent in down:
        if agent.pk not in open_alerts:
            states = Counter(i.state for i in agent.instances.all())
            counts["opened"] += _open(
                tenant_id=agent.owner_tenant_id, kind=AlertKind.NO_HEALTHY_INSTANCE,
                now=now, agent=agent, subject=f"{agent.namespace.name}/{agent.name}",
                message=f"{agent.namespace.name}/{agent.name} has no healthy instance ("
                        + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + ").",
                details={"agent": agent.pk, "instances": dict(states)})
    down_pks = {agent.pk for agent in down}
    for agent_pk, alert in open_alerts.items():
        if agent_pk not in down_pks:
            counts["resolved"] += _resolve(alert, now)
    return dict(counts)


def _agents_without_a_healthy_instance(now: dt.datetime) -> list[Agent]:
    """Agents with an instance that is meant to serve (not drained by an operator) and
    none that is healthy with a running lease."""
    serving = Instance.objects.exclude(state=InstanceState.DRAINING).values("agent_id")
    healthy = Instance.objects.filter(state=InstanceState.HEALTHY,
                                      lease_expires_at__gt=now).values("agent_id")
    return list(Agent.objects.filter(pk__in=serving).exclude(pk__in=healthy)
                .select_related("namespace").prefetch_related("instances"))


def _open(*, tenant_id: int, kind: str, now: dt.datetime, subject: str, message: str,
          details: dict, agent: Agent | None = None,
          budget_alert: BudgetAlert | None = None) -> int:
    try:
        with transaction.atomic():
            alert = Alert.objects.create(
                tenant_id=tenant_id, kind=kind, subject=subject, message=message,
                details=details, agent=agent, budget_alert=budget_alert, opened_at=now)
            _announce(alert, "opened", now)
    except IntegrityError:
        return 0  # a concurrent check opened it first
    logger.warning("alert opened for tenant %s: %s", tenant_id, message)
    return 1


def _resolve(alert: Alert, now: dt.datetime) -> int:
    with transaction.atomic():
        if not Alert.objects.filter(pk=alert.pk, resolved_at__isnull=True).update(
                resolved_at=now):
            return 0
        alert.resolved_at = now
        _announce(alert, "resolved", now)
    logger.info("alert resolved for tenant %s: %s", alert.tenant_id, alert.subject)
    return 1


def _announce(alert: Alert, event: str, now: dt.datetime) -> None:
    """A delivery to the tenant's webhook, in the alert's transaction; none without one."""
    url = type(alert.tenant).objects.filter(pk=alert.tenant_id).values_list(
        "alert_webhook_url", flat=True).first()
    if url:
        AlertDelivery.objects.create(alert=alert, event=event, next_attempt_at=now)


# ---- delivery ------------------------------------------------------------------------


def alert_body(delivery: AlertDelivery) -> bytes:
    alert = delivery.alert
    return orjson.dumps({
        "delivery_id": str(delivery.pk), "event": delivery.event,
        "alert": {"id": alert.pk, "kind": alert.kind, "tenant": alert.tenant.slug,
                  "subject": alert.subject, "message": alert.message,
                  "details": alert.details, "opened_at": alert.opened_at.isoformat(),
                  "resolved_at": alert.resolved_at.isoformat() if alert.resolved_at
                  else None}})


def _secret(tenant_id: int) -> str | None:
    found = {s.name: s for s in SigningSecret.objects.filter(tenant_id=tenant_id,
                                                             name__in=SECRET_NAMES)}
    for name in SECRET_NAMES:
        if name in found:
            return signing_secret_value(found[name])
    return None


def alert_send(delivery: AlertDelivery) -> tuple[int | None, str]:
    """One attempt: ``(HTTP status or None, error text)``. Never raises for the network."""
    alert = delivery.alert
    url = alert.tenant.alert_webhook_url
    if not url:
        return None, "the tenant has no alert webhook URL any more"
    secret = _secret(alert.tenant_id)
    if secret is None:
        return None, "the tenant has no signing secret named 'alerts' or 'default'"
    return signed_post(url, secret, alert_body(delivery), (
        (b"X-Reach-Delivery", str(delivery.pk).encode()),
        (b"X-Reach-Alert", str(alert.pk).encode()),
        (b"X-Reach-Event", delivery.event.encode())))


def deliver_alerts(*, limit: int = 32) -> dict[str, int]:
    """Post the alert deliveries that are due; returns how many were attempted."""
    due = deliveries_claim(limit=limit, model=AlertDelivery)
    attempted = 0
    for delivery in due:
        delivery = AlertDelivery.objects.select_related("alert__tenant").get(pk=delivery.pk)
        status, error = alert_send(delivery)
        delivery_record(delivery=delivery, status=status, error=error)
        attempted += 1
    return {"attempted": attempted}

