from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tenants.models import ApiKey
from tenants.services import api_key_authenticate


@pytest.mark.django_db
def test_creating_a_key_in_the_admin_shows_the_plaintext_once(world, client):
    client.force_login(world.owner)
    response = client.post(
        reverse("admin:tenants_apikey_add"),
        {"tenant": world.tenant_a.pk, "name": "ops", "scopes": ["invoke", "read"]},
    )
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    plaintext = re.search(r'id="reach-issued-key"[^>]*>(rk_[^<]+)<', response.content.decode())
    assert plaintext, response.content.decode()[:3000]
    key = api_key_authenticate(plaintext=plaintext.group(1))
    assert isinstance(key, ApiKey) and key.scopes == ["invoke", "read"]
    change = client.get(reverse("admin:tenants_apikey_change", args=[key.pk])).content.decode()
    listing = client.get(reverse("admin:tenants_apikey_changelist")).content.decode()
    assert plaintext.group(1) not in change and plaintext.group(1) not in listing


@pytest.mark.django_db
def test_staff_can_only_create_keys_for_their_own_tenants(world, client):
    client.force_login(world.owner)
    form = client.get(reverse("admin:tenants_apikey_add")).content.decode()
    assert "alpha" in form.lower() and ">beta<" not in form.lower()
    response = client.post(
        reverse("admin:tenants_apikey_add"),
        {"tenant": world.tenant_b.pk, "name": "sneak", "scopes": ["invoke"]},
    )
    assert response.status_code == 200  # the form comes back with an error
    assert not ApiKey.objects.filter(tenant=world.tenant_b).exists()


@pytest.mark.django_db
def test_revoke_action(world, client):
    from tests import factories

    issued = factories.api_key(tenant=world.tenant_a)
    client.force_login(world.owner)
    client.post(
        reverse("admin:tenants_apikey_changelist"),
        {"action": "revoke_keys", "_selected_action": [issued.api_key.pk]},
    )
    assert api_key_authenticate(plaintext=issued.plaintext) == "API key has been revoked."
