"""Quotas are set by operators: tenants read theirs, only superusers write them."""

from __future__ import annotations

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from tenants.models import Quota
from tests import factories
from tests.conftest import key_client


@pytest.fixture
def quota(world):
    return Quota.objects.create(tenant=world.tenant_a, requests_per_minute=10)


@pytest.mark.django_db
def test_a_manage_key_reads_its_quotas_but_cannot_write_them(world, quota):
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    listed = client.get("/api/v1/quotas/")
    assert listed.status_code == 200 and listed.json()["count"] == 1
    assert client.get(f"/api/v1/quotas/{quota.pk}/").status_code == 200
    create = client.post("/api/v1/quotas/", {"tenant": "alpha", "requests_per_minute": 10**6},
                         format="json")
    assert create.status_code == 403 and create.json()["error"]["code"] == "forbidden"
    assert client.patch(f"/api/v1/quotas/{quota.pk}/", {"requests_per_minute": 10**6},
                        format="json").status_code == 403
    assert client.delete(f"/api/v1/quotas/{quota.pk}/").status_code == 403
    quota.refresh_from_db()
    assert quota.requests_per_minute == 10 and Quota.objects.count() == 1


@pytest.mark.django_db
def test_a_tenant_admin_reads_but_cannot_write_through_the_api(world, quota):
    api = APIClient()
    api.force_login(world.owner)
    assert api.get(f"/api/v1/quotas/{quota.pk}/").status_code == 200
    assert api.post("/api/v1/quotas/", {"tenant": "alpha", "burst": 1},
                    format="json").status_code == 403
    assert api.patch(f"/api/v1/quotas/{quota.pk}/", {"burst": 99},
                     format="json").status_code == 403
    assert api.delete(f"/api/v1/quotas/{quota.pk}/").status_code == 403
    assert Quota.objects.get().burst is None


@pytest.mark.django_db
def test_a_superuser_writes_quotas_through_the_api(world, quota):
    api = APIClient()
    api.force_login(world.superuser)
    created = api.post("/api/v1/quotas/", {"tenant": "alpha", "burst": 3}, format="json")
    assert created.status_code == 201, created.content
    assert api.patch(f"/api/v1/quotas/{quota.pk}/", {"burst": 7},
                     format="json").status_code == 200
    assert api.delete(f"/api/v1/quotas/{quota.pk}/").status_code == 204
    assert list(Quota.objects.values_list("burst", flat=True)) == [3]


@pytest.mark.django_db
def test_a_tenant_admin_sees_quotas_read_only_in_the_admin(world, quota, client):
    client.force_login(world.owner)
    assert client.get(reverse("admin:tenants_quota_changelist")).status_code == 200
    change_url = reverse("admin:tenants_quota_change", args=[quota.pk])
    page = client.get(change_url)
    assert page.status_code == 200  # the view page, without a save button
    assert b'name="_save"' not in page.content
    assert client.get(reverse("admin:tenants_quota_add")).status_code == 403
    posted = client.post(change_url, {"tenant": world.tenant_a.pk, "requests_per_minute": 999})
    assert posted.status_code == 403
    assert client.post(reverse("admin:tenants_quota_delete", args=[quota.pk]),
                       {"post": "yes"}).status_code == 403
    quota.refresh_from_db()
    assert quota.requests_per_minute == 10


@pytest.mark.django_db
def test_a_superuser_writes_quotas_in_the_admin(world, quota, client):
    client.force_login(world.superuser)
    assert client.get(reverse("admin:tenants_quota_add")).status_code == 200
    change_url = reverse("admin:tenants_quota_change", args=[quota.pk])
    assert b'name="_save"' in client.get(change_url).content
    response = client.post(reverse("admin:tenants_quota_delete", args=[quota.pk]),
                           {"post": "yes"})
    assert response.status_code == 302
    assert not Quota.objects.exists()
