from __future__ import annotations

from decimal import Decimal

from django.db import models

from metering.choices import Outcome
from reach_platform.scoping import TenantScopedQuerySet


class UsageEvent(models.Model):
    """One call through the gateway. ``request_id`` is unique: events are stored exactly once."""

    tenant_path = "tenant_id"

    request_id = models.CharField(max_length=128, unique=True)
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

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-occurred_at"]
        indexes = [models.Index(fields=["tenant", "occurred_at"], name="usage_tenant_time")]

    def __str__(self) -> str:
        return self.request_id


class UsageDaily(models.Model):
    """Per tenant x agent x capability x day totals, rebuilt from ``UsageEvent``."""

    tenant_path = "tenant_id"

    day = models.DateField()
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="usage_daily"
    )
    agent = models.ForeignKey(
        "registry.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    capability = models.ForeignKey(
        "registry.Capability", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    requests = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=16, decimal_places=6, default=Decimal(0))
    latency_ms_total = models.PositiveBigIntegerField(default=0)

    objects = TenantScopedQuerySet.as_manager()

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
