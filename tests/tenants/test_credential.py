from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.test import override_settings

from tenants import crypto
from tenants.models import Credential
from tests import factories
from tests.conftest import key_client

SECRET = "sk-live-7Hq2vN9xPz0aB4cD"  # a value that must never come back out


def test_encryption_round_trip_and_ciphertext_hides_the_value():
    ciphertext = crypto.encrypt(SECRET)
    assert SECRET.encode() not in ciphertext
    assert crypto.decrypt(ciphertext) == SECRET
    assert crypto.encrypt(SECRET) != ciphertext  # fresh IV every time


def test_a_rotated_key_list_still_decrypts_old_ciphertext():
    from django.conf import settings

    old_ciphertext = crypto.encrypt(SECRET)
    new_key = Fernet.generate_key().decode()
    with override_settings(CREDENTIAL_KEYS=[new_key, *settings.CREDENTIAL_KEYS]):
        assert crypto.decrypt(old_ciphertext) == SECRET
        fresh = crypto.encrypt(SECRET)
    with override_settings(CREDENTIAL_KEYS=[new_key]):
        assert crypto.decrypt(fresh) == SECRET
        with pytest.raises(crypto.CredentialDecryptError):
            crypto.decrypt(old_ciphertext)


@pytest.mark.django_db
def test_stored_credential_round_trips_and_the_row_holds_no_plaintext(world):
    cred = factories.credential(tenant=world.tenant_a, agent=world.agent_a, secret=SECRET)
    row = Credential.objects.filter(pk=cred.pk).values().get()
    assert all(SECRET not in str(v) for v in row.values())
    assert SECRET.encode() not in bytes(row["secret_ciphertext"])
    assert crypto.decrypt(Credential.objects.get(pk=cred.pk).secret_ciphertext) == SECRET


@pytest.mark.django_db
def test_value_env_credentials_store_the_variable_name_not_a_secret(world):
    # The gateway reads the variable when a call uses the credential.
    cred = factories.credential(
        tenant=world.tenant_a, agent=world.agent_a, secret=None,
        value_env="DOWNSTREAM_ALPHA__TRANSLATOR_TOKEN"
    )
    cred.refresh_from_db()
    assert (cred.value_env, cred.secret_ciphertext) == ("DOWNSTREAM_ALPHA__TRANSLATOR_TOKEN", None)


@pytest.mark.django_db
def test_api_creates_and_updates_credentials_without_echoing_the_secret(world):
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    created = client.post(
        "/api/v1/credentials/",
        {"agent": world.agent_a.pk, "kind": "bearer", "secret": SECRET},
        format="json",
    )
    assert created.status_code == 201, created.content
    assert SECRET not in created.content.decode()
    assert created.json()["has_secret"] is True
    assert created.json()["secret_source"] == "stored encrypted"
    cred = Credential.objects.get(pk=created.json()["id"])
    assert crypto.decrypt(cred.secret_ciphertext) == SECRET

    rotated = "sk-live-rotated-000111"
    patched = client.patch(
        f"/api/v1/credentials/{cred.pk}/", {"secret": rotated}, format="json"
    )
    assert patched.status_code == 200 and rotated not in patched.content.decode()
    cred.refresh_from_db()
    assert crypto.decrypt(cred.secret_ciphertext) == rotated


@pytest.mark.django_db
def test_header_credentials_cannot_target_gateway_owned_headers(world):
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    response = client.post(
        "/api/v1/credentials/",
        {"agent": world.agent_a.pk, "kind": "header", "field_name": "X-Reach-Tenant",
         "secret": SECRET},
        format="json",
    )
    assert response.status_code == 400
    assert "field_name" in response.json()["error"]["details"]
    assert not Credential.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["REACH_CREDENTIAL_KEYS", "REACH_SECRET_KEY", "DATABASE_URL",
                                  "OTEL_EXPORTER_OTLP_HEADERS",
                                  "REDIS_URL", "HOME", "AWS_SECRET_ACCESS_KEY"])
