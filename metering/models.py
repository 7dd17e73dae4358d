from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import models

from metering.choices import Outcome
from reach_platform.scoping import TenantScopedQuerySet
from tasks.models import Delivery


def new_event_id() -> str:
    return uuid.uuid4().hex


class UsageEvent(models.Model):
    """One call through the gateway. ``event_id`` (the gateway's own id for the call) is
    unique: events are stored exactly once. ``request_id`` is the call's X-Request-ID,
    which a caller may choose, and so may repeat."""

    tenant_path = "tenant_id"

    event_id = models.CharField(max_length=128, unique=True, default=new_event_id)
    request_id = models.CharField(max_length=128, db_index=True)
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="usage_events"
    )
    # Nullable and kept when the agent goes: finance still needs last month's rows.
    agent = models.ForeignKey(
        "registry.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    capability = models.ForeignKey(
        "registry.Capability", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    instance = models.ForeignKey(
        "registry.Instance", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    outcome = models.CharField(max_length=32, choices=Outcome)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal(0))
    latency_ms = models.PositiveIntegerField(default=0)
    occurred_at = models.DateTimeField(db_index=True)
    # How the call went, for the console's call log: attempts after the first, the chosen
    # candidate's route score, and the milliseconds to the route decision, from sending
    # to the agent's answer, and (streams) to the first event relayed.
    retries = models.PositiveSmallIntegerField(default=0)
    route_score = models.FloatField(null=True, blank=True)
    route_ms = models.FloatField(null=True, blank=True)
    upstream_ms = models.FloatField(null=True, blank=True)
    first_byte_ms = models.FloatField(null=True, blank=True)
    # A tool call (``gateway.tools``): the tool, the agent that called it (None: a tenant
    # key), the SHA-256 of its arguments (never their values: this row is the call's
    # audit record) and the external service's HTTP status.
    tool = models.ForeignKey("tools.Tool", null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="+")
    caller_agent = models.ForeignKey("registry.Agent", null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    argument_digest = models.CharField(max_length=64, blank=True)
    upstream_status = models.PositiveSmallIntegerField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-occurred_at"]
        indexes = [models.Index(fields=["tenant", "occurred_at"], name="usage_tenant_time")]
        # In the admin: the console's call log.
        verbose_name = "call"
        verbose_name_plural = "call log"

    def __str__(self) -> str:
        return self.request_id


class UsageTotals(models.Model):
    """Totals per tenant x agent x capability over a period, rebuilt from ``UsageEvent``."""

    tenant_path = "tenant_id"

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="%(class)s_rows"
    )
    # No database constraint: a rollup row outlives its agent with the agent's id
    # (reports show it as deleted). SET_NULL could merge two rows of one period
    # into one key and break the unique constraint, and finance needs the history.
    agent = models.ForeignKey(
        "registry.Agent", null=True, blank=True, on_delete=models.DO_NOTHING,
        db_constraint=False, related_name="+",
    )
    capability = models.ForeignKey(
        "registry.Capability", null=True, blank=True, on_delete=models.DO_NOTHING,
        db_constraint=False, related_name="+",
    )
    requests = models.PositiveBigIntegerField(default=0)
    # Every call whose outcome is not success (client_cancelled included) ...
    errors = models.PositiveBigIntegerField(default=0)
    # ... and the same calls per outcome, ``{"upstream_error": 3, ...}``: only outcomes
    # that occurred, never success; the counts add up to ``errors``. (Key order is not
    # kept by jsonb; reports order the reasons.)
    errors_by_reason = models.JSONField(default=dict, blank=True)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=16, decimal_places=6, default=Decimal(0))
    latency_ms_total = models.PositiveBigIntegerField(default=0)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        abstract = True


class UsageDaily(UsageTotals):
    day = models.DateField()

    class Meta:
        ordering = ["-day"]
        verbose_name = "daily usage"
        verbose_name_plural = "daily usage"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "tenant", "agent", "capability"],
                name="usage_daily_unique", nulls_distinct=False,
            )
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.tenant_id}"


