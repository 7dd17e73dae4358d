"""Failed authentication is throttled per client address (reach_platform.auth_throttle)."""

from __future__ import annotations

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from reach_platform import auth_throttle
from tests import factories
from tests.platform.test_errors import assert_error


def _client(header: str, address: str) -> APIClient:
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=header)
    return client


@pytest.fixture
def good_key(world) -> str:
    return factories.api_key(tenant=world.tenant_a).plaintext


@pytest.mark.django_db
def test_after_the_limit_even_a_correct_key_gets_429_for_the_window(good_key, monkeypatch):
    now = [1_000_000.0 * settings.AUTH_FAILURE_WINDOW_S + 5]
    monkeypatch.setattr(auth_throttle, "clock", lambda: now[0])
    guesser = _client("Bearer rk_AAAAAAAAAA_guess", "10.9.8.7")
    for _ in range(settings.AUTH_FAILURE_LIMIT):
        assert_error(guesser.get("/api/v1/agents/"), 401, "unauthorized")
    throttled = guesser.get("/api/v1/agents/")
    error = assert_error(throttled, 429, "too_many_requests")
    assert error["retryable"] is True
    assert throttled["Retry-After"] == str(settings.AUTH_FAILURE_WINDOW_S - 5)
    right_key = _client(f"Bearer {good_key}", "10.9.8.7")
    assert_error(right_key.get("/api/v1/agents/"), 429, "too_many_requests")
    # Another address is not affected.
    assert _client(f"Bearer {good_key}", "10.9.8.8").get("/api/v1/agents/").status_code == 200
    # The next window starts afresh.
    now[0] += settings.AUTH_FAILURE_WINDOW_S
    assert right_key.get("/api/v1/agents/").status_code == 200


@pytest.mark.django_db
def test_successes_and_missing_credentials_do_not_count(good_key):
    client = _client(f"Bearer {good_key}", "10.9.8.6")
    for _ in range(settings.AUTH_FAILURE_LIMIT + 5):
        assert client.get("/api/v1/agents/").status_code == 200
    anonymous = APIClient(REMOTE_ADDR="10.9.8.6")
    for _ in range(settings.AUTH_FAILURE_LIMIT + 5):
        assert anonymous.get("/api/v1/agents/").status_code == 401
    assert client.get("/api/v1/agents/").status_code == 200


@pytest.mark.django_db
def test_counts_are_shared_through_redis(good_key, monkeypatch):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL")
    guesser = _client("Bearer not-a-key", "10.9.8.5")
    for _ in range(settings.AUTH_FAILURE_LIMIT):
        guesser.get("/api/v1/agents/")
    # Another process: nothing counted locally, the count is in Redis.
    auth_throttle._local.clear()
    assert auth_throttle.retry_after("10.9.8.5") is not None
    client = auth_throttle._redis()
    keys = list(client.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}authfail:*"))
    assert keys and all(k.decode().startswith(settings.REDIS_KEY_PREFIX) for k in keys)
    assert_error(_client(f"Bearer {good_key}", "10.9.8.5").get("/api/v1/agents/"),
                 429, "too_many_requests")