def test_a_credential_may_name_only_the_variables_lent_to_tenants(world, name):
    """value_env reads the gateway's environment, where the platform's own secrets are:
    only names under REACH_CREDENTIAL_ENV (default DOWNSTREAM_{tenant}__*) are accepted."""
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    refused = client.post("/api/v1/credentials/", {
        "agent": world.agent_a.pk, "kind": "header", "field_name": "X-Leak",
        "value_env": name}, format="json")
    assert refused.status_code == 400, refused.content
    assert "value_env" in refused.json()["error"]["details"]
    accepted = client.post("/api/v1/credentials/", {
        "agent": world.agent_a.pk, "kind": "header", "field_name": "X-Lent",
        "value_env": "DOWNSTREAM_ALPHA__TOKEN"}, format="json")
    assert accepted.status_code == 201, accepted.content
    with override_settings(CREDENTIAL_ENV=["TEAM_*", "*"]):
        # An operator's "*" still lends none of the platform's own settings.
        again = client.post("/api/v1/credentials/", {
            "agent": world.agent_a.pk, "kind": "header", "field_name": "X-Leak",
            "value_env": name}, format="json")
        assert (again.status_code == 201) == (name in ("HOME", "AWS_SECRET_ACCESS_KEY"))


@pytest.mark.django_db
def test_names_lent_per_tenant_are_that_tenants_alone(world):
    """``{tenant}`` in REACH_CREDENTIAL_ENV lends each tenant only its own names: a
    break test had tenant beta's agent sent a secret lent (to everybody) for alpha."""
    from reach_core.envrefs import refusal

    def create(tenant, name: str):
        agent = factories.agent(owner=tenant)
        client = key_client(factories.api_key(tenant=tenant).plaintext)
        return client.post("/api/v1/credentials/", {
            "agent": agent.pk, "kind": "header", "field_name": "X-Lent",
            "value_env": name}, format="json")

    alpha = world.tenant_a.slug.upper().replace("-", "_")
    # The default lends per tenant: no operator setting needed.
    assert create(world.tenant_a, f"DOWNSTREAM_{alpha}__TOKEN").status_code == 201
    stolen = create(world.tenant_b, f"DOWNSTREAM_{alpha}__TOKEN")
    assert stolen.status_code == 400, stolen.content
    # The refusal names what beta may use, filled in for beta.
    assert "DOWNSTREAM_BETA__*" in str(stolen.json()["error"]["details"]["value_env"])
    assert create(world.tenant_b, "DOWNSTREAM_SHARED").status_code == 400
    with override_settings(CREDENTIAL_ENV=["DOWNSTREAM_*"]):  # an operator shares them
        assert create(world.tenant_b, "DOWNSTREAM_SHARED").status_code == 201
    patterns = ["DOWNSTREAM_{tenant}__*", "SHARED_*"]
    assert refusal("DOWNSTREAM_CLOUD_SALES__TOKEN", patterns, "cloud-sales") is None
    assert refusal("DOWNSTREAM_CLOUD_SALES__TOKEN", patterns, "cloud") is not None
    assert refusal("DOWNSTREAM_CLOUD__TOKEN", patterns, "cloud-sales") is not None
    # A slug that would not name its tenant alone takes no part (a_b and a-b: A_B).
    assert refusal("DOWNSTREAM_A_B__TOKEN", patterns, "a_b") is not None
    assert refusal("SHARED_TOKEN", patterns, "a_b") is None  # plain patterns: everybody's


@pytest.mark.django_db
def test_a_credential_without_a_value_is_refused_when_created(world):
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    response = client.post("/api/v1/credentials/", {
        "agent": world.agent_a.pk, "kind": "header", "field_name": "X-K"}, format="json")
    assert response.status_code == 400, response.content
    assert "secret" in response.json()["error"]["details"]
    assert not Credential.objects.exists()


@pytest.mark.django_db
def test_a_tool_may_name_only_the_variables_lent_to_tenants(world):
    from tools.models import Tool

    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    tool = {"description": "d", "url_template": "http://127.0.0.1:9/x",
            "auth_kind": "header", "auth_field_name": "X-Key"}
    refused = client.post("/api/v1/tools/", {**tool, "name": "leaky",
                                             "value_env": "REACH_SECRET_KEY"}, format="json")
    assert refused.status_code == 400, refused.content
    assert "value_env" in refused.json()["error"]["details"]
    accepted = client.post("/api/v1/tools/", {
        **tool, "name": "lent", "value_env": "DOWNSTREAM_ALPHA__TOOL_KEY"}, format="json")
    assert accepted.status_code == 201, accepted.content
    assert list(Tool.objects.values_list("name", flat=True)) == ["lent"]


