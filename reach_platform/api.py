"""The base viewset every tenant-owned API resource uses: scoping and audit in one place."""

from __future__ import annotations

from django.db import transaction
from rest_framework import exceptions, viewsets

from audit.models import AuditAction, AuditSource
from audit.services import audit_record
from reach_platform.scoping import tenant_id_of
from tenants.principal import principal_for_request

# Query parameters of every list besides its filters: pagination, DRF's renderer choice.
NOT_FILTERS = frozenset({"limit", "offset", "format"})


class StrictListParams:
    """A list refuses query parameters it does not read: a misspelt filter
    (``?namespce=ops``) silently ignored answers as if it were applied. ``list_filters``
    names the filters a list reads; None: the list checks its own (metering's)."""

    list_filters: frozenset[str] | None = frozenset()

    def list(self, request, *args, **kwargs):
        if self.list_filters is not None:
            accepted = self.list_filters | NOT_FILTERS
            unknown = sorted(set(request.query_params) - accepted)
            if unknown:
                known = ", ".join(sorted(accepted))
                raise exceptions.ValidationError({name[:100]: [f"not a parameter here; use "
                                                               f"{known}"]
                                                  for name in unknown[:10]})
            # One value each: the first silently winning reads as both applied.
            repeated = [name for name in request.query_params
                        if len(request.query_params.getlist(name)) > 1]
            if repeated:
                raise exceptions.ValidationError({name: ["give it once"]
                                                  for name in repeated[:10]})
        return super().list(request, *args, **kwargs)


class _TenantScoped(StrictListParams):
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

