"""GET /v1/models in the OpenAI shape: the official SDK lists the agents (and
capabilities) a key may reach, and retrieves one; another tenant's private agents are
not there."""

from __future__ import annotations

import openai
import pytest

from registry.services import agent_register
from registry.spec import AgentSpec, CapabilitySpec
from tests import factories


@pytest.mark.django_db(transaction=True)
def test_the_openai_sdk_lists_and_retrieves_the_reachable_agents(gateway):
    other = factories.tenant()
    agent_register(tenant=other, spec=AgentSpec(
        name="someone-private", endpoint=f"http://127.0.0.1:{gateway.agent_port}/",
        capabilities=(CapabilitySpec(capability_id="private.thing", path="/echo"),)))
    client = openai.OpenAI(base_url=f"{gateway.base}/v1", api_key=gateway.key)
    ids = [m.id for m in client.models.list()]
    assert {"scripted", "scripted-chat", "capability:echo.all",
            "capability:chat.scripted"} <= set(ids)
    assert "someone-private" not in ids and "capability:private.thing" not in ids
    assert ids == sorted(ids)
    model = client.models.retrieve("scripted-chat")
    assert model.id == "scripted-chat" and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("someone-private")
    # What it lists, the chat door takes as a model.
    reply = client.chat.completions.create(
        model="capability:chat.scripted", messages=[{"role": "user", "content": "hi there"}])
    assert reply.choices[0].message.content


@pytest.mark.django_db(transaction=True)
def test_the_indexes_answer_and_list_what_is_there(gateway):
    import httpx

    gateway_index = httpx.get(f"{gateway.base}/v1/", timeout=10)
    assert gateway_index.status_code == 200
    assert "POST /v1/invoke" in gateway_index.json()["doors"]
    api_index = httpx.get(f"{gateway.base}/api/v1/", timeout=10)
    assert api_index.status_code == 200
    resources = api_index.json()["resources"]
    assert {"agents", "tenants", "tools", "api-keys"} <= set(resources)
    agents = httpx.get(resources["agents"], timeout=10,
                       headers={"Authorization": f"Bearer {gateway.key}"})
    assert agents.status_code in (200, 403)  # a listed URL answers (the key may lack scope)