@pytest.mark.django_db
def test_a_tool_names_a_variable_not_a_pattern_and_has_a_secret(world):
    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    tool = {"description": "d", "url_template": "http://127.0.0.1:9/x",
            "auth_kind": "bearer"}
    for name, extra in (("glob", {"value_env": "DOWNSTREAM_*"}), ("empty", {})):
        refused = client.post("/api/v1/tools/", {**tool, "name": name, **extra},
                              format="json")
        assert refused.status_code == 400, refused.content
        assert {"value_env", "secret"} & set(refused.json()["error"]["details"])


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/etc/ssl/private/ssl-cert-snakeoil.key",
                                  "/etc/agent-reach/certs/alpha/../../shadow",
                                  "/etc/agent-reach/certs/alpha//a.pem", "certs/client.pem",
                                  "/etc/agent-reach/certs/alphaX/a.pem",
                                  "/etc/agent-reach/certs/beta/client.pem",
                                  "/etc/agent-reach/certs/client.pem"])
def test_certificate_files_are_named_only_inside_the_tenants_directory(world, path):
    """A tenant's mTLS files are the gateway host's files: only those under its own
    directory, REACH_CREDENTIAL_FILES with {tenant} its slug (default
    /etc/agent-reach/certs/{tenant}), may be named, by a credential or a tool, in every
    field (a break test had tenant beta name alpha's client key and present alpha's
    identity to alpha's mTLS service)."""
    from tools.models import Tool

    client = key_client(factories.api_key(tenant=world.tenant_a).plaintext)
    inside = "/etc/agent-reach/certs/alpha/client.pem"
    for field in ("client_cert_path", "client_key_path", "ca_file"):
        paths = {"client_cert_path": inside, "client_key_path": inside, field: path}
        refused = client.post("/api/v1/credentials/", {
            "agent": world.agent_a.pk, "kind": "mtls", **paths}, format="json")
        assert refused.status_code == 400, refused.content
        assert field in refused.json()["error"]["details"]
        tool = client.post("/api/v1/tools/", {
            "name": "mtls-tool", "description": "d", "url_template": "https://127.0.0.1:9/x",
            "auth_kind": "mtls", **paths}, format="json")
        assert tool.status_code == 400, tool.content
        assert field in tool.json()["error"]["details"]
    assert not Credential.objects.exists() and not Tool.objects.exists()
    accepted = client.post("/api/v1/credentials/", {
        "agent": world.agent_a.pk, "kind": "mtls", "client_cert_path": inside,
        "client_key_path": inside, "ca_file": "/etc/agent-reach/certs/alpha/ca.pem"},
        format="json")
    assert accepted.status_code == 201, accepted.content
    with override_settings(CREDENTIAL_FILES="/srv/certs"):
        moved = client.post("/api/v1/tools/", {
            "name": "mtls-tool", "description": "d", "url_template": "https://127.0.0.1:9/x",
            "auth_kind": "mtls", "client_cert_path": "/srv/certs/t.pem"}, format="json")
        assert moved.status_code == 201, moved.content


def test_a_model_check_failing_at_save_is_a_structured_400():
    """A unique slot taken by a concurrent request is seen only by the model's own check
    in the service (the serializer's ran before the other insert): 400, never a 500."""
    from django.core.exceptions import ValidationError

    from reach_platform.errors import api_exception_handler

    response = api_exception_handler(ValidationError(
        {"field_name": ["Credential with this slot already exists."]}), {})
    assert response.status_code == 400
    assert response.data["error"]["code"] == "invalid_input"
    assert response.data["error"]["details"] == {
        "field_name": ["Credential with this slot already exists."]}


@pytest.mark.django_db
def test_a_tenant_cannot_rename_itself_into_another_tenants_lent_names(world):
    """The slug names a tenant in the variables lent to it per tenant ({tenant}): fixed
    through the API (a break test renamed tenant beta to a freed slug and read that
    slug's lent secret)."""
    client = key_client(factories.api_key(tenant=world.tenant_b).plaintext)
    url = f"/api/v1/tenants/{world.tenant_b.slug}/"
    renamed = client.patch(url, {"slug": "alpha-x"}, format="json")
    assert renamed.status_code == 400, renamed.content
    assert "slug" in renamed.json()["error"]["details"]
    world.tenant_b.refresh_from_db()
    assert world.tenant_b.slug != "alpha-x"
    assert client.patch(url, {"name": "Beta GmbH"}, format="json").status_code == 200
    assert client.patch(url, {"slug": world.tenant_b.slug}, format="json").status_code == 200
