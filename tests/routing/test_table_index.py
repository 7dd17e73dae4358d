"""An agent's delta updates the indexes for that agent only, and they equal a full index."""

from __future__ import annotations

import random

from routing.table import AgentEntry, CapabilityEntry, Delta, RouteTable


def random_agent(rng: random.Random, pk: int) -> AgentEntry:
    # Capability ids are unique within an agent (a database constraint).
    ids = rng.sample(range(8), rng.randrange(4))
    caps = tuple(CapabilityEntry(pk=pk * 100 + n, capability_id=f"cap.{i}")
                 for n, i in enumerate(ids))
    return AgentEntry(pk=pk, namespace=rng.choice(["default", "ops"]),
                      name=f"agent-{rng.randrange(6)}", owner_tenant_pk=1, capabilities=caps)


def test_incremental_agent_indexes_equal_a_full_index_after_every_delta():
    rng = random.Random(20261201)
    table = RouteTable().indexed()
    for version in range(1, 600):
        pk = rng.randrange(1, 40)
        if rng.random() < 0.25:
            delta = Delta(version=version, kind="agent", op="delete", pk=pk)
        else:
            delta = Delta(version=version, kind="agent", op="upsert", pk=pk,
                          entry=random_agent(rng, pk))
        table = table.apply(delta)
        full = table.indexed()
        assert dict(table.agents_by_capability) == dict(full.agents_by_capability), version
        assert dict(table.agents_by_name) == dict(full.agents_by_name), version
