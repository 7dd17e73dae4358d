"""A credential's ``value_env`` reads only the variables the operator lends to tenants
(``REACH_CREDENTIAL_ENV``), never the platform's own: else a tenant could have the
gateway send ``REACH_CREDENTIAL_KEYS`` or ``DATABASE_URL`` to the tenant's own agent."""

from __future__ import annotations

import os

import pytest

from tests.support.waiting import wait_for

LENT = "lent-token-5b1f"


def _invoke(gateway):
    with gateway.client() as client:
        return client.post("/v1/invoke", json={"capability": "echo.all", "input": {"x": 1}})


@pytest.mark.gateway_tenant(slug="e2e")
@pytest.mark.gateway_env(DOWNSTREAM_E2E__TOKEN=LENT)
def test_a_credential_reads_a_lent_variable_and_never_the_platforms_own(gateway):
    """By default a tenant is lent the names DOWNSTREAM_<ITS SLUG>__*."""
    from registry.models import Agent
    from tenants.models import Credential

    agent = Agent.objects.get(name="scripted")
    row = Credential.objects.create(tenant=gateway.tenant, agent=agent, kind="header",
                                    field_name="X-Lent", value_env="DOWNSTREAM_E2E__TOKEN")

    def lent_header():
        response = _invoke(gateway)
        headers = {k.lower(): v for k, v in response.json()["output"]["headers"].items()}
        return headers.get("x-lent")

    assert wait_for(lent_header, timeout=15) == LENT

    # A row that names the platform's secret (saved past the API's check, as by an
    # older version): the gateway refuses to read it, and the agent is not called.
    row.value_env = "REACH_SECRET_KEY"
    row.save()
    wait_for(lambda: _invoke(gateway).status_code != 200, timeout=15)
    calls_before = len(gateway.seen())
    response = _invoke(gateway)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error["code"] == "service_unavailable"
    assert "platform's own settings" in error["message"]
    assert len(gateway.seen()) == calls_before  # refused before the agent was asked


def _table_with(entry):
    import types

    from routing.table import RouteTable, TenantEntry

    return RouteTable(version=1, credentials={entry.pk: entry}, tenants=types.MappingProxyType(
        {entry.tenant_pk: TenantEntry(pk=entry.tenant_pk, slug="acme")})).indexed()


def test_an_empty_lent_variable_is_no_value(monkeypatch):
    """Set but empty is unset: no bare ``Authorization: Bearer`` sent to the agent."""
    from gateway.credentials import Credentials
    from reach_core.errors import ReachError
    from routing.table import CredentialEntry

    monkeypatch.setenv("DOWNSTREAM_ACME__EMPTY", "")
    entry = CredentialEntry(pk=1, tenant_pk=1, agent_pk=2, kind="bearer",
                            value_env="DOWNSTREAM_ACME__EMPTY")
    headers: dict[str, str] = {}
    with pytest.raises(ReachError) as refused:
        Credentials(()).apply(_table_with(entry), 1, 2, headers, {})
    assert refused.value.code == "service_unavailable"
    assert headers == {}


def test_client_certificates_that_cannot_be_loaded_are_a_503_naming_no_path(tmp_path):
    from gateway.credentials import Credentials
    from reach_core.errors import ReachError

    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate")
    for cert, key in ((str(not_pem), str(not_pem)), (str(tmp_path / "missing.pem"), "")):
        with pytest.raises(ReachError) as refused:
            Credentials((), files=str(tmp_path)).client_ssl(cert, key, "", "", "acme")
        assert refused.value.code == "service_unavailable"
        assert str(tmp_path) not in refused.value.message


def _self_signed(directory):
    """A certificate and its key, as PEM files in ``directory``."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "team-a")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "client.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "client.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return str(directory / "client.crt"), str(directory / "client.key")


def test_a_tenants_certificate_files_are_its_own_in_the_gateway(tmp_path):
    """With {tenant} in the directory (the default), a credential of globex naming
    acme's client certificate and key, in a row written past the API's check, is
    refused by the gateway: the key would be presented as acme's identity."""
    import ssl

    from gateway.credentials import Credentials
    from reach_core.errors import ReachError

    cert, key = _self_signed(tmp_path / "acme")
    credentials = Credentials((), files=str(tmp_path / "{tenant}"))
    assert isinstance(credentials.client_ssl(cert, key, "", "", "acme"), ssl.SSLContext)
    for owner in ("globex", "", "Acme", "acme/.."):
        with pytest.raises(ReachError) as refused:
            credentials.client_ssl(cert, key, "", "", owner)
        assert refused.value.code == "service_unavailable"
        assert str(tmp_path) not in refused.value.message


