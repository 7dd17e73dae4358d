"""The base viewset every tenant-owned API resource uses: scoping and audit in one place."""

from __future__ import annotations

from django.db import transaction
from rest_framework import exceptions, viewsets

from audit.models import AuditAction, AuditSource
from audit.services import audit_record
from reach_platform.scoping import tenant_id_of
from tenants.principal import principal_for_request


class _TenantScoped:
    @property
    def principal(self):
        return principal_for_request(self.request)

    def get_queryset(self):
        return super().get_queryset().for_principal(self.principal)


class TenantScopedReadOnlyViewSet(_TenantScoped, viewsets.ReadOnlyModelViewSet):
    """List and retrieve rows of the caller's tenants."""


class TenantScopedViewSet(_TenantScoped, viewsets.ModelViewSet):
    """CRUD over ``queryset`` narrowed to the caller's tenants.

    Subclasses set ``queryset`` and ``serializer_class``. Writes run in one
    transaction: the row is saved, then its owning tenant is checked, so a row
    moved to (or created in) a tenant the caller does not manage is rolled back
    whatever path the serializer took to build it. Every write is audited.
    """

    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def _saved_and_checked(self, serializer):
        instance = serializer.save()
        if not self.principal.can_manage(tenant_id_of(instance)):
            raise exceptions.PermissionDenied("You may not manage objects of that tenant.")
        return instance

    @transaction.atomic
    def _write(self, serializer, action: AuditAction) -> None:
        instance = self._saved_and_checked(serializer)
        audit_record(principal=self.principal, source=AuditSource.API, action=action,
                     obj=instance, changes=dict(serializer.validated_data))

    def perform_create(self, serializer):
        self._write(serializer, AuditAction.CREATE)

    def perform_update(self, serializer):
        self._write(serializer, AuditAction.UPDATE)

    @transaction.atomic
    def perform_destroy(self, instance):
        audit_record(
            principal=self.principal, source=AuditSource.API, action=AuditAction.DELETE,
            obj=instance, object_id=str(instance.pk),
        )
        instance.delete()

