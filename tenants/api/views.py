from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from audit.models import AuditAction, AuditSource
from audit.services import audit_record
from reach_platform.api import TenantScopedViewSet
from tenants.api.serializers import (
    ApiKeyIssuedSerializer,
    ApiKeySerializer,
    CredentialSerializer,
    GrantAcceptSerializer,
    GrantSerializer,
    QuotaSerializer,
    TenantSerializer,
)
from tenants.models import ApiKey, Credential, Grant, Quota, Tenant
from tenants.services import api_key_create, api_key_revoke, grant_accept, grant_given_at


class TenantViewSet(TenantScopedViewSet):
    """Tenants you belong to. Creating and deleting tenants is for superusers."""

    queryset = Tenant.objects.all()
    serializer_class = TenantSerializer
    lookup_field = "slug"

    @property
    def global_writes_only(self) -> bool:
        return self.action in ("create", "destroy")


class ApiKeyViewSet(TenantScopedViewSet):
    """API keys: list, create, revoke. The plaintext appears once, in the response to create."""

    queryset = ApiKey.objects.select_related("tenant")
    serializer_class = ApiKeySerializer
    # Keys are never edited or deleted: revocation keeps the row for the audit trail.
    http_method_names = ["get", "post", "head", "options"]

    @extend_schema(request=ApiKeySerializer, responses={201: ApiKeyIssuedSerializer})
    @transaction.atomic
    def create(self, request):
        serializer = ApiKeySerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if not self.principal.can_manage(data["tenant"].pk):
            self.permission_denied(request, "You may not manage keys of that tenant.")
        issued = api_key_create(
            tenant=data["tenant"], name=data["name"], scopes=data["scopes"],
            expires_at=data.get("expires_at"),
        )
        audit_record(
            principal=self.principal, source=AuditSource.API, action=AuditAction.CREATE,
            obj=issued.api_key, changes={"name": data["name"], "scopes": data["scopes"]},
        )
        body = ApiKeyIssuedSerializer(issued.api_key, context=self.get_serializer_context()).data
        body["key"] = issued.plaintext
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: ApiKeySerializer})
    @action(detail=True, methods=["post"])
    @transaction.atomic
    def revoke(self, request, pk=None):
        api_key = self.get_object()
        if not self.principal.can_manage(api_key.tenant_id):
            self.permission_denied(request, "You may not manage keys of that tenant.")
        api_key_revoke(api_key=api_key)
        audit_record(
            principal=self.principal, source=AuditSource.API, action=AuditAction.ACTION,
            obj=api_key, changes={"revoked_at": api_key.revoked_at.isoformat()},
        )
        return Response(self.get_serializer(api_key).data)


class GrantViewSet(TenantScopedViewSet):
    """Grants: the agent's owner offers another tenant an agent or one capability; the
    offer is in force once the grantee accepts it (``POST .../accept/``), at once when
    the caller manages both tenants. Either side may delete a grant."""

    queryset = Grant.objects.select_related("tenant", "agent", "capability__agent")
    serializer_class = GrantSerializer
    http_method_names = ["get", "post", "delete", "head", "options"]

    def check_object_permissions(self, request, obj):
        # The grantee gives a grant up, or accepts it, without managing the agent.
        if self.action in ("destroy", "accept") and self.principal.agent_pk is None \
                and self.principal.can_manage(obj.tenant_id):
            return
        super().check_object_permissions(request, obj)

    def perform_create(self, serializer):
        grantee = serializer.validated_data["tenant"]
        serializer.validated_data["accepted_at"] = grant_given_at(
            grantee_consents=self.principal.can_manage(grantee.pk))
        super().perform_create(serializer)

    @extend_schema(request=GrantAcceptSerializer, responses={200: GrantSerializer})
    @action(detail=True, methods=["post"])
    @transaction.atomic
    def accept(self, request, pk=None):
        """The grantee names the capability ids it accepts (its ``offered_capabilities``):
        a grant accepted blind let the giver include the grantee's own id in the offer
        and take its calls (a break test). An id no longer offered is a 409."""
        grant = self.get_object()
        if not self.principal.can_manage(grant.tenant_id):
            self.permission_denied(request, "Only the grantee accepts a grant.")
        body = GrantAcceptSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        grant = Grant.objects.select_for_update().get(pk=grant.pk)
        grant_accept(grant=grant, capabilities=body.validated_data["capabilities"])
        audit_record(
            principal=self.principal, source=AuditSource.API, action=AuditAction.ACTION,
            obj=grant, changes={"accepted_at": grant.accepted_at.isoformat()},
        )
        return Response(self.get_serializer(grant).data)


class CredentialViewSet(TenantScopedViewSet):
    """Downstream credentials. ``secret`` can be written, never read back."""

    queryset = Credential.objects.select_related("tenant", "agent")
    serializer_class = CredentialSerializer


class QuotaViewSet(TenantScopedViewSet):
    """Quotas of your tenants. They are set by operators: a tenant's ``manage`` key or
    tenant admin reads them; only superusers create, change or delete them (else 403)."""

    global_writes_only = True
    queryset = Quota.objects.select_related("tenant", "agent", "capability")
    serializer_class = QuotaSerializer
