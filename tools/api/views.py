from __future__ import annotations

from reach_platform.api import TenantScopedViewSet
from tools.api.serializers import ToolGrantSerializer, ToolSerializer
from tools.models import Tool, ToolGrant


class ToolViewSet(TenantScopedViewSet):
    """Tools your tenants own: the external APIs agents call through the gateway
    (``POST /v1/tools/<name>/call``). ``secret`` can be written, never read back."""

    queryset = Tool.objects.select_related("owner_tenant")
    serializer_class = ToolSerializer
    lookup_field = "name"


class ToolGrantViewSet(TenantScopedViewSet):
    """Who besides the owner may call a tool: a tenant, or one agent."""

    queryset = ToolGrant.objects.select_related("tool", "tenant", "agent")
    serializer_class = ToolGrantSerializer
