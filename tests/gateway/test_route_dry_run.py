"""GET /v1/route on a real uvicorn gateway, reading the route table built from the database."""

from __future__ import annotations

import httpx
import pytest
from django.conf import settings

from registry.services import agent_register
from registry.spec import AgentSpec, CapabilitySpec
from tenants.choices import ApiKeyScope
from tests import factories
from tests.gateway.conftest import database_url
from tests.support.servers import free_port, platform_env, running, uvicorn_args


@pytest.fixture
def gateway(transactional_db, tmp_path):
    factories.seed_defaults()
    tenant = factories.tenant()
    other = factories.tenant()
    for name, port, cap, desc in [
        ("translator", 9501, "translate.text", "Translate text between Chinese and English"),
        ("summariser", 9502, "summarize.text", "Summarise long documents into bullet points"),
    ]:
        agent_register(tenant=tenant, spec=AgentSpec(
            name=name, endpoint=f"http://127.0.0.1:{port}/",
            capabilities=(CapabilitySpec(capability_id=cap, description=desc,
                                         keywords=(cap.split(".")[0],)),),
        ))
    down = agent_register(tenant=tenant, spec=AgentSpec(
        name="down", endpoint="http://127.0.0.1:9503/",
        capabilities=(CapabilitySpec(capability_id="ocr.image"),),
    ))
    down.instance.state = "offline"
    down.instance.save()
    agent_register(tenant=other, spec=AgentSpec(
        name="private", endpoint="http://127.0.0.1:9504/",
        capabilities=(CapabilitySpec(
            capability_id="secret.thing",
            description="Reconcile the quarterly ledger of the treasury",
            keywords=("ledger",)),),
    ))
    key = factories.api_key(tenant=tenant, scopes=[ApiKeyScope.INVOKE]).plaintext
    read_only = factories.api_key(tenant=tenant, scopes=[ApiKeyScope.READ]).plaintext
    port = free_port()
    env = platform_env(tmp_path, DATABASE_URL=database_url(),
                       REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS))
    with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "log") as base:
        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"})
        yield client, read_only
        client.close()


def test_a_dry_run_by_capability_ranks_and_explains(gateway):
    client, _ = gateway
    response = client.get("/v1/route", params={"capability": "translate.text"},
                          headers={"X-Request-ID": "dry-1"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["request_id"] == "dry-1" and body["capability"] == "translate.text"
    assert body["table_version"] > 0
    [candidate] = body["candidates"]
    assert candidate["agent"] == "translator"
    assert set(candidate["scores"]) == {"match", "weight", "health_factor", "load_pressure",
                                        "success_factor", "latency_factor", "final"}


def test_a_dry_run_by_intent_reports_the_match(gateway):
    client, _ = gateway
    body = client.get("/v1/route", params={"intent": "please translate this into English"}
                      ).json()
    assert body["capability"] == "translate.text"
    assert body["matches"][0]["capability"] == "translate.text"
    plan = client.get("/v1/route", params={
        "intent": "summarise this report and then translate it"}).json()
    assert plan["plan"] == ["summarize.text", "translate.text"]


@pytest.mark.parametrize(
    ("params", "status", "code"),
    [
        ({"capability": "nobody.offers.this"}, 404, "no_capability"),
        ({"capability": "secret.thing"}, 404, "no_capability"),  # another tenant's, private
        ({"capability": "ocr.image"}, 503, "no_healthy_instance"),
        ({}, 400, "invalid_input"),
        ({"capability": "translate.text", "intent": "x"}, 400, "invalid_input"),
        ({"capability": "translate.text", "input_chars": "many"}, 400, "invalid_input"),
    ],
)
def test_structured_errors(gateway, params, status, code):
    client, _ = gateway
    response = client.get("/v1/route", params=params)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["request_id"] == response.headers["x-request-id"]
    assert isinstance(error["retryable"], bool)


@pytest.mark.parametrize(("query", "says"), [
    ("intent=%ED%A0%80abc", "UTF-8"),  # an encoded lone surrogate
    ("intent=%FF%FEtranslate", "UTF-8"),
    ("intent=translate%20this&intent=summarize%20that", "more than once"),
    ("capability=translate.text&capability=ocr.image", "more than once"),
    # helper-38: a parameter the dry run does not know was ignored (a misspelt
    # "min_verison" is a dry run of another question), and an empty intent got the
    # generic "give exactly one".
    ("capability=translate.text&min_verison=2", "'min_verison'"),
    ("intent=", "'intent' is empty"),
    ("capability=&intent=translate%20this", "'capability' is empty"),
])
def test_a_query_not_in_utf_8_or_with_a_repeated_parameter_is_refused(gateway, query, says):
    """Break test (helper-36): these were matched (as replacement characters, or the last
    of the two) where the X-Reach-Intent header answers 400."""
    client, _ = gateway
    response = client.get(f"/v1/route?{query}")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_input" and says in error["message"]


def test_the_no_healthy_instance_error_says_why(gateway):
    client, _ = gateway
    body = client.get("/v1/route", params={"capability": "ocr.image"}).json()
    assert body["route"]["dropped"][0]["reason"] == "instance_offline"


@pytest.mark.parametrize(
    ("header", "status"),
    [(None, 401), ("Bearer rk_AAAAAAAAAA_nope", 401), ("Basic abc", 401), ("read_only", 403)],
)
def test_callers_need_an_invoke_key(gateway, header, status):
    client, read_only = gateway
    headers = {"Authorization": f"Bearer {read_only}" if header == "read_only" else header or ""}
    response = httpx.get(f"{client.base_url}/v1/route", params={"capability": "translate.text"},
                         headers=headers)
    assert response.status_code == status
    assert response.json()["error"]["code"] in ("unauthorized", "forbidden")


def test_another_tenants_private_agent_is_never_named(gateway):
    client, _ = gateway
    by_intent = client.get("/v1/route", params={"intent": "reconcile the treasury ledger"})
    assert "secret.thing" not in by_intent.text and "private" not in by_intent.text
    by_name = client.post("/v1/chat/completions", json={
        "model": "private", "messages": [{"role": "user", "content": "hi"}]})
    nobody = client.post("/v1/chat/completions", json={
        "model": "nobody-at-all", "messages": [{"role": "user", "content": "hi"}]})
    assert by_name.status_code == nobody.status_code == 404
    # Exactly as for an agent that does not exist, so nothing tells the two apart.
    assert by_name.json()["error"]["message"] == \
        nobody.json()["error"]["message"].replace("nobody-at-all", "private")
    assert "secret.thing" not in by_name.text
