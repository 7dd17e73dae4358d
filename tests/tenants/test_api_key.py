from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from reach_core import keys
from tenants.models import ApiKey
from tenants.services import api_key_authenticate, api_key_revoke
from tests import factories
from tests.conftest import key_client


def test_key_parts_are_random_and_hash_is_sha256_of_the_whole_key():
    plaintext, prefix, key_hash = keys.generate()
    other, other_prefix, _ = keys.generate()
    assert plaintext != other and prefix != other_prefix
    assert plaintext.startswith(f"rk_{prefix}_")
    assert len(key_hash) == 64 and key_hash == keys.hash_key(plaintext)
    assert keys.matches(plaintext, key_hash)
    assert not keys.matches(plaintext + "x", key_hash)


@pytest.mark.parametrize(
    "bad", ["", "rk_", "rk_short_x", "sk_abcdefghij_x", "rk_abcdefghij_", "x" * 300]
)
def test_prefix_of_refuses_malformed_keys(bad):
    assert keys.prefix_of(bad) is None


@pytest.mark.django_db
def test_no_plaintext_is_stored_anywhere_in_the_row():
    issued = factories.api_key(tenant=factories.tenant())
    row = ApiKey.objects.filter(pk=issued.api_key.pk).values().get()
    secret_part = issued.plaintext.split("_", 2)[2]
    for value in row.values():
        assert issued.plaintext not in str(value)
        assert secret_part not in str(value)
    assert row["key_hash"] == keys.hash_key(issued.plaintext)


@pytest.mark.django_db
def test_authenticate_accepts_the_key_and_records_last_use():
    issued = factories.api_key(tenant=factories.tenant())
    result = api_key_authenticate(plaintext=issued.plaintext)
    assert isinstance(result, ApiKey) and result.pk == issued.api_key.pk
    assert ApiKey.objects.get(pk=result.pk).last_used_at is not None


@pytest.mark.django_db
def test_last_use_is_written_at_most_once_per_resolution_window():
    issued = factories.api_key(tenant=factories.tenant())
    now = timezone.now()
    api_key_authenticate(plaintext=issued.plaintext, now=now)
    api_key_authenticate(plaintext=issued.plaintext, now=now + dt.timedelta(seconds=10))
    assert ApiKey.objects.get(pk=issued.api_key.pk).last_used_at == now
    later = now + dt.timedelta(minutes=5)
    api_key_authenticate(plaintext=issued.plaintext, now=later)
    assert ApiKey.objects.get(pk=issued.api_key.pk).last_used_at == later


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda k: api_key_revoke(api_key=k), "revoked"),
        (lambda k: ApiKey.objects.filter(pk=k.pk).update(
            expires_at=timezone.now() - dt.timedelta(seconds=1)), "expired"),
        (lambda k: type(k.tenant).objects.filter(pk=k.tenant_id).update(is_active=False),
         "disabled"),
    ],
)
def test_refused_keys_say_why(mutate, reason):
    issued = factories.api_key(tenant=factories.tenant())
    mutate(issued.api_key)
    result = api_key_authenticate(plaintext=issued.plaintext)
    assert isinstance(result, str) and reason in result


@pytest.mark.django_db
def test_a_key_with_the_right_prefix_but_wrong_secret_is_unknown():
    issued = factories.api_key(tenant=factories.tenant())
    forged = issued.plaintext[:-4] + "AAAA"
    assert api_key_authenticate(plaintext=forged) == "API key is not known."


@pytest.mark.django_db
def test_creating_a_key_through_the_api_shows_the_plaintext_once(world):
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    created = client.post("/api/v1/api-keys/", {"name": "ci", "scopes": ["invoke"]}, format="json")
    assert created.status_code == 201, created.content
    plaintext = created.json()["key"]
    assert plaintext.startswith("rk_") and created.json()["tenant"] == "alpha"
    listed = client.get("/api/v1/api-keys/").content.decode()
    fetched = client.get(f"/api/v1/api-keys/{created.json()['id']}/").content.decode()
    assert plaintext not in listed and plaintext not in fetched
    assert isinstance(api_key_authenticate(plaintext=plaintext), ApiKey)


@pytest.mark.django_db
def test_revoking_through_the_api_locks_the_key_out(world):
    admin_client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    victim = factories.api_key(tenant=world.tenant_a)
    response = admin_client.post(f"/api/v1/api-keys/{victim.api_key.pk}/revoke/")
    assert response.status_code == 200 and response.json()["status"] == "revoked"
    locked = key_client(victim.plaintext).get("/api/v1/tenants/")
    assert locked.status_code == 401
    assert locked.json()["error"]["message"] == "API key has been revoked."


@pytest.mark.django_db
def test_an_invoke_only_key_cannot_read_the_control_plane(world):
    client = key_client(factories.api_key(tenant=world.tenant_a, scopes=["invoke"]).plaintext)
    response = client.get("/api/v1/agents/")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


@pytest.mark.django_db
def test_a_read_key_cannot_write(world):
    client = key_client(factories.api_key(tenant=world.tenant_a, scopes=["read"]).plaintext)
    assert client.get("/api/v1/agents/").status_code == 200
    response = client.post("/api/v1/api-keys/", {"name": "x"}, format="json")
    assert response.status_code == 403
