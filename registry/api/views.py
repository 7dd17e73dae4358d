from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from audit.models import AuditAction, AuditSource
from audit.services import audit_record
from reach_platform.api import TenantScopedViewSet
from registry.api.serializers import (
    AgentSerializer,
    CapabilitySerializer,
    InstanceSerializer,
    NamespaceSerializer,
)
from registry.models import Agent, Capability, Instance, Namespace
from registry.services import instance_drain
from tenants.permissions import TenantPermission


class NamespaceViewSet(viewsets.ModelViewSet):
    """Namespaces are shared by every tenant; only superusers create or change them."""

    queryset = Namespace.objects.all()
    serializer_class = NamespaceSerializer
    permission_classes = [TenantPermission]
    global_writes_only = True
    lookup_field = "name"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]


class AgentViewSet(TenantScopedViewSet):
    queryset = Agent.objects.select_related("namespace", "owner_tenant").prefetch_related(
        "capabilities", "instances"
    )
    serializer_class = AgentSerializer


class CapabilityViewSet(TenantScopedViewSet):
    queryset = Capability.objects.select_related("agent")
    serializer_class = CapabilitySerializer


class InstanceViewSet(TenantScopedViewSet):
    queryset = Instance.objects.select_related("agent")
    serializer_class = InstanceSerializer

    @extend_schema(request=None, responses={200: InstanceSerializer})
    @action(detail=True, methods=["post"])
    @transaction.atomic
    def drain(self, request, pk=None):
        """Stop routing new calls to this instance; calls in flight finish."""
        instance = self.get_object()
        self.check_object_permissions(request, instance)
        instance_drain(instance=instance)
        audit_record(
            principal=self.principal, source=AuditSource.API, action=AuditAction.ACTION,
            obj=instance, changes={"state": instance.state},
        )
        return Response(self.get_serializer(instance).data)
