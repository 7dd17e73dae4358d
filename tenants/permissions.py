from __future__ import annotations

from rest_framework import permissions

from reach_platform.scoping import tenant_id_of
from tenants.principal import principal_for_request


class TenantPermission(permissions.BasePermission):
    """Reads need a readable tenant, writes a manageable one.

    Which rows exist for a principal is decided by the viewset's queryset
    (``for_tenants``), so another tenant's object is a 404, never a 403 that
    would confirm it exists. A 403 means: you can see it, but not change it.
    """

    message = "Your key or user may not do this."

    def has_permission(self, request, view) -> bool:
        principal = principal_for_request(request)
        if principal.agent_pk is not None:
            # Agent tokens act only through the actions a view opens to them.
            return getattr(view, "action", None) in getattr(view, "agent_token_actions", ())
        if request.method in permissions.SAFE_METHODS:
            return principal.is_global or bool(principal.tenant_ids)
        if getattr(view, "global_writes_only", False):
            return principal.is_global
        return principal.can_manage_any

    def has_object_permission(self, request, view, obj) -> bool:
        principal = principal_for_request(request)
        if principal.agent_pk is not None or request.method in permissions.SAFE_METHODS:
            # The view's queryset (``for_principal``) already holds only rows this
            # principal may see: an agent token's own agent, a tenant's own rows.
            return True
        return principal.can_manage(tenant_id_of(obj))
