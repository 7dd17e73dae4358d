"""What a descriptor says about inputs, the gateway enforces and applies.

The field report's ``capability.yaml`` (flat parameters: ``document_url`` required,
``target_lang`` defaulting to ``zh``) is registered through the registry, the route
table is built from the database, and calls go through the real pipeline to the
scripted agent, which echoes what it received.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from registry.descriptors import parse_capability_yaml
from registry.services import agent_register
from registry.snapshot import build_table
from tenants.choices import ApiKeyScope
from tests import factories
from tests.support.inprocess import in_process

EXAMPLE = Path(__file__).parents[1] / "registry" / "examples" / "field-report.capability.yaml"


@pytest.fixture
def summariser(db, scripted):
    factories.seed_defaults()
    tenant = factories.tenant(slug="nlp", name="NLP")
    text = EXAMPLE.read_text().replace("http://127.0.0.1:9102/", scripted.endpoint)
    # The scripted agent echoes on /echo: point the capability there.
    agent_register(tenant=tenant, spec=parse_capability_yaml(
        text.replace("path: /v1/summarize", "path: /echo")))
    key = factories.api_key(tenant=tenant, scopes=[ApiKeyScope.INVOKE]).plaintext
    return build_table(), key


def invoke(table, key, **input_):
    async def go():
        async with in_process(table, key) as gw:
            return await gw.post("/v1/invoke", {"capability": "summarize_document",
                                                "input": input_})
    return asyncio.run(go())


def test_an_empty_input_is_refused_naming_the_required_field(summariser):
    response = invoke(*summariser)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert "document_url" in error["message"]
    assert error["details"] == {"document_url": ["is required"]}


def test_the_declared_default_reaches_the_agent_under_its_own_name(summariser):
    response = invoke(*summariser, document_url="https://example.invalid/report.pdf")

    assert response.status_code == 200, response.json()
    assert response.json()["output"]["echo"] == {
        "document_url": "https://example.invalid/report.pdf", "target_lang": "zh"}


@pytest.mark.parametrize("name", ["dest_lang", "target_lang"])
def test_the_caller_may_use_the_canonical_or_the_agents_own_name(summariser, name):
    response = invoke(*summariser, document_url="d", **{name: "en"})

    assert response.status_code == 200, response.json()
    assert response.json()["output"]["echo"] == {"document_url": "d", "target_lang": "en"}


def test_a_value_outside_the_declared_enum_is_refused(summariser):
    response = invoke(*summariser, document_url="d", dest_lang="fr")

    assert response.status_code == 400
    assert list(response.json()["error"]["details"]) == ["dest_lang"]


def test_one_parameter_under_two_names_is_refused_not_guessed(summariser):
    response = invoke(*summariser, document_url="d", dest_lang="en", target_lang="zh")

    assert response.status_code == 400
    assert "name the same parameter" in response.json()["error"]["message"]
