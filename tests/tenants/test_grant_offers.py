"""A grant is an offer until the grantee accepts it.

A granted agent counts as the grantee's own in routing (own first). When the owner's
grant took effect at once, a break test had tenant beta register an agent under alpha's
private capability id, grant it to alpha, and draw 8 of alpha's 10 calls to it, inputs
and all, billed at beta's price; alpha could not even delete the grant."""

from __future__ import annotations

import pytest

from registry.models import Agent
from registry.snapshot import build_table
from routing.router import Router, RouteRequest
from tenants.choices import ApiKeyScope
from tenants.models import Grant
from tests import factories
from tests.conftest import key_client

ALL = [ApiKeyScope.MANAGE, ApiKeyScope.REGISTER, ApiKeyScope.READ]


def chosen_agents(tenant_pk: int, capability_id: str) -> set[str]:
    decision = Router().route(build_table(), RouteRequest(tenant_pk=tenant_pk,
                                                          capability=capability_id), pick=False)
    return {c.agent.name for c in decision.candidates}


@pytest.mark.django_db
def test_an_unasked_grant_draws_none_of_the_grantees_calls_until_accepted(world):
    payroll = factories.capability(agent=world.agent_a, capability_id="alpha.payroll")
    factories.instance(agent=world.agent_a)
    alpha = key_client(factories.api_key(tenant=world.tenant_a, scopes=ALL).plaintext)
    beta = key_client(factories.api_key(tenant=world.tenant_b, scopes=ALL).plaintext)
    hijack = beta.post("/api/v1/agents/register", {
        "agent_id": "beta-hijack", "version": "1.0.0",
        "reach": {"protocol": "http", "endpoint": "http://127.0.0.1:19411/", "weight": 1000},
        "capabilities": [{"id": payroll.capability_id, "path": "/hijack"}]}, format="json")
    assert hijack.status_code == 201, hijack.content
    agent_pk = Agent.objects.get(name="beta-hijack").pk

    offered = beta.post("/api/v1/grants/", {"tenant": "alpha", "agent": agent_pk},
                        format="json")

    assert offered.status_code == 201, offered.content
    assert offered.json()["accepted_at"] is None  # an offer
    assert chosen_agents(world.tenant_a.pk, "alpha.payroll") == {world.agent_a.name}
    seen = [a["id"] for a in alpha.get("/api/v1/agents/").json()["results"]]
    assert agent_pk not in seen  # not even shown
    grant = offered.json()["id"]
    # Only the grantee accepts: the giver cannot accept on its behalf.
    assert beta.post(f"/api/v1/grants/{grant}/accept/", {"capabilities": ["alpha.payroll"]},
                     format="json").status_code == 403
    assert Grant.objects.get(pk=grant).accepted_at is None

    accepted = alpha.post(f"/api/v1/grants/{grant}/accept/",
                          {"capabilities": ["alpha.payroll"]}, format="json")

    assert accepted.status_code == 200, accepted.content
    assert accepted.json()["accepted_at"] is not None
    assert "beta-hijack" in chosen_agents(world.tenant_a.pk, "alpha.payroll")
    # ...and the grantee may give it up again.
    assert alpha.delete(f"/api/v1/grants/{grant}/").status_code == 204
    assert chosen_agents(world.tenant_a.pk, "alpha.payroll") == {world.agent_a.name}


@pytest.mark.django_db
def test_a_grant_given_by_whoever_manages_both_tenants_is_in_force_at_once(world):
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_login(world.superuser)
    given = api.post("/api/v1/grants/", {"tenant": "beta", "agent": world.agent_a.pk},
                     format="json")
    assert given.status_code == 201, given.content
    assert given.json()["accepted_at"] is not None
    assert any(g.agent_pk == world.agent_a.pk for g in build_table().grants.values())


@pytest.mark.django_db
def test_in_the_admin_the_owner_offers_and_only_the_grantee_accepts(world, client):
    client.force_login(world.outsider)  # beta's admin offers beta's agent to alpha
    added = client.post("/admin/tenants/grant/add/", {
        "tenant": world.tenant_a.pk, "agent": world.agent_b.pk, "accepted_at": "2020-01-01"})
    assert added.status_code == 302, added.content.decode()[:2000]
    grant = Grant.objects.get(tenant=world.tenant_a, agent=world.agent_b)
    assert grant.accepted_at is None  # the form cannot set it either
    action = {"action": "accept", "_selected_action": [grant.pk]}
    client.post("/admin/tenants/grant/", action)
    grant.refresh_from_db()
    assert grant.accepted_at is None  # beta cannot accept for alpha

    factories.capability(agent=world.agent_b, capability_id="beta.tool")
    factories.capability(agent=world.agent_b, capability_id="alpha.own")
    factories.capability(agent=world.agent_a, capability_id="alpha.own")
    client.force_login(world.owner)
    listing = client.get("/admin/tenants/grant/").content.decode()
    assert "alpha.own, beta.tool" in listing  # what is offered, shown before accepting
    client.post("/admin/tenants/grant/", action)

    grant.refresh_from_db()
    assert grant.accepted_at is not None
    assert grant.accepted_capabilities == ["beta.tool"]  # never alpha's own id


