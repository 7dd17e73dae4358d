"""Registration through the REST API: three formats, every error at once, token isolation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from django.conf import settings

from registry.models import Agent, AgentToken, Capability, Instance
from registry.spec import CapabilitySpec
from tenants.choices import ApiKeyScope
from tests import factories
from tests.conftest import key_client

EXAMPLES = Path(__file__).parent / "examples"
# Every field a descriptor sets.
CAP_FIELDS = [f.name for f in dataclasses.fields(CapabilitySpec)]


def register(client, body, **headers):
    if isinstance(body, str):
        return client.post("/api/v1/agents/register", data=body.encode(),
                           content_type="application/yaml", **headers)
    return client.post("/api/v1/agents/register", body, format="json", **headers)


@pytest.fixture
def registrar(world):
    return key_client(factories.api_key(tenant=world.tenant_a,
                                        scopes=[ApiKeyScope.REGISTER]).plaintext)


def _capabilities(agent_id: int) -> list[dict]:
    rows = Capability.objects.filter(agent_id=agent_id).order_by("capability_id")
    return [{f: getattr(c, f) for f in CAP_FIELDS} for c in rows]


@pytest.mark.django_db
def test_the_three_formats_register_identical_capabilities(registrar):
    bodies = {
        "json": json.loads((EXAMPLES / "translator.json").read_text()),
        "yaml": (EXAMPLES / "translator.capability.yaml").read_text(),
        "a2a": json.loads((EXAMPLES / "translator.agent-card.json").read_text()),
    }
    seen = {}
    for fmt, body in bodies.items():
        Agent.objects.all().delete()
        response = register(registrar, body)
        assert response.status_code == 201, (fmt, response.json())
        assert response.json()["agent_token"].startswith("rat_")
        agent_id = response.json()["agent"]["id"]
        seen[fmt] = _capabilities(agent_id)
        assert Instance.objects.get(agent_id=agent_id).endpoint == "http://127.0.0.1:9101/"
    # Each format names the target language its own way; all are normalised to
    # dest_lang, and each keeps its own name in param_map for the way back.
    own_names = {"json": "target_lang", "yaml": "to_language", "a2a": "lang_to"}
    for fmt, caps in seen.items():
        translate = next(c for c in caps if c["capability_id"] == "translate.text")
        assert translate.pop("param_map") == {"dest_lang": own_names[fmt]}
        assert "dest_lang" in translate["input_schema"]["properties"]
        for cap in caps:
            cap.pop("param_map", None)
    assert seen["json"] == seen["yaml"] == seen["a2a"]


@pytest.mark.django_db
def test_param_map_keeps_each_agents_own_name(registrar):
    yaml_text = (EXAMPLES / "translator.capability.yaml").read_text()
    response = register(registrar, yaml_text)
    cap = Capability.objects.get(agent_id=response.json()["agent"]["id"],
                                 capability_id="translate.text")
    assert cap.param_map == {"dest_lang": "to_language"}


@pytest.mark.django_db
def test_an_invalid_descriptor_lists_every_problem_and_writes_nothing(registrar):
    body = json.loads((EXAMPLES / "invalid.json").read_text())
    agents_before = Agent.objects.count()
    response = register(registrar, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert error["details"]["capabilities[2].timeout_ms"] == ["must be a positive integer"]
    assert len(error["details"]) >= 4
    assert "capabilities[2].timeout_ms: must be a positive integer" in error["message"]
    assert Agent.objects.count() == agents_before and not AgentToken.objects.exists()


@pytest.mark.django_db
def test_re_registering_is_idempotent_and_publishes_changed_capabilities(
    registrar, published, django_capture_on_commit_callbacks
):
    body = json.loads((EXAMPLES / "translator.json").read_text())
    with django_capture_on_commit_callbacks(execute=True):
        first = register(registrar, body)
    assert first.status_code == 201
    agent_id = first.json()["agent"]["id"]
    body["capabilities"] = body["capabilities"][:1]
    body["capabilities"][0]["version"] = "3.0.0"
    published.clear()
    with django_capture_on_commit_callbacks(execute=True):
        second = register(registrar, body)
    assert second.status_code == 200 and second.json()["created"] is False
    assert second.json()["agent"]["id"] == agent_id
    assert Agent.objects.filter(name="translator").count() == 1
    assert Instance.objects.filter(agent_id=agent_id).count() == 1
    caps = Capability.objects.filter(agent_id=agent_id)
    assert [(c.capability_id, c.version) for c in caps] == [("translate.text", "3.0.0")]
    # Published when the registration commits, not at the next heartbeat.
    agent_deltas = [m for m in published if m["kind"] == "agent" and m["pk"] == agent_id]
    assert len(agent_deltas) == 1
    entry = agent_deltas[0]["entry"]
    assert [(c["capability_id"], c["version"]) for c in entry["capabilities"]] == [
        ("translate.text", "3.0.0")
    ]


@pytest.mark.django_db
def test_another_tenant_cannot_take_over_a_name(registrar, world):
    body = json.loads((EXAMPLES / "translator.json").read_text())
    assert register(registrar, body).status_code == 201
    rival = key_client(factories.api_key(tenant=world.tenant_b,
                                         scopes=[ApiKeyScope.REGISTER]).plaintext)
    response = register(rival, body)
    assert response.status_code == 409 and response.json()["error"]["code"] == "conflict"


@pytest.mark.django_db
def test_invoke_and_read_keys_cannot_register(world):
    client = key_client(factories.api_key(tenant=world.tenant_a,
                                          scopes=[ApiKeyScope.INVOKE, ApiKeyScope.READ]).plaintext)
    body = json.loads((EXAMPLES / "translator.json").read_text())
    assert register(client, body).status_code == 403
    assert not Agent.objects.filter(name="translator").exists()


@pytest.mark.django_db
def test_unknown_namespace_and_ttl_rule(registrar):
    body = json.loads((EXAMPLES / "translator.json").read_text())
    body["namespace"] = "nowhere"
    body["liveness"] = {"ttl_seconds": 20, "heartbeat_interval_seconds": 10}
    details = register(registrar, body).json()["error"]["details"]
    assert "liveness.ttl_seconds" in details
    body["liveness"] = {"ttl_seconds": 30, "heartbeat_interval_seconds": 10}
    details = register(registrar, body).json()["error"]["details"]
    assert details == {"namespace": ["unknown namespace 'nowhere'"]}


# ---- agent tokens ------------------------------------------------------------------------


def _registered(registrar, name: str, port: int) -> tuple[dict, object]:
    body = json.loads((EXAMPLES / "translator.json").read_text())
    body["agent_id"] = name
    body["reach"]["endpoint"] = f"http://127.0.0.1:{port}/"
    reply = register(registrar, body).json()
    return reply, key_client(reply["agent_token"])


@pytest.mark.django_db
def test_agent_x_cannot_touch_agent_y(registrar):
    x, x_client = _registered(registrar, "agent-x", 9201)
    y, _ = _registered(registrar, "agent-y", 9202)
    y_instance = y["instance"]["id"]
    for response in (
        x_client.post(f"/api/v1/instances/{y_instance}/heartbeat", {}, format="json"),
        x_client.post(f"/api/v1/instances/{y_instance}/deregister"),
        x_client.delete(f"/api/v1/agents/{y['agent']['id']}/"),
        x_client.get(f"/api/v1/agents/{y['agent']['id']}/"),
    ):
        assert response.status_code == 404, response.content
        # The route exists; the object is simply not there for this token.
        assert "No such path" not in response.json()["error"]["message"]
    body = json.loads((EXAMPLES / "translator.json").read_text())
    body["agent_id"] = "agent-y"
    assert register(x_client, body).status_code == 409
    assert Instance.objects.get(pk=y_instance).state == "healthy"
    # ...while its own agent is fully in reach.
    own = x["instance"]["id"]
    assert x_client.post(f"/api/v1/instances/{own}/heartbeat", {"cpu": 0.3},
                         format="json").status_code == 200
    assert x_client.get("/api/v1/agents/").json()["count"] == 1


@pytest.mark.django_db
def test_an_agent_token_reads_no_tenant_data_and_cannot_patch(registrar):
    x, x_client = _registered(registrar, "agent-x", 9201)
    for url in ("/api/v1/tenants/", "/api/v1/api-keys/", "/api/v1/credentials/",
                "/api/v1/usage/events/"):
        assert x_client.get(url).status_code == 403, url
    response = x_client.patch(f"/api/v1/agents/{x['agent']['id']}/", {"weight": 1},
                              format="json")
    assert response.status_code == 403


@pytest.mark.django_db
def test_an_agent_token_adds_an_instance_to_its_own_agent(registrar):
    x, x_client = _registered(registrar, "agent-x", 9201)
    body = json.loads((EXAMPLES / "translator.json").read_text())
    body["agent_id"] = "agent-x"
    body["reach"]["endpoint"] = "http://127.0.0.1:9299/"
    response = register(x_client, body)
    assert response.status_code == 200 and response.json()["agent_token"] is None
    assert Instance.objects.filter(agent_id=x["agent"]["id"]).count() == 2


@pytest.mark.django_db
def test_tenant_b_cannot_see_tenant_a_private_agents_but_sees_public_ones(registrar, world):
    x, _ = _registered(registrar, "agent-x", 9201)
    b_client = key_client(factories.api_key(tenant=world.tenant_b).plaintext)
    assert b_client.get(f"/api/v1/agents/{x['agent']['id']}/").status_code == 404
    assert b_client.get("/api/v1/agents/?q=agent-x").json()["count"] == 0
    Agent.objects.filter(pk=x["agent"]["id"]).update(visibility="public")
    found = b_client.get("/api/v1/agents/?capability=translate.text").json()
    assert [a["name"] for a in found["results"]] == ["agent-x"]


# ---- endpoint safety ---------------------------------------------------------------------

REFUSED = [
    "file:///etc/passwd",
    "gopher://127.0.0.1:70/",
    "http://user:pw@127.0.0.1:9000/",
    "http://2130706433/",
    "http://0x7f000001/",
    "http://127.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fd00:ec2::254]/",
    f"http://127.0.0.1:{settings.OWN_PORTS[0]}/",
    "http://203.0.113.7:8080/",
    "http://agents.example.com/",
]


@pytest.mark.django_db
@pytest.mark.parametrize("endpoint", REFUSED)
def test_refused_endpoints_get_400_and_write_nothing(registrar, endpoint):
    body = json.loads((EXAMPLES / "translator.json").read_text())
    body["reach"]["endpoint"] = endpoint
    agents_before = Agent.objects.count()
    response = register(registrar, body)
    assert response.status_code == 400, response.content
    assert "reach.endpoint" in response.json()["error"]["details"]
    assert Agent.objects.count() == agents_before and not Instance.objects.exists()


@pytest.mark.django_db
def test_endpoints_set_through_the_instance_api_are_checked_too(world):
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    response = client.post("/api/v1/instances/",
                           {"agent": world.agent_a.pk, "endpoint": "http://169.254.169.254/"},
                           format="json")
    assert response.status_code == 400 and "endpoint" in response.json()["error"]["details"]
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_registering_by_agent_card_url_fetches_the_card(registrar):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    card = (EXAMPLES / "translator.agent-card.json").read_bytes()

    class Card(BaseHTTPRequestHandler):
        def do_GET(self):
            found = self.path == "/.well-known/agent-card.json"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(card if found else b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Card)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        response = register(registrar, {"card_url": f"{base}/.well-known/agent-card.json"})
        missing = register(registrar, {"card_url": f"{base}/.well-known/nothing.json"})
        refused = register(registrar, {"card_url": "http://169.254.169.254/.well-known/x"})
    finally:
        server.shutdown()
        server.server_close()
    assert response.status_code == 201, response.content
    assert {c["capability_id"] for c in response.json()["agent"]["capabilities"]} == {
        "translate.text", "summarize.text"}
    assert missing.status_code == 400 and "card_url" in missing.json()["error"]["details"]
    assert refused.status_code == 400 and "card_url" in refused.json()["error"]["details"]


@pytest.mark.django_db
def test_a_patch_is_held_to_what_a_descriptor_may_say(registrar, world):
    """Paths must start with / and leases are a day at most, whether registered or
    changed later through the API (a break test PATCHed "@169.254.169.254/latest" in
    as a capability path and registered a 31-year lease)."""
    body = json.loads((EXAMPLES / "translator.json").read_text())
    body["liveness"] = {"ttl_seconds": 1_000_000_000, "heartbeat_interval_seconds": 10}
    refused = register(registrar, body)
    assert refused.status_code == 400
    assert "liveness.ttl_seconds" in refused.json()["error"]["details"]

    manage = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    capability = factories.capability(agent=world.agent_a, path="/translate")
    before = (capability.path, world.agent_a.probe_path, world.agent_a.lease_ttl_seconds)
    for url, change in ((f"/api/v1/capabilities/{capability.pk}/",
                         {"path": "@169.254.169.254/latest"}),
                        (f"/api/v1/agents/{world.agent_a.pk}/",
                         {"probe_path": "@127.0.0.1:19104/pwned"}),
                        (f"/api/v1/agents/{world.agent_a.pk}/",
                         {"lease_ttl_seconds": 1_000_000_000}),
                        (f"/api/v1/agents/{world.agent_a.pk}/", {"price_per_call": "-1"}),
                        (f"/api/v1/agents/{world.agent_a.pk}/",
                         {"pool_max_connections": 1_000_000_000})):
        reply = manage.patch(url, change, format="json")
        assert reply.status_code == 400, (url, change, reply.content)
        assert set(reply.json()["error"]["details"]) == set(change)
    capability.refresh_from_db()
    world.agent_a.refresh_from_db()
    assert (capability.path, world.agent_a.probe_path,
            world.agent_a.lease_ttl_seconds) == before
    fine = manage.patch(f"/api/v1/capabilities/{capability.pk}/", {"path": "/v2/translate"},
                        format="json")
    assert fine.status_code == 200, fine.content
