"""One isolation suite over every API resource and every admin model.

Tenant A owns one row of each kind; tenant B's staff and keys must not see,
change or delete any of them, and A's viewer may see but not change them.
"""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEntry
from metering.models import UsageDaily, UsageEvent
from registry.models import LearnedPhrase, RouteFeedback
from tenants.choices import ApiKeyScope
from tenants.models import Grant, Quota
from tests import factories
from tests.conftest import key_client


@pytest.fixture
def rows_of_a(world):
    cap = factories.capability(agent=world.agent_a)
    inst = factories.instance(agent=world.agent_a)
    issued = factories.api_key(tenant=world.tenant_a, scopes=[ApiKeyScope.INVOKE])
    event = UsageEvent.objects.create(
        request_id="req-a-1", tenant=world.tenant_a, agent=world.agent_a, outcome="success",
        occurred_at=timezone.now(),
    )
    daily = UsageDaily.objects.create(day=timezone.now().date(), tenant=world.tenant_a)
    audit = AuditEntry.objects.create(
        source="system", action="create", actor="system", tenant=world.tenant_a,
        object_type="x", object_id="1", object_repr="x",
    )
    learned = LearnedPhrase.objects.create(tenant=world.tenant_a, capability_id=cap.capability_id,
                                           phrase="numbers", phrase_hash="0" * 64)
    RouteFeedback.objects.create(event_id="e-a-1", tenant=world.tenant_a, intent="numbers",
                                 capability_id=cap.capability_id, source="explicit",
                                 created_at=timezone.now(), learned=learned)
    return {
        "tenants": world.tenant_a.slug,
        "agents": world.agent_a.pk,
        "capabilities": cap.pk,
        "instances": inst.pk,
        "api-keys": issued.api_key.pk,
        "credentials": factories.credential(
            tenant=world.tenant_a, agent=world.agent_a, secret="s3cret"
        ).pk,
        "quotas": Quota.objects.create(tenant=world.tenant_a, requests_per_minute=10).pk,
        # Granted to a third tenant: a grant to B would rightly let B see the agent.
        "grants": Grant.objects.create(tenant=factories.tenant(), agent=world.agent_a).pk,
        "usage/events": event.request_id,
        "usage/daily": daily.pk,
        "audit": audit.pk,
    }


RESOURCES = [
    "tenants", "agents", "capabilities", "instances", "api-keys", "credentials", "quotas",
    "usage/events", "usage/daily", "audit",
]


def _listed_ids(response) -> set[str]:
    body = response.json()
    items = body["results"] if isinstance(body, dict) else body
    return {str(item.get("slug") or item.get("request_id") or item.get("id")) for item in items}


def _owner_view(resource):
    from tenants.models import Tenant

    alpha = Tenant.objects.get(slug="alpha")
    return key_client(factories.api_key(tenant=alpha).plaintext).get(f"/api/v1/{resource}/")


@pytest.fixture(params=["key", "staff"])
def outsider_client(request, world, api):
    if request.param == "key":
        return key_client(factories.api_key(tenant=world.tenant_b).plaintext)
    api.force_login(world.outsider)
    return api


@pytest.mark.django_db
@pytest.mark.parametrize("resource", RESOURCES)
def test_outsider_cannot_list_read_change_or_delete(resource, rows_of_a, outsider_client):
    pk = rows_of_a[resource]
    listing = outsider_client.get(f"/api/v1/{resource}/")
    assert listing.status_code == 200
    assert str(pk) not in _listed_ids(listing)
    detail = f"/api/v1/{resource}/{pk}/"
    for method in ("get", "patch", "delete"):
        response = getattr(outsider_client, method)(detail, {}, format="json")
        assert response.status_code in (403, 404, 405), (method, detail, response.status_code)
        error = response.json()["error"]
        assert error["code"] in ("not_found", "forbidden", "method_not_allowed")
        assert "No such path" not in error["message"]
    assert str(pk) in _listed_ids(_owner_view(resource))


@pytest.mark.django_db
@pytest.mark.parametrize("resource", RESOURCES)
def test_owner_sees_the_rows(resource, rows_of_a, world, api):
    api.force_login(world.owner)
    listing = api.get(f"/api/v1/{resource}/")
    assert str(rows_of_a[resource]) in _listed_ids(listing)
    assert api.get(f"/api/v1/{resource}/{rows_of_a[resource]}/").status_code == 200


