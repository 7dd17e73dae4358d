"""Descriptors are faithful: every field is stored with its meaning or refused by path.

The field reports' own forms (an operator's ``agents:`` entry, a ``capability.yaml``
with flat parameters) go in through the REST API and come back out of GET as sent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from registry.models import Agent, Capability
from tenants.choices import ApiKeyScope
from tenants.models import Credential
from tests import factories
from tests.conftest import key_client

EXAMPLES = Path(__file__).parent / "examples"
SALES_ENTRY = {
    "name": "cloud-chat-sales",
    "endpoint": "http://127.0.0.1:9104/v1",
    "protocol": "openai-compatible",
    "capabilities": ["chat", "tool-calling"],
    "internal_only": True,
    "auth": {"type": "header", "key": "Authorization",
             "value_env": "DOWNSTREAM_ALPHA__CLOUD_SALES_TOKEN"},
    "pool": {"max_conns": 64, "idle_timeout": "90s"},
    "routing": {"weight": 70, "priority": 1},
}


def register(client, body):
    if isinstance(body, str):
        return client.post("/api/v1/agents/register", data=body.encode(),
                           content_type="application/yaml")
    return client.post("/api/v1/agents/register", body, format="json")


@pytest.fixture
def registrar(world):
    return key_client(factories.api_key(
        tenant=world.tenant_a, scopes=[ApiKeyScope.REGISTER, ApiKeyScope.READ]).plaintext)


@pytest.mark.django_db
@pytest.mark.parametrize("form", ["json", "yaml list"])
def test_an_operators_agent_entry_round_trips(registrar, world, form):
    body = SALES_ENTRY if form == "json" else yaml.safe_dump({"agents": [SALES_ENTRY]})

    created = register(registrar, body)
    assert created.status_code == 201, created.json()
    got = registrar.get(f"/api/v1/agents/{created.json()['agent']['id']}/").json()

    assert got["protocol"] == "openai"  # openai-compatible is what "openai" means here
    assert (got["internal_only"], got["weight"], got["priority"]) == (True, 70, 1)
    assert (got["pool_max_connections"], got["pool_idle_seconds"]) == (64, 90)
    assert [c["capability_id"] for c in got["capabilities"]] == ["chat", "tool-calling"]
    (credential,) = got["credentials"]
    assert credential["tenant"] == world.tenant_a.slug
    assert (credential["kind"], credential["field_name"], credential["value_env"]) == (
        "header", "Authorization", "DOWNSTREAM_ALPHA__CLOUD_SALES_TOKEN")
    assert credential["secret_source"] == "environment variable DOWNSTREAM_ALPHA__CLOUD_SALES_TOKEN"
    assert got["descriptor"] == SALES_ENTRY
    assert got["instances"][0]["endpoint"] == "http://127.0.0.1:9104/v1"


@pytest.mark.django_db
def test_a_cert_entry_becomes_the_owners_mtls_credential_reference(registrar, world):
    # The example names the variable and files lent to tenant ops; the registrar is alpha.
    response = register(registrar, (EXAMPLES / "field-report.agents.yaml").read_text()
                        .replace("DOWNSTREAM_OPS__", "DOWNSTREAM_ALPHA__")
                        .replace("/certs/ops/", "/certs/alpha/"))

    assert response.status_code == 201, response.json()
    agent = Agent.objects.get(name="internal-order-agent")
    assert (agent.protocol, agent.internal_only, agent.weight, agent.priority) == (
        "openai", True, 30, 2)
    assert (agent.pool_max_connections, agent.pool_idle_seconds) == (32, 120)
    credential = Credential.objects.get(agent=agent)
    assert credential.tenant == world.tenant_a
    assert (credential.kind, credential.client_cert_path, credential.value_env,
            credential.ca_file) == ("mtls", "/etc/agent-reach/certs/alpha/client.crt",
                                    "DOWNSTREAM_ALPHA__INTERNAL_CLIENT_KEY",
                                    "/etc/agent-reach/certs/alpha/ca.pem")


@pytest.mark.django_db
def test_re_registering_without_routing_keeps_what_an_operator_set(registrar):
    assert register(registrar, SALES_ENTRY).status_code == 201
    Agent.objects.filter(name="cloud-chat-sales").update(weight=5, internal_only=False)
    bare = {k: v for k, v in SALES_ENTRY.items() if k not in ("routing", "internal_only")}

    assert register(registrar, bare).status_code == 200
    agent = Agent.objects.get(name="cloud-chat-sales")
    assert (agent.weight, agent.internal_only, agent.priority) == (5, False, 1)


@pytest.mark.django_db
def test_a_secret_written_into_a_descriptor_is_refused_and_not_echoed(registrar):
    leaked = {**SALES_ENTRY, "auth": {"type": "bearer", "token": "sk-live-0123456789abcdef"}}

    response = register(registrar, leaked)

    assert response.status_code == 400
    assert "sk-live" not in response.content.decode()
    details = response.json()["error"]["details"]
    assert "environment variable" in details["auth.token"][0]
    assert details["auth.value_env"] == ["is required for type bearer"]
    assert not Agent.objects.filter(name="cloud-chat-sales").exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("change", "path"), [
    ({"protocol": "grpc"}, "protocol"),
    ({"routing": {"weight": 70, "prority": 1}}, "routing.prority"),
    ({"pool": {"max_conns": 64, "idle_timeout": "soon"}}, "pool.idle_timeout"),
    ({"auth": {"type": "header", "value_env": "X"}}, "auth.key"),
    ({"auth": {"type": "query", "key": "k", "value_env": "X", "ca_file": "/c"}}, "auth.ca_file"),
    ({"owner": "me"}, "owner"),
    ({"capabilities": ["Not An Id"]}, "capabilities[0]"),
])
def test_an_entry_field_that_cannot_be_honoured_is_a_400_at_its_path(registrar, change, path):
    response = register(registrar, {**SALES_ENTRY, **change})

    assert response.status_code == 400, response.json()
    assert path in response.json()["error"]["details"], response.json()


@pytest.mark.django_db
def test_the_field_report_capability_yaml_is_stored_as_a_schema_that_constrains(registrar):
    response = register(registrar, (EXAMPLES / "field-report.capability.yaml").read_text())

    assert response.status_code == 201, response.json()
    cap = Capability.objects.get(capability_id="summarize_document")
    # target_lang is the agent's name for the canonical dest_lang.
    assert cap.input_schema == {
        "type": "object",
        "properties": {
            "document_url": {"type": "string", "description": "文档链接或文本内容"},
            "dest_lang": {"type": "string", "default": "zh", "enum": ["zh", "en"]},
        },
        "required": ["document_url"],
    }
    assert cap.param_map == {"dest_lang": "target_lang"}
    assert cap.output_schema["properties"]["key_points"] == {
        "type": "array", "items": {"type": "string"}}
    assert (cap.path, cap.timeout_ms, cap.qps, cap.burst) == ("/v1/summarize", 8000, 50, 100)
    agent = cap.agent
    assert agent.team == "nlp-group"
    # What the agent is written in, and its SLA, are for people: kept with the source.
    assert agent.descriptor["language"] == "python"
    assert agent.descriptor["metadata"]["sla"] == "p99_under_3s"
    assert cap.languages == []


@pytest.mark.django_db
@pytest.mark.parametrize(("field", "path", "message"), [
    ({"type": "string", "required": "yes"}, "document_url.required", "true or false"),
    ({"type": "string", "requird": True}, "document_url.requird", "not a known field"),
    ({"type": "string", "enum": ["a"], "default": "b"}, "document_url.default", "own schema"),
    ({"type": "array", "items": "strnig"}, "document_url.items", "type name"),
])
def test_a_flat_parameter_that_cannot_be_honoured_is_refused(registrar, field, path, message):
    text = (EXAMPLES / "field-report.capability.yaml").read_text()
    document = yaml.safe_load(text)
    document["capabilities"][0]["input_schema"]["document_url"] = field

    response = register(registrar, yaml.safe_dump(document, allow_unicode=True))

    assert response.status_code == 400
    details = response.json()["error"]["details"]
    full = f"capabilities[0].input_schema.{path}"
    assert message in " ".join(details.get(full, [])), details


@pytest.mark.django_db
def test_the_admin_shows_the_source_descriptor(registrar, world, client):
    assert register(registrar, SALES_ENTRY).status_code == 201
    agent = Agent.objects.get(name="cloud-chat-sales")
    client.force_login(world.superuser)

    page = client.get(f"/admin/registry/agent/{agent.pk}/change/")

    assert page.status_code == 200
    assert "openai-compatible" in page.content.decode()
    assert "DOWNSTREAM_ALPHA__CLOUD_SALES_TOKEN" in page.content.decode()


@pytest.mark.django_db
def test_a_refused_endpoint_is_reported_where_the_yaml_author_wrote_it(registrar):
    text = (EXAMPLES / "field-report.capability.yaml").read_text().replace(
        "http://127.0.0.1:9102/", "http://user:pw@127.0.0.1:9102/")

    response = register(registrar, text)

    assert response.status_code == 400
    assert list(response.json()["error"]["details"]) == ["endpoint"]


@pytest.mark.django_db
def test_another_tenant_reads_the_descriptor_without_its_auth_block(registrar, world):
    """A grantee (or any reader of a public agent) sees how to call the agent, not the
    owner's credential references (helper-40 read value_env: DOWNSTREAM_ALPHA__… from a
    granted agent's descriptor)."""
    from tenants.models import Grant

    created = register(registrar, SALES_ENTRY)
    agent_pk = created.json()["agent"]["id"]
    Grant.objects.create(tenant=world.tenant_b, agent_id=agent_pk)
    beta = key_client(factories.api_key(tenant=world.tenant_b,
                                        scopes=[ApiKeyScope.READ]).plaintext)

    seen = beta.get(f"/api/v1/agents/{agent_pk}/")

    assert seen.status_code == 200, seen.content
    assert seen.json()["descriptor"] == {k: v for k, v in SALES_ENTRY.items() if k != "auth"}
    assert "DOWNSTREAM_" not in seen.content.decode()
    assert registrar.get(f"/api/v1/agents/{agent_pk}/").json()["descriptor"] == SALES_ENTRY


@pytest.mark.django_db
def test_a_refused_certificate_field_is_named_as_the_descriptor_names_it(registrar):
    entry = {**SALES_ENTRY, "auth": {
        "type": "cert", "client_cert": "/etc/agent-reach/certs/beta/client.crt",
        "client_key_env": "DOWNSTREAM_BETA__KEY"}}

    response = register(registrar, entry)

    assert response.status_code == 400, response.json()
    details = response.json()["error"]["details"]
    assert {"auth.client_cert", "auth.client_key_env"} <= set(details), details
