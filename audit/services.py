"""Writing the audit log. Secrets never reach it: only field names are kept for them."""

from __future__ import annotations

from decimal import Decimal

from django.db import models

from audit.models import AuditAction, AuditEntry, AuditSource
from reach_core import requestid
from reach_platform.scoping import tenant_id_of

REDACTED = "[redacted]"


def _safe_value(value):
    if isinstance(value, models.Model):
        return str(value.pk)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return REDACTED
    if isinstance(value, list | tuple):
        return [_safe_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _safe_value(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def redact(obj: models.Model, changes: dict) -> dict:
    """Keep non-secret values; replace the model's ``secret_fields`` with a marker."""
    secret = set(getattr(type(obj), "secret_fields", ()))
    return {
        name: (REDACTED if name in secret else _safe_value(value))
        for name, value in changes.items()
    }


def audit_record(
    *,
    principal,
    source: AuditSource,
    action: AuditAction,
    obj: models.Model,
    changes: dict | None = None,
    object_id: str | None = None,
) -> AuditEntry:
    """Append one entry. ``object_id`` is needed after a delete, when ``obj.pk`` is gone."""
    tenant_id = tenant_id_of(obj) if hasattr(obj, "tenant_path") else None
    return AuditEntry.objects.create(
        source=source,
        action=action,
        actor_user=principal.user if getattr(principal.user, "pk", None) else None,
        actor=principal.label,
        tenant_id=tenant_id,
        object_type=obj._meta.label,
        object_id=object_id or str(obj.pk),
        object_repr=str(obj)[:200],
        changes=redact(obj, changes or {}),
        request_id=requestid.current.get() if requestid.current.get() != "-" else "",
    )
