"""How budget counters are named: shared by the gateways that count and the control plane
that restores them after Redis lost its data (``metering.budgets``)."""

from __future__ import annotations


def budget_scope(tenant_pk: int, agent_pk: int | None = None,
                 capability_pk: int | None = None) -> str:
    """The counters a budget is checked against: the tenant's, or the tenant's for one
    agent or one capability."""
    if agent_pk is not None:
        return f"{tenant_pk}:agent:{agent_pk}"
    if capability_pk is not None:
        return f"{tenant_pk}:capability:{capability_pk}"
    return f"{tenant_pk}"


def usage_key(prefix: str, month: str, scope: str) -> str:
    """The Redis hash of one scope's usage in one month (``"YYYY-MM"``, UTC)."""
    return f"{prefix}usage-month:{month}:{scope}"