class UsageHourly(UsageTotals):
    hour = models.DateTimeField()

    class Meta:
        ordering = ["-hour"]
        verbose_name = "hourly usage"
        verbose_name_plural = "hourly usage"
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "tenant", "agent", "capability"],
                name="usage_hourly_unique", nulls_distinct=False,
            )
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.tenant_id}"


class PendingRollup(models.Model):
    """A rollup period whose rows may lag its events: rebuilt by the next rollup run.

    The consumer marks the hour and the day of every event it stores, in the same
    transaction, so an event stored late (a consumer backlog, a rollup job that was
    down) is never lost from a rollup. Until the period is rebuilt, reports read
    its raw events instead of its rollup rows. Internal bookkeeping, no tenant.
    """

    HOUR = "hour"
    DAY = "day"

    kind = models.CharField(max_length=4, choices=[(HOUR, "Hour"), (DAY, "Day")])
    start = models.DateTimeField(help_text="Start of the UTC hour or day.")

    class Meta:
        ordering = ["kind", "start"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "start"], name="pending_rollup_once")
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.start:%Y-%m-%d %H}h"


class BudgetAlert(models.Model):
    """A tenant's monthly usage crossed a share (80 %) of a budget in a ``Quota``."""

    tenant_path = "tenant_id"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE,
                               related_name="budget_alerts")
    quota = models.ForeignKey("tenants.Quota", null=True, blank=True,
                              on_delete=models.SET_NULL, related_name="alerts")
    month = models.DateField(help_text="First day of the month the budget is for.")
    metric = models.CharField(max_length=16, choices=[("requests", "Requests"),
                                                      ("tokens", "Tokens"), ("cost", "Cost")])
    threshold = models.DecimalField(max_digits=4, decimal_places=2, default=Decimal("0.80"))
    used = models.DecimalField(max_digits=18, decimal_places=6)
    budget = models.DecimalField(max_digits=18, decimal_places=6)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["quota", "month", "metric", "threshold"],
                                    name="budget_alert_once")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.metric} {self.used}/{self.budget} ({self.month:%Y-%m})"


class AlertKind(models.TextChoices):
    BUDGET = "budget", "Budget threshold reached"
    NO_HEALTHY_INSTANCE = "no_healthy_instance", "Agent without a healthy instance"


class Alert(models.Model):
    """Something a tenant must hear about: a budget threshold reached (80 %, 100 %), or an
    agent of theirs with no healthy instance. Shown in the console, and delivered to the
    tenant's ``alert_webhook_url`` when it has one (``metering.alerts``)."""

    tenant_path = "tenant_id"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE,
                               related_name="alerts")
    kind = models.CharField(max_length=32, choices=AlertKind)
    subject = models.CharField(max_length=200)
    message = models.TextField()
    details = models.JSONField(default=dict, blank=True)
    budget_alert = models.OneToOneField(BudgetAlert, null=True, blank=True,
                                        on_delete=models.SET_NULL, related_name="alert")
    agent = models.ForeignKey("registry.Agent", null=True, blank=True,
                              on_delete=models.SET_NULL, related_name="+")
    opened_at = models.DateTimeField(db_index=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-opened_at"]
        constraints = [models.UniqueConstraint(
            fields=["agent"], condition=models.Q(resolved_at__isnull=True,
                                                 kind="no_healthy_instance"),
            name="alert_one_open_per_agent")]

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject}"


class AlertDelivery(Delivery):
    """One announcement of an alert (opened or resolved) to its tenant's webhook."""

    tenant_path = "alert__tenant_id"

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=16, choices=[("opened", "Opened"),
                                                     ("resolved", "Resolved")])

    class Meta(Delivery.Meta):
        indexes = [models.Index(fields=["status", "next_attempt_at"],
                                name="alert_delivery_due", condition=models.Q(status="pending"))]
        verbose_name_plural = "alert deliveries"
