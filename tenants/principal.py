"""Who is acting, and on which tenants: derived once per request from a user or an API key."""

from __future__ import annotations

from dataclasses import dataclass

from tenants.choices import ApiKeyScope, MembershipRole


@dataclass(frozen=True)
class Principal:
    """``tenant_ids`` / ``manage_tenant_ids`` of ``None`` mean every tenant (superuser)."""

    label: str
    tenant_ids: frozenset[int] | None
    manage_tenant_ids: frozenset[int] | None
    user: object | None = None
    api_key: object | None = None
    # Set for an agent token: it acts for this agent only, and reads no tenant data.
    agent_pk: int | None = None

    @property
    def is_global(self) -> bool:
        return self.tenant_ids is None

    def can_read(self, tenant_id: int | None) -> bool:
        if self.tenant_ids is None:
            return True
        return tenant_id is not None and tenant_id in self.tenant_ids

    def can_manage(self, tenant_id: int | None) -> bool:
        if self.manage_tenant_ids is None:
            return True
        return tenant_id is not None and tenant_id in self.manage_tenant_ids

    @property
    def can_manage_any(self) -> bool:
        return self.manage_tenant_ids is None or bool(self.manage_tenant_ids)


NOBODY = Principal(label="anonymous", tenant_ids=frozenset(), manage_tenant_ids=frozenset())


def principal_for_user(user) -> Principal:
    if not getattr(user, "is_authenticated", False) or not user.is_active:
        return NOBODY
    label = f"user:{user.get_username()}"
    if user.is_superuser:
        return Principal(label=label, tenant_ids=None, manage_tenant_ids=None, user=user)
    if not user.is_staff:
        return Principal(
            label=label, tenant_ids=frozenset(), manage_tenant_ids=frozenset(), user=user
        )
    rows = list(
        user.reach_memberships.filter(tenant__is_active=True).values_list("tenant_id", "role")
    )
    return Principal(
        label=label,
        tenant_ids=frozenset(t for t, _ in rows),
        manage_tenant_ids=frozenset(t for t, r in rows if r == MembershipRole.ADMIN),
        user=user,
    )


def principal_for_api_key(api_key) -> Principal:
    scopes = set(api_key.scopes or [])
    tenant = frozenset({api_key.tenant_id})
    readable = tenant if scopes & {ApiKeyScope.READ, ApiKeyScope.MANAGE} else frozenset()
    manageable = tenant if ApiKeyScope.MANAGE in scopes else frozenset()
    return Principal(
        label=f"key:{api_key.prefix}", tenant_ids=readable, manage_tenant_ids=manageable,
        api_key=api_key,
    )


def principal_for_agent_token(token) -> Principal:
    return Principal(
        label=f"agent:{token.prefix}", tenant_ids=frozenset(), manage_tenant_ids=frozenset(),
        agent_pk=token.agent_id,
    )


def principal_for_request(request) -> Principal:
    """The principal DRF or the admin authenticated; cached on the request."""
    cached = getattr(request, "_reach_principal", None)
    if cached is not None:
        return cached
    auth = getattr(request, "auth", None)
    if isinstance(auth, Principal):  # a bearer token, resolved by the authentication class
        principal = auth
    else:
        principal = principal_for_user(getattr(request, "user", None))
    request._reach_principal = principal
    return principal
