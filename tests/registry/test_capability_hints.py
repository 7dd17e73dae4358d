"""A capability's ``examples`` and ``not_for``: from every descriptor format to the
intent router's ``CapabilityText``, through the database and the route table."""

from __future__ import annotations

import json
import types
from pathlib import Path

import orjson
import pytest

from registry.models import Agent, Capability
from registry.snapshot import agent_entry, all_agent_entries
from routing.router import capability_text
from routing.table import (
    Delta,
    RouteTable,
    delta_from_wire,
    delta_to_wire,
    table_from_wire,
    table_to_json,
)
from tenants.choices import ApiKeyScope
from tests import factories
from tests.conftest import key_client

EXAMPLES = Path(__file__).parent / "examples"
TRACK = "parcel tracking (use logistics.track)"


def register(client, body):
    return client.post("/api/v1/agents/register", body, format="json")


@pytest.fixture
def registrar(world):
    return key_client(factories.api_key(tenant=world.tenant_a,
                                        scopes=[ApiKeyScope.REGISTER]).plaintext)


def descriptor(name: str, port: int, **hints) -> dict:
    return {"agent_id": name, "reach": {"endpoint": f"http://127.0.0.1:{port}/"},
            "capabilities": [{"id": "orders.status", "description": "Where an order is",
                              **hints}]}


def table_from_database() -> RouteTable:
    # The whole-table path (raw rows), as ``build_table`` reads agents.
    agents = types.MappingProxyType({a.pk: a for a in all_agent_entries()})
    return RouteTable(version=1, agents=agents).indexed()


@pytest.mark.django_db
def test_a_json_descriptors_hints_reach_the_route_table_and_the_intent_text(registrar):
    first = register(registrar, descriptor(
        "orders", 9401, examples=["Where is order 1234?", "  ", "Where is order 1234?"],
        not_for=[TRACK]))
    second = register(registrar, descriptor(
        "orders-v2", 9402, examples=["Has my order shipped?", "Where is order 1234?"],
        not_for=["refunds (use billing.refund)", TRACK]))
    assert first.status_code == second.status_code == 201, (first.json(), second.json())

    stored = Capability.objects.get(agent__name="orders")
    assert (stored.examples, stored.not_for) == (["Where is order 1234?"], [TRACK])
    shown = first.json()["agent"]["capabilities"][0]
    assert (shown["examples"], shown["not_for"]) == (["Where is order 1234?"], [TRACK])

    table = table_from_database()
    entry = table.agents[first.json()["agent"]["id"]].capabilities[0]
    assert (entry.examples, entry.not_for) == (("Where is order 1234?",), (TRACK,))
    # The per-row path (deltas) and both wire forms carry them too.
    agent = Agent.objects.get(name="orders")
    assert agent_entry(agent) == table.agents[agent.pk]
    delta = Delta(version=2, kind="agent", op="upsert", pk=agent.pk, entry=agent_entry(agent))
    assert delta_from_wire(orjson.loads(orjson.dumps(delta_to_wire(delta)))) == delta
    assert table_from_wire(orjson.loads(table_to_json(table))).agents == table.agents

    # Agents offering one id pool their hints, first occurrence kept, in pk order.
    (text,) = capability_text(table, "orders.status")
    assert text.examples == ("Where is order 1234?", "Has my order shipped?")
    assert text.not_for == (TRACK, "refunds (use billing.refund)")


@pytest.mark.django_db
def test_an_agent_card_skills_examples_and_x_reach_not_for_arrive(registrar):
    card = json.loads((EXAMPLES / "translator.agent-card.json").read_text())
    response = register(registrar, card)
    assert response.status_code == 201, response.json()
    caps = {c.capability_id: c for c in Capability.objects.filter(
        agent_id=response.json()["agent"]["id"])}
    assert caps["translate.text"].examples == card["skills"][0]["examples"]
    assert caps["translate.text"].not_for == ["summarising text (use summarize.text)"]
    assert caps["translate.text"].keywords == card["skills"][0]["tags"]
    assert caps["summarize.text"].examples == card["skills"][1]["examples"]
    assert caps["summarize.text"].not_for == []


@pytest.mark.django_db
@pytest.mark.parametrize("field", ["examples", "not_for"])
@pytest.mark.parametrize(("value", "path", "message"), [
    ("x", "", "must be a list"),
    ([1, 2], "[0]", "must be a string"),
    (["ok"] * 21, "", "must have at most 20 items"),
    (["x" * 301], "[0]", "must be at most 300 characters"),
])
def test_bad_hints_are_a_400_at_their_field(registrar, field, value, path, message):
    response = register(registrar, descriptor("orders", 9401, **{field: value}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert message in error["details"][f"capabilities[0].{field}{path}"][0]
    assert not Agent.objects.filter(name="orders").exists()


@pytest.mark.django_db
def test_the_capability_api_refuses_bad_hints_by_field(world):
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    response = client.post("/api/v1/capabilities/", {
        "agent": world.agent_a.pk, "capability_id": "orders.status",
        "examples": [1], "not_for": ["x"] * 21}, format="json")
    assert response.status_code == 400
    assert {"examples.0", "not_for"} <= set(response.json()["error"]["details"])
    response = client.post("/api/v1/capabilities/", {
        "agent": world.agent_a.pk, "capability_id": "orders.status",
        "examples": ["Where is order 1234?"], "not_for": [TRACK]}, format="json")
    assert response.status_code == 201, response.json()
    assert (response.json()["examples"], response.json()["not_for"]) == (
        ["Where is order 1234?"], [TRACK])
