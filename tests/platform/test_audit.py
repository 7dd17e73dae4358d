from __future__ import annotations

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from audit.models import AuditEntry
from tests import factories


@pytest.mark.django_db
def test_api_writes_are_audited_with_actor_fields_and_request_id(world):
    # Quotas are an operator's to write: the superuser, through the API.
    client = APIClient()
    client.force_login(world.superuser)
    created = client.post(
        "/api/v1/quotas/", {"tenant": "alpha", "requests_per_minute": 60}, format="json",
        HTTP_X_REQUEST_ID="aud-1",
    )
    assert created.status_code == 201
    client.patch(f"/api/v1/quotas/{created.json()['id']}/", {"burst": 5}, format="json")
    client.delete(f"/api/v1/quotas/{created.json()['id']}/")
    entries = list(AuditEntry.objects.order_by("at", "id").values(
        "action", "actor", "source", "changes", "request_id", "tenant_id", "object_id"
    ))
    assert [e["action"] for e in entries] == ["create", "update", "delete"]
    assert {e["actor"] for e in entries} == {"user:root"}
    assert entries[0]["request_id"] == "aud-1"
    assert entries[0]["changes"]["requests_per_minute"] == 60
    assert entries[1]["changes"] == {"burst": 5}
    assert {e["tenant_id"] for e in entries} == {world.tenant_a.pk}
    assert entries[2]["object_id"] == str(created.json()["id"])


@pytest.mark.django_db
def test_admin_actions_are_audited(world, client):
    inst = factories.instance(agent=world.agent_a)
    client.force_login(world.owner)
    response = client.post(
        reverse("admin:registry_instance_changelist"),
        {"action": "drain", "_selected_action": [inst.pk]},
    )
    assert response.status_code == 302
    inst.refresh_from_db()
    assert inst.state == "draining"
    entry = AuditEntry.objects.get(object_type="registry.Instance")
    assert entry.actor == "user:owner" and entry.source == "admin" and entry.action == "action"


@pytest.mark.django_db
def test_an_outsider_cannot_drain_through_a_crafted_admin_action(world, client):
    inst = factories.instance(agent=world.agent_a)
    client.force_login(world.outsider)
    client.post(
        reverse("admin:registry_instance_changelist"),
        {"action": "drain", "_selected_action": [inst.pk]},
    )
    inst.refresh_from_db()
    assert inst.state == "healthy"
    assert not AuditEntry.objects.exists()
