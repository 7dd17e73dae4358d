"""Bodies sent without a length (Transfer-Encoding: chunked) are read as sent, by the API
and the heartbeat door alike, and refused past the limit: never taken for empty."""

from __future__ import annotations

import httpx
import orjson
from django.conf import settings

from registry.models import Agent, Instance
from registry.tokens import agent_token_issue
from tenants.choices import ApiKeyScope
from tests import factories


def chunked(data: bytes, size: int = 7):
    """A body httpx sends chunked (it has no length to declare)."""
    for start in range(0, len(data), size):
        yield data[start:start + size]


def test_chunked_bodies_reach_the_api_whole_and_are_refused_past_the_limit(gateway):
    register = factories.api_key(tenant=gateway.tenant, scopes=[ApiKeyScope.REGISTER])
    descriptor = orjson.dumps({
        "agent_id": "chunky", "reach": {"protocol": "http",
                                        "endpoint": "http://127.0.0.1:9311/"},
        "capabilities": [{"id": "chunky.op", "description": "sent in chunks"}]})
    with httpx.Client(base_url=gateway.base, timeout=30) as client:
        registered = client.post("/api/v1/agents/register", content=chunked(descriptor),
                                 headers={"Authorization": f"Bearer {register.plaintext}",
                                          "Content-Type": "application/json"})
        instance = Instance.objects.get(agent__name="chunky")
        token = agent_token_issue(agent=Agent.objects.get(name="chunky"))
        beat = client.post(f"/api/v1/instances/{instance.pk}/heartbeat",
                           content=chunked(b'{"cpu": 0.99, "memory": 0.99, "queue_depth": 99}'),
                           headers={"Authorization": f"Bearer {token}",
                                    "Content-Type": "application/json"})
        garbage = client.post(f"/api/v1/instances/{instance.pk}/heartbeat",
                              content=chunked(b"garbage"),
                              headers={"Authorization": f"Bearer {token}",
                                       "Content-Type": "application/json"})
        huge = client.post("/api/v1/agents/register",
                           content=chunked(b"x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1),
                                           size=65536),
                           headers={"Authorization": f"Bearer {register.plaintext}",
                                    "Content-Type": "application/json"})

    assert registered.status_code == 201, registered.text
    assert beat.status_code == 200, beat.text
    assert beat.json()["health_tier"] == "overloaded"
    instance.refresh_from_db()
    assert (instance.cpu, instance.queue_depth) == (0.99, 99)
    assert garbage.status_code == 400 and garbage.json()["error"]["code"] == "malformed_json"
    assert huge.status_code == 413
    assert huge.json()["error"]["code"] == "payload_too_large"
