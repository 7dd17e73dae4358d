"""Bad input always gets a structured JSON error, never an HTML page or a bare string."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from tenants.api.views import TenantViewSet
from tenants.models import ApiKey
from tests import factories
from tests.conftest import key_client


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code
    assert error["message"]
    # The same catalogue as the gateway's: the code decides status and retryable.
    from reach_core.errors import CATALOGUE

    assert error["retryable"] is CATALOGUE[code].retryable
    assert CATALOGUE[code].status == status
    assert error["request_id"] == response["X-Request-ID"]
    return error


@pytest.fixture
def alpha(world):
    return key_client(factories.api_key(tenant=world.tenant_a).plaintext)


@pytest.mark.django_db
def test_malformed_json(alpha):
    response = alpha.post(
        "/api/v1/grants/", data=b'{"requests_per_minute": 10,', content_type="application/json"
    )
    error = assert_error(response, 400, "malformed_json")
    assert "not valid JSON" in error["message"]


@pytest.mark.django_db
def test_wrong_types_list_every_field_path(alpha, world):
    response = alpha.post(
        "/api/v1/capabilities/",
        {"agent": world.agent_a.pk, "capability_id": "Bad Id!", "timeout_ms": "soon",
         "keywords": "not-a-list", "input_schema": {"type": 12}},
        format="json",
    )
    error = assert_error(response, 400, "invalid_input")
    assert {"capability_id", "timeout_ms"} <= set(error["details"])
    assert "capability_id:" in error["message"]


@pytest.mark.django_db
def test_invalid_json_schema_is_refused_by_the_model_rules(alpha, world):
    response = alpha.post(
        "/api/v1/capabilities/",
        {"agent": world.agent_a.pk, "capability_id": "ok.id", "input_schema": {"type": 12}},
        format="json",
    )
    error = assert_error(response, 400, "invalid_input")
    assert "input_schema" in error["details"]


@pytest.mark.django_db
def test_unknown_tenant(alpha, world):
    response = alpha.post(
        "/api/v1/grants/", {"tenant": "no-such-tenant", "agent": world.agent_a.pk}, format="json"
    )
    error = assert_error(response, 400, "invalid_input")
    assert "tenant" in error["details"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("Bearer rk_AAAAAAAAAA_unknownsecret", "API key is not known."),
        ("Bearer not-a-key", "API key is malformed."),
        ("Basic dXNlcjpwdw==", "Expected 'Authorization: Bearer <api key>'."),
    ],
)
def test_bad_keys_are_unauthorized(api, db, header, message):
    api.credentials(HTTP_AUTHORIZATION=header)
    error = assert_error(api.get("/api/v1/agents/"), 401, "unauthorized")
    assert error["message"] == message


@pytest.mark.django_db
def test_expired_key(world):
    issued = factories.api_key(tenant=world.tenant_a)
    ApiKey.objects.filter(pk=issued.api_key.pk).update(
        expires_at=timezone.now() - dt.timedelta(minutes=1)
    )
    error = assert_error(key_client(issued.plaintext).get("/api/v1/agents/"), 401, "unauthorized")
    assert error["message"] == "API key has expired."


@pytest.mark.django_db
def test_no_credentials_at_all(api):
    assert_error(api.get("/api/v1/agents/"), 401, "unauthorized")


@pytest.mark.django_db
def test_unknown_path_is_json(alpha):
    assert_error(alpha.get("/api/v1/no-such-thing/"), 404, "not_found")
    assert_error(alpha.get("/nowhere"), 404, "not_found")


@pytest.mark.django_db
def test_huge_body(alpha):
    body = b'{"x": "' + b"a" * (3 * 1024 * 1024) + b'"}'
    response = alpha.post("/api/v1/grants/", data=body, content_type="application/json")
    assert_error(response, 413, "payload_too_large")


@pytest.mark.django_db
def test_wrong_content_type(alpha):
    response = alpha.post("/api/v1/grants/", data="a=b", content_type="text/plain")
    assert_error(response, 415, "unsupported_media_type")


@pytest.mark.django_db
def test_server_errors_are_json_and_keep_the_request_id(alpha, monkeypatch):
    def explode(self, request, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(TenantViewSet, "list", explode)
    alpha.raise_request_exception = False
    response = alpha.get("/api/v1/tenants/", HTTP_X_REQUEST_ID="trace-123")
    error = assert_error(response, 500, "internal_error")
    assert error["request_id"] == "trace-123"
    assert "boom" not in response.content.decode()


@pytest.mark.django_db
def test_request_id_is_echoed_or_generated(alpha):
    assert alpha.get("/api/v1/agents/", HTTP_X_REQUEST_ID="abc-1")["X-Request-ID"] == "abc-1"
    generated = alpha.get("/api/v1/agents/", HTTP_X_REQUEST_ID="bad id\nwith newline")
    assert len(generated["X-Request-ID"]) == 32


def test_a_reach_error_raised_in_a_view_keeps_its_catalogue_status_and_retry_after():
    from rest_framework.test import APIRequestFactory

    from reach_core.errors import ReachError
    from reach_platform.errors import api_exception_handler

    request = APIRequestFactory().get("/api/v1/anything")
    response = api_exception_handler(
        ReachError("rate_limited", "slow down", retry_after=7), {"request": request})
    assert response.status_code == 429 and response["Retry-After"] == "7"
    assert response.data["error"]["code"] == "rate_limited"
    assert response.data["error"]["retryable"] is True
