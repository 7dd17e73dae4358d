"""A stored credential's secret must not appear in any admin page or API response."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from audit.models import AuditEntry
from tenants.models import Credential
from tests import factories
from tests.conftest import key_client

SECRET = "sk-live-NEVER-SHOW-9f8e7d6c"


def _admin_pages(client) -> dict[str, str]:
    """Every changelist, and every change and history page of every object, by URL."""
    pages = {}
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        pages[changelist] = client.get(changelist)
        for obj in model_admin.get_queryset(_RequestFor(client)):
            for view in ("change", "history"):
                url = reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=[obj.pk])
                pages[url] = client.get(url)
    return pages


class _RequestFor:
    """Just enough of a request for ``get_queryset`` as the superuser."""

    def __init__(self, client) -> None:
        from django.contrib.auth import get_user_model

        self.user = get_user_model().objects.get(username="root")
        self.auth = None


@pytest.fixture
def stored(world, client):
    client.force_login(world.superuser)
    add = client.post(
        reverse("admin:tenants_credential_add"),
        {"tenant": world.tenant_a.pk, "agent": world.agent_a.pk, "kind": "header",
         "field_name": "X-Api-Token", "secret": SECRET, "value_env": "",
         "client_cert_path": "", "client_key_path": ""},
    )
    assert add.status_code == 302, add.content.decode()[:2000]
    credential = Credential.objects.get()
    assert credential.has_secret
    return credential


@pytest.mark.django_db
def test_no_admin_page_shows_the_secret_or_its_ciphertext(world, client, stored):
    ciphertext = bytes(stored.secret_ciphertext).decode()
    pages = _admin_pages(client)
    assert len(pages) > 20
    change_url = reverse("admin:tenants_credential_change", args=[stored.pk])
    assert change_url in pages and pages[change_url].status_code == 200
    for url, response in pages.items():
        assert response.status_code == 200, url
        body = response.content.decode()
        assert SECRET not in body, url
        assert ciphertext not in body, url


@pytest.mark.django_db
def test_no_api_response_shows_the_secret(world, stored):
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    urls = [
        "/api/v1/credentials/", f"/api/v1/credentials/{stored.pk}/", "/api/v1/audit/",
        "/api/v1/agents/", f"/api/v1/agents/{world.agent_a.pk}/", "/api/v1/tenants/",
        "/api/schema/",
    ]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        assert SECRET not in response.content.decode(), url
    detail = client.get(f"/api/v1/credentials/{stored.pk}/").json()
    assert "secret" not in detail and "secret_ciphertext" not in detail


@pytest.mark.django_db
def test_audit_and_admin_log_record_the_change_but_not_the_secret(world, stored):
    entry = AuditEntry.objects.get(object_type="tenants.Credential", action="create")
    assert entry.changes["secret"] == "[redacted]"
    assert entry.actor == "user:root" and entry.tenant_id == world.tenant_a.pk
    for row in AuditEntry.objects.values():
        assert SECRET not in str(row)
    for row in LogEntry.objects.values():
        assert SECRET not in str(row)


@pytest.mark.django_db
def test_editing_without_a_secret_keeps_the_stored_one(world, client, stored):
    before = bytes(stored.secret_ciphertext)
    response = client.post(
        reverse("admin:tenants_credential_change", args=[stored.pk]),
        {"tenant": world.tenant_a.pk, "agent": world.agent_a.pk, "kind": "header",
         "field_name": "X-Other-Token", "secret": "", "value_env": "",
         "client_cert_path": "", "client_key_path": ""},
    )
    assert response.status_code == 302
    stored.refresh_from_db()
    assert bytes(stored.secret_ciphertext) == before and stored.field_name == "X-Other-Token"
