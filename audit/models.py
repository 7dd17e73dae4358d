from __future__ import annotations

from django.conf import settings
from django.db import models

from reach_platform.scoping import TenantScopedQuerySet


class AuditSource(models.TextChoices):
    ADMIN = "admin", "Admin"
    API = "api", "REST API"
    SYSTEM = "system", "System"


class AuditAction(models.TextChoices):
    CREATE = "create", "Create"
    UPDATE = "update", "Update"
    DELETE = "delete", "Delete"
    ACTION = "action", "Action"


class AuditEntry(models.Model):
    """Who changed what. ``changes`` holds field names and non-secret values only."""

    tenant_path = "tenant_id"

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    source = models.CharField(max_length=16, choices=AuditSource)
    action = models.CharField(max_length=16, choices=AuditAction)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    # "user:alice" or "key:Ab3dE5gH7j": survives the user or key being deleted.
    actor = models.CharField(max_length=200)
    tenant = models.ForeignKey(
        "tenants.Tenant", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200)
    changes = models.JSONField(default=dict, blank=True)
    request_id = models.CharField(max_length=128, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-at"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_type}"
