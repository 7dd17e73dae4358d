"""Agent names are unique within a namespace regardless of letter case (after NFC)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.db import IntegrityError, transaction
from django.urls import reverse
from rest_framework.test import APIClient

from registry.models import Agent, normalise_agent_name
from tenants.choices import ApiKeyScope
from tests import factories
from tests.conftest import key_client

EXAMPLES = Path(__file__).parent / "examples"


def _descriptor(name: str, port: int) -> dict:
    body = json.loads((EXAMPLES / "translator.json").read_text())
    body["agent_id"] = name
    body["reach"]["endpoint"] = f"http://127.0.0.1:{port}/"
    return body


@pytest.fixture
def registrar(world):
    return key_client(factories.api_key(tenant=world.tenant_a,
                                        scopes=[ApiKeyScope.REGISTER]).plaintext)


@pytest.mark.django_db
def test_registering_a_name_differing_only_in_case_is_refused(registrar, world):
    first = registrar.post("/api/v1/agents/register", _descriptor("acca-xa", 9301), format="json")
    assert first.status_code == 201, first.content
    for rival_client in (registrar, key_client(factories.api_key(
            tenant=world.tenant_b, scopes=[ApiKeyScope.REGISTER]).plaintext)):
        again = rival_client.post("/api/v1/agents/register", _descriptor("ACCA-XA", 9302),
                                  format="json")
        assert again.status_code == 400, again.content
        error = again.json()["error"]
        assert error["code"] == "invalid_input"
        # It says the name is taken, not how the other agent spells it.
        assert "is taken" in " ".join(error["details"]["name"])
        assert "acca-xa" not in " ".join(error["details"]["name"])
        assert "case" in error["message"]
    assert list(Agent.objects.filter(name__iexact="acca-xa").values_list("name", flat=True)) == [
        "acca-xa"]
    # The exact name still re-registers (idempotent).
    assert registrar.post("/api/v1/agents/register", _descriptor("acca-xa", 9301),
                          format="json").status_code == 200


@pytest.mark.django_db
def test_the_agents_api_refuses_a_case_twin(world):
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    response = client.post("/api/v1/agents/", {
        "namespace": "default", "name": "ALPHA-Translator", "owner_tenant": "alpha"},
        format="json")
    assert response.status_code == 400, response.content
    assert "name" in response.json()["error"]["details"]
    renamed = client.patch(f"/api/v1/agents/{world.agent_a.pk}/", {"name": "Alpha-Translator"},
                           format="json")
    assert renamed.status_code == 200, renamed.content  # its own name in another case


@pytest.mark.django_db
def test_the_admin_refuses_a_case_twin(world, client):
    client.force_login(world.superuser)
    response = client.post(reverse("admin:registry_agent_add"), {
        "namespace": world.agent_a.namespace_id, "name": "ALPHA-TRANSLATOR",
        "owner_tenant": world.tenant_a.pk, "version": "1.0.0", "protocol": "http",
    })
    assert response.status_code == 200  # the form again, with the error
    assert b"regardless of letter case" in response.content
    assert Agent.objects.filter(name__iexact="alpha-translator").count() == 1


@pytest.mark.django_db
def test_the_database_enforces_it_too(world):
    with pytest.raises(IntegrityError), transaction.atomic():
        Agent.objects.create(namespace=world.agent_a.namespace, name="ALPHA-translator",
                             owner_tenant=world.tenant_b)
    other = factories.namespace("other")
    Agent.objects.create(namespace=other, name="ALPHA-translator", owner_tenant=world.tenant_b)


def test_names_are_nfc_normalised():
    decomposed = "cafe\u0301"
    assert normalise_agent_name(decomposed) == "caf\u00e9"
    assert normalise_agent_name("acca-xa") == "acca-xa"


@pytest.mark.django_db
def test_superuser_api_client_sees_the_same_rule(world):
    api = APIClient()
    api.force_login(world.superuser)
    response = api.post("/api/v1/agents/", {
        "namespace": "default", "name": "BETA-SUMMARISER", "owner_tenant": "alpha"},
        format="json")
    assert response.status_code == 400
