"""Tenant scoping in one place.

Every tenant-owned model declares ``tenant_path``: the lookup from the row to
the tenant that owns (and so may change) it. A model read by more than one
tenant also declares ``tenant_read_paths`` (a grant is seen by its grantee and
by the agent's owner). ``for_tenants`` is the only filter the admin and the API
apply; ``None`` means "every tenant" (superusers).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models


class TenantScopedQuerySet(models.QuerySet):
    def for_principal(self, principal):
        """Rows ``principal`` may see. An agent token sees only its own agent's rows,
        on models that declare ``agent_path``, and nothing else."""
        if principal.agent_pk is not None:
            path = getattr(self.model, "agent_path", None)
            return self.filter(**{path: principal.agent_pk}) if path else self.none()
        return self.for_tenants(principal.tenant_ids)

    def for_tenants(self, tenant_ids: Iterable[int] | None):
        if tenant_ids is None:
            return self
        ids = list(tenant_ids)
        paths = getattr(self.model, "tenant_read_paths", None) or (self.model.tenant_path,)
        condition = models.Q()
        for path in paths:
            condition |= models.Q(**{f"{path}__in": ids})
        return self.filter(condition)


def tenant_id_of(obj) -> int | None:
    """The id of the tenant that owns ``obj``, following its ``tenant_path``.

    Returns None when the path crosses an unset relation.
    """
    owning = getattr(obj, "owning_tenant_id", None)
    if callable(owning):
        return owning()
    value = obj
    for part in obj.tenant_path.split("__"):
        if value is None:
            return None
        value = getattr(value, part)
    return value
