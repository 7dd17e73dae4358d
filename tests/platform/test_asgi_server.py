"""The ASGI entry point under a real uvicorn: routing, health and readiness."""

from __future__ import annotations

import httpx
import pytest

from tests.support.servers import free_port, platform_env, running, uvicorn_args

UNREACHABLE_PG = "postgres://postgres@127.0.0.1:1/reach_nowhere"
UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"


def test_readyz_fails_when_the_database_is_unreachable(tmp_path):
    port = free_port()
    env = platform_env(tmp_path, DATABASE_URL=UNREACHABLE_PG)
    with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "log") as base:
        assert httpx.get(f"{base}/healthz").json() == {"status": "ok"}
        ready = httpx.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 503
        body = ready.json()
        assert body["status"] == "not_ready"
        assert body["checks"]["database"]["ok"] is False
        assert "OperationalError" in body["checks"]["database"]["error"]
        assert "postgres://" not in ready.text


def test_readyz_fails_when_redis_is_configured_but_unreachable(tmp_path):
    port = free_port()
    env = platform_env(tmp_path, REDIS_URL=UNREACHABLE_REDIS)
    with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "log") as base:
        ready = httpx.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 503
        assert ready.json()["checks"]["redis"]["ok"] is False
        assert ready.json()["checks"]["database"]["ok"] is True


def test_readyz_passes_on_the_configured_services(tmp_path, django_db_setup):
    """Under CI this is the machine's PostgreSQL (the test database) and Redis."""
    import os

    from django.conf import settings

    overrides = {}
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("postgresql"):
        overrides["DATABASE_URL"] = (
            f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        )
    if os.environ.get("REDIS_URL"):
        overrides["REDIS_URL"] = os.environ["REDIS_URL"]
    port = free_port()
    env = platform_env(tmp_path, **overrides)
    with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "log") as base:
        ready = httpx.get(f"{base}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        expected = {"database", "redis"} if "REDIS_URL" in overrides else {"database"}
        assert set(ready.json()["checks"]) == expected


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("asgi")
    port = free_port()
    with running(uvicorn_args(port), env=platform_env(tmp), port=port, log=tmp / "log") as base:
        yield base


def test_v1_goes_to_the_gateway_with_a_structured_error(server):
    response = httpx.post(f"{server}/v1/nothing-here", headers={"X-Request-ID": "r-1"})
    assert response.status_code == 404
    assert response.headers["x-request-id"] == "r-1"
    error = response.json()["error"]
    assert error == {
        "code": "not_found", "message": "No gateway route for POST /v1/nothing-here",
        "request_id": "r-1", "retryable": False,
    }


def test_everything_else_goes_to_django(server):
    login = httpx.get(f"{server}/admin/login/")
    assert login.status_code == 200 and "Agent-Reach" in login.text
    assert httpx.get(f"{server}/api/docs/").status_code == 200
    missing = httpx.get(f"{server}/not-a-page")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
