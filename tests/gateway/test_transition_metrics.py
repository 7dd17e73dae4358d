"""The gateway counts instance state changes as its route table applies them: an
unknown -> healthy return is a heartbeat false positive."""

from __future__ import annotations

import types
from dataclasses import replace

from gateway.metrics import REGISTRY
from gateway.observe import TransitionCounter
from routing.table import Delta
from tests.support.inprocess import route_table, scripted_agents


def count(was: str, to: str) -> float:
    return REGISTRY.get_sample_value("reach_instance_transitions_total",
                                     {"from_state": was, "to_state": to}) or 0.0


def test_state_changes_of_changed_agents_are_counted_once_each():
    table, _ = route_table(scripted_agents("http://127.0.0.1:9/"))
    counter = TransitionCounter()
    counter(table)  # the first table: nothing to compare with
    agent = next(iter(table.agents.values()))
    before = count("unknown", "healthy"), count("healthy", "unknown")

    def with_state(entry, state):
        return replace(entry, instances=tuple(replace(i, state=state)
                                              for i in entry.instances))

    lapsed = table.apply(Delta(version=2, kind="agent", op="upsert", pk=agent.pk,
                               entry=with_state(agent, "unknown")))
    counter(lapsed)
    back = lapsed.apply(Delta(version=3, kind="agent", op="upsert", pk=agent.pk,
                              entry=with_state(agent, "healthy")))
    counter(back)
    counter(back.apply(Delta(version=4, kind="agent", op="upsert", pk=agent.pk,
                             entry=with_state(agent, "healthy"))))  # no change
    assert count("healthy", "unknown") - before[1] == len(agent.instances)
    assert count("unknown", "healthy") - before[0] == len(agent.instances)
    # A whole table (a reload) attributes nothing.
    counter(replace(back, changed_agents=None, agents=types.MappingProxyType(
        dict(back.agents))))
    assert count("unknown", "healthy") - before[0] == len(agent.instances)