@pytest.mark.django_db
def test_the_grantee_sees_a_grant_and_may_give_it_up_but_not_change_the_agent(
        rows_of_a, world, api):
    grant_to_b = Grant.objects.create(tenant=world.tenant_b, agent=world.agent_a)
    api.force_login(world.outsider)
    assert api.get(f"/api/v1/grants/{grant_to_b.pk}/").status_code == 200
    # ...and, being granted, discovers the agent, but cannot change it.
    assert api.get(f"/api/v1/agents/{world.agent_a.pk}/").status_code == 200
    assert api.patch(f"/api/v1/agents/{world.agent_a.pk}/", {"team": "x"},
                     format="json").status_code == 403
    assert api.delete(f"/api/v1/grants/{grant_to_b.pk}/").status_code == 204
    other = Grant.objects.create(tenant=factories.tenant(), agent=world.agent_a)
    assert api.delete(f"/api/v1/grants/{other.pk}/").status_code == 404  # not beta's
    api.force_login(world.owner)
    assert api.delete(f"/api/v1/grants/{other.pk}/").status_code == 204


@pytest.mark.django_db
def test_outsider_cannot_create_rows_in_another_tenant(world, api):
    api.force_login(world.outsider)
    attempts = {
        "/api/v1/agents/": {"namespace": "default", "name": "sneaky", "owner_tenant": "alpha"},
        "/api/v1/capabilities/": {"agent": world.agent_a.pk, "capability_id": "sneak"},
        "/api/v1/instances/": {"agent": world.agent_a.pk, "endpoint": "http://127.0.0.1:1/"},
        "/api/v1/quotas/": {"tenant": "alpha", "requests_per_minute": 1},
        "/api/v1/credentials/": {"tenant": "alpha", "agent": world.agent_a.pk, "kind": "bearer",
                                 "secret": "x"},
        "/api/v1/grants/": {"tenant": "beta", "agent": world.agent_a.pk},
        "/api/v1/api-keys/": {"tenant": "alpha", "name": "sneak"},
    }
    for url, body in attempts.items():
        response = api.post(url, body, format="json")
        assert response.status_code in (400, 403), (url, response.status_code, response.content)
        assert "error" in response.json()
    assert not world.tenant_a.api_keys.exists()
    assert not Quota.objects.exists() and not Grant.objects.exists()
    assert world.agent_a.capabilities.count() == 0 and world.agent_a.instances.count() == 0


@pytest.mark.django_db
def test_viewer_reads_but_cannot_change(rows_of_a, world, api):
    api.force_login(world.member)
    assert api.get(f"/api/v1/agents/{world.agent_a.pk}/").status_code == 200
    response = api.patch(f"/api/v1/agents/{world.agent_a.pk}/", {"team": "x"}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


@pytest.mark.django_db
def test_admin_change_pages_of_another_tenant_are_forbidden(rows_of_a, world, client):
    client.force_login(world.outsider)
    checked = 0
    for model in admin.site._registry:
        if not hasattr(model, "tenant_path") or model is Grant:
            continue
        opts = model._meta
        for obj in model._default_manager.for_tenants([world.tenant_a.pk]):
            change = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
            assert client.get(change).status_code == 403, change
            assert client.post(change, {}).status_code == 403, change
            checked += 1
        changelist = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
        assert changelist.status_code == 200
        for obj in model._default_manager.for_tenants([world.tenant_a.pk]):
            url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
            assert url not in changelist.content.decode(), url
    assert checked >= 9


@pytest.mark.django_db
def test_admin_owner_edits_own_tenant_and_superuser_sees_all(rows_of_a, world, client):
    client.force_login(world.owner)
    url = reverse("admin:registry_agent_change", args=[world.agent_a.pk])
    assert client.get(url).status_code == 200
    other = reverse("admin:registry_agent_change", args=[world.agent_b.pk])
    assert client.get(other).status_code == 403
    client.force_login(world.superuser)
    listing = client.get(reverse("admin:registry_agent_changelist")).content.decode()
    assert world.agent_a.name in listing and world.agent_b.name in listing


@pytest.mark.django_db
def test_admin_viewer_cannot_save(rows_of_a, world, client):
    client.force_login(world.member)
    url = reverse("admin:tenants_quota_change", args=[rows_of_a["quotas"]])
    assert client.get(url).status_code == 200
    response = client.post(url, {"tenant": world.tenant_a.pk, "requests_per_minute": 99})
    assert response.status_code == 403
    assert Quota.objects.get(pk=rows_of_a["quotas"]).requests_per_minute == 10