def test_the_gateway_reads_certificate_files_only_inside_its_directory(tmp_path):
    """Whatever the table holds (a row written past the API's check), the gateway loads
    a tenant's mTLS files only from its certificate directory, links resolved: else a
    tenant could have it present another service's certificate and key of this host."""
    import ssl

    from gateway.credentials import Credentials
    from reach_core.errors import ReachError

    certs = tmp_path / "certs"
    cert, key = _self_signed(certs)
    outside_cert, outside_key = _self_signed(tmp_path / "host-service")
    (certs / "escape.key").symlink_to(outside_key)
    credentials = Credentials((), files=str(certs))

    assert isinstance(credentials.client_ssl(cert, key, "", cert, "acme"), ssl.SSLContext)
    for paths in ((outside_cert, outside_key, ""), (cert, str(certs / "escape.key"), ""),
                  (cert, str(certs / ".." / "host-service" / "client.key"), ""),
                  (cert, key, outside_cert)):
        with pytest.raises(ReachError) as refused:
            credentials.client_ssl(*paths[:2], "", paths[2], "acme")
        assert refused.value.code == "service_unavailable"
        assert str(tmp_path) not in refused.value.message
    with pytest.raises(ReachError):  # an operator who lends no directory lends no file
        Credentials((), files="").client_ssl(cert, key, "", "", "acme")
    # A FIFO inside the directory would block the load, and every call waiting on it.
    os.mkfifo(certs / "blocking.key")
    with pytest.raises(ReachError) as blocked:
        credentials.client_ssl(cert, str(certs / "blocking.key"), "", "", "acme")
    assert "not a regular file" in blocked.value.message


@pytest.mark.gateway_env(REACH_CREDENTIAL_ENV="DOWNSTREAM_{tenant}__*",
                         DOWNSTREAM_OTHERCO__TOKEN="otherco-secret-77")
def test_a_gateway_reads_a_tenants_own_names_only(gateway):
    """With names lent per tenant, a row naming another tenant's variable (saved past the
    API's check) is refused by the gateway itself: 503, the agent not called, the secret
    nowhere (a break test had another tenant's secret sent to its own agent)."""
    from registry.models import Agent
    from tenants.models import Credential

    agent = Agent.objects.get(name="scripted")
    calls_before = len(gateway.seen())
    # save() without full_clean(): past the API's check, as by an older version.
    Credential(tenant=gateway.tenant, agent=agent, kind="header", field_name="X-Stolen",
               value_env="DOWNSTREAM_OTHERCO__TOKEN").save()
    wait_for(lambda: _invoke(gateway).status_code != 200, timeout=15)
    response = _invoke(gateway)
    assert response.status_code == 503, response.text
    assert "otherco-secret-77" not in response.text
    assert all("otherco-secret-77" not in str(seen) for seen in gateway.seen())
    assert len(gateway.seen()) == calls_before


def test_names_lent_per_tenant_reach_their_tenant_in_the_gateway(monkeypatch):
    import types

    from gateway.credentials import Credentials
    from reach_core.errors import ReachError
    from routing.table import CredentialEntry, RouteTable, TenantEntry

    monkeypatch.setenv("DOWNSTREAM_ACME__TOKEN", "acme-secret")
    credentials = Credentials((), env_patterns=("DOWNSTREAM_{tenant}__*",))
    table = RouteTable(version=1, tenants=types.MappingProxyType({
        1: TenantEntry(pk=1, slug="acme"), 2: TenantEntry(pk=2, slug="globex")}),
        credentials={n: CredentialEntry(pk=n, tenant_pk=n, agent_pk=9, kind="header",
                                        field_name="X-K", value_env="DOWNSTREAM_ACME__TOKEN")
                     for n in (1, 2)}).indexed()
    headers: dict[str, str] = {}
    credentials.apply(table, 1, 9, headers, {})
    assert headers == {"x-k": "acme-secret"}
    with pytest.raises(ReachError) as refused:
        credentials.apply(table, 2, 9, {}, {})
    assert refused.value.code == "service_unavailable"
