"""Route tables for router tests, built in memory (no database)."""

from __future__ import annotations

import itertools
import types

from routing.table import (
    AgentEntry,
    CapabilityEntry,
    GrantEntry,
    InstanceEntry,
    RouteTable,
)

_pk = itertools.count(1)


def inst(**kw) -> dict:
    return kw


def agent(name: str, capability_id: str = "translate.text", *, instances=({},),
          owner: int = 1, cap: dict | None = None, **kw) -> AgentEntry:
    pk = next(_pk)
    capability = CapabilityEntry(pk=next(_pk), capability_id=capability_id, **(cap or {}))
    rows = tuple(
        InstanceEntry(pk=next(_pk), agent_pk=pk, endpoint=f"http://127.0.0.1:{9000 + i}/",
                      **spec)
        for i, spec in enumerate(instances)
    )
    return AgentEntry(pk=pk, namespace=kw.pop("namespace", "default"), name=name,
                      owner_tenant_pk=owner, capabilities=(capability,), instances=rows, **kw)


def table(*agents: AgentEntry, grants: tuple[GrantEntry, ...] = ()) -> RouteTable:
    return RouteTable(
        version=1,
        agents=types.MappingProxyType({a.pk: a for a in agents}),
        grants=types.MappingProxyType({g.pk: g for g in grants}),
    ).indexed()


def grant(tenant: int, *, agent_pk=None, capability_pk=None,
          ids: tuple[str, ...] = ("translate.text",)) -> GrantEntry:
    """An accepted grant covering capability ids ``ids`` (``request()``'s by default)."""
    return GrantEntry(pk=next(_pk), tenant_pk=tenant, agent_pk=agent_pk,
                      capability_pk=capability_pk, capability_ids=frozenset(ids))