@pytest.mark.django_db
def test_an_accepted_grant_covers_what_was_offered_not_what_the_giver_adds_later(world):
    """helper-41: after alpha accepted a grant of a harmless capability, beta renamed it
    to alpha's own id (or re-registered the granted agent with it) and took alpha's
    calls. Acceptance covers the ids offered then; more needs accepting again."""
    factories.capability(agent=world.agent_a, capability_id="alpha.payroll")
    factories.instance(agent=world.agent_a)
    alpha = key_client(factories.api_key(tenant=world.tenant_a, scopes=ALL).plaintext)
    beta = key_client(factories.api_key(tenant=world.tenant_b, scopes=ALL).plaintext)

    def register(*capability_ids: str) -> int:
        reply = beta.post("/api/v1/agents/register", {
            "agent_id": "beta-helper", "version": "1.0.0",
            "reach": {"protocol": "http", "endpoint": "http://127.0.0.1:19411/",
                      "weight": 1000},
            "capabilities": [{"id": c, "path": "/x"} for c in capability_ids]},
            format="json")
        assert reply.status_code in (200, 201), reply.content
        return Agent.objects.get(name="beta-helper").pk

    agent_pk = register("x.helper")
    helper = Agent.objects.get(pk=agent_pk).capabilities.get().pk
    by_agent = beta.post("/api/v1/grants/", {"tenant": "alpha", "agent": agent_pk},
                         format="json").json()["id"]
    by_capability = beta.post("/api/v1/grants/", {"tenant": "alpha", "capability": helper},
                              format="json").json()["id"]
    for grant in (by_agent, by_capability):
        accepted = alpha.post(f"/api/v1/grants/{grant}/accept/",
                              {"capabilities": ["x.helper"]}, format="json")
        assert accepted.json()["accepted_capabilities"] == ["x.helper"], accepted.content
    assert chosen_agents(world.tenant_a.pk, "x.helper") == {"beta-helper"}

    renamed = beta.patch(f"/api/v1/capabilities/{helper}/", {"capability_id": "alpha.payroll"},
                         format="json")
    assert renamed.status_code == 200, renamed.content
    assert chosen_agents(world.tenant_a.pk, "alpha.payroll") == {world.agent_a.name}
    assert chosen_agents(world.tenant_a.pk, "x.helper") == set()  # renamed away: not granted
    register("alpha.payroll", "x.helper")  # the agent offers alpha's id, and x.helper again
    assert chosen_agents(world.tenant_a.pk, "alpha.payroll") == {world.agent_a.name}
    assert chosen_agents(world.tenant_a.pk, "x.helper") == {"beta-helper"}

    # Accepting again, naming the id, is consent to it.
    alpha.post(f"/api/v1/grants/{by_agent}/accept/",
               {"capabilities": ["alpha.payroll", "x.helper"]}, format="json")
    assert "beta-helper" in chosen_agents(world.tenant_a.pk, "alpha.payroll")


@pytest.mark.django_db
def test_the_grantee_sees_what_it_is_offered_and_accepts_only_what_it_names(world):
    """helper-42: a private agent's offer could not be read by the grantee, and accepting
    covered all it offered, the grantee's own id among them, so the giver took the
    grantee's calls. The offer lists its ids; an acceptance names those it covers, and an
    id no longer offered (the offer changed meanwhile) is a 409."""
    factories.capability(agent=world.agent_a, capability_id="pay.charge")
    factories.instance(agent=world.agent_a)
    alpha = key_client(factories.api_key(tenant=world.tenant_a, scopes=ALL).plaintext)
    beta = key_client(factories.api_key(tenant=world.tenant_b, scopes=ALL).plaintext)
    assert beta.post("/api/v1/agents/register", {
        "agent_id": "b-blind", "version": "1.0.0",
        "reach": {"protocol": "http", "endpoint": "http://127.0.0.1:19419/", "weight": 10000},
        "capabilities": [{"id": "b.helper", "path": "/x"}, {"id": "pay.charge", "path": "/x"}]},
        format="json").status_code == 201
    agent_pk = Agent.objects.get(name="b-blind").pk
    grant = beta.post("/api/v1/grants/", {"tenant": "alpha", "agent": agent_pk},
                      format="json").json()["id"]

    offer = alpha.get(f"/api/v1/grants/{grant}/").json()

    assert offer["offered_capabilities"] == ["b.helper", "pay.charge"]
    assert alpha.post(f"/api/v1/grants/{grant}/accept/").status_code == 400  # names nothing
    stale = alpha.post(f"/api/v1/grants/{grant}/accept/",
                       {"capabilities": ["b.helper", "b.gone"]}, format="json")
    assert stale.status_code == 409 and "b.gone" in stale.json()["error"]["message"]
    accepted = alpha.post(f"/api/v1/grants/{grant}/accept/", {"capabilities": ["b.helper"]},
                          format="json")
    assert accepted.status_code == 200, accepted.content
    assert accepted.json()["accepted_capabilities"] == ["b.helper"]
    assert chosen_agents(world.tenant_a.pk, "pay.charge") == {world.agent_a.name}
    assert chosen_agents(world.tenant_a.pk, "b.helper") == {"b-blind"}
