"""Degrade, don't fail: with the database away the platform answers 503
``service_unavailable`` with ``Retry-After`` quickly, never a 500 or a traceback."""

from __future__ import annotations

import re
import sys
import time

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import utils as db_utils
from django.test import RequestFactory

from reach_platform import errors
from registry.tokens import agent_token_issue
from tests import factories
from tests.support.forwarder import Forwarder
from tests.support.servers import free_port, platform_env, running, uvicorn_args
from tests.support.waiting import wait_for

_POSTGRES = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


def _database_url() -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def test_database_errors_of_the_connection_kind_are_recognised():
    from psycopg_pool import PoolTimeout

    assert errors.is_database_unavailable(db_utils.OperationalError("connection refused"))
    assert errors.is_database_unavailable(db_utils.InterfaceError("connection already closed"))
    assert errors.is_database_unavailable(PoolTimeout("couldn't get a connection"))
    try:
        try:
            raise PoolTimeout("pool")
        except PoolTimeout as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert errors.is_database_unavailable(wrapped)
    assert not errors.is_database_unavailable(db_utils.IntegrityError("duplicate key"))
    assert not errors.is_database_unavailable(ValueError("nope"))


def test_the_reply_is_json_for_the_api_and_a_page_for_the_admin():
    rf = RequestFactory()
    api = errors.database_unavailable_response(rf.get("/api/v1/tenants/"),
                                               db_utils.OperationalError("x"))
    assert api.status_code == 503
    assert api["Retry-After"] == str(settings.DB_UNAVAILABLE_RETRY_AFTER)
    import json

    body = json.loads(api.content)["error"]
    assert body["code"] == "service_unavailable" and body["retryable"] is True
    page = errors.database_unavailable_response(rf.get("/admin/login/"),
                                                db_utils.OperationalError("x"))
    assert page.status_code == 503 and page["Content-Type"].startswith("text/html")
    assert b"Traceback" not in page.content and b"Service unavailable" in page.content


def test_pool_wait_timeout_is_short_and_configurable():
    import importlib
    import os
    from unittest import mock

    import reach_platform.settings as platform_settings

    url = {"DATABASE_URL": "postgres://u@127.0.0.1:1/x"}
    try:
        with mock.patch.dict(os.environ, url):
            fresh = importlib.reload(platform_settings)
            assert fresh.DATABASES["default"]["OPTIONS"]["pool"]["timeout"] == 1.0
        with mock.patch.dict(os.environ, {**url, "REACH_DB_POOL_TIMEOUT": "0.5"}):
            fresh = importlib.reload(platform_settings)
            assert fresh.DATABASES["default"]["OPTIONS"]["pool"]["timeout"] == 0.5
    finally:
        importlib.reload(platform_settings)


@pytest.mark.skipif(not _POSTGRES, reason="needs PostgreSQL over TCP to cut")
def test_postgresql_away_gives_503_with_retry_after_fast_then_recovers(
    transactional_db, tmp_path
):
    factories.seed_defaults()
    tenant = factories.tenant()
    key = factories.api_key(tenant=tenant).plaintext
    agent = factories.agent(owner=tenant)
    instance = factories.instance(agent=agent)
    token = agent_token_issue(agent=agent)
    # The server hashes with Django's defaults, not the tests' MD5: store what it reads.
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    ops = get_user_model().objects.create_superuser("ops", "ops@localhost", password=None)
    ops.password = PBKDF2PasswordHasher().encode("ops-password", "saltsalt", iterations=1000)
    ops.save(update_fields=["password"])
    with Forwarder.for_url(_database_url()) as postgres:
        env = platform_env(tmp_path, DATABASE_URL=postgres.url(_database_url()),
                           REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS))
        port = free_port()
        with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "log") as base:
            api = httpx.Client(base_url=base, timeout=10,
                               headers={"Authorization": f"Bearer {key}"})
            agent_client = httpx.Client(base_url=base, timeout=10,
                                        headers={"Authorization": f"Bearer {token}"})
            heartbeat = f"/api/v1/instances/{instance.pk}/heartbeat"
            # The login page itself needs no database; logging in and a session do.
            login_page = httpx.get(f"{base}/admin/login/", timeout=10)
            csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text)[1]
            cookies = {"csrftoken": login_page.cookies["csrftoken"]}
            login_form = {"csrfmiddlewaretoken": csrf, "username": "ops",
                          "password": "ops-password", "next": "/admin/"}
            staff = httpx.Client(base_url=base, timeout=10, cookies=cookies)
            assert staff.post("/admin/login/", data=login_form).status_code == 302

            def calls():
                return {
                    "api": lambda: api.get("/api/v1/tenants/"),
                    "heartbeat": lambda: agent_client.post(heartbeat, json={"cpu": 0.1}),
                    "admin": lambda: staff.get("/admin/"),
                    "admin login": lambda: httpx.post(f"{base}/admin/login/", data=login_form,
                                                      cookies=cookies, timeout=10),
                }

            def ok(name, response):
                return response.status_code == (302 if name == "admin login" else 200)

            for name, call in calls().items():
                assert ok(name, call()), name
            assert postgres.accepted, "the server does not reach PostgreSQL via the forwarder"

            with postgres.outage():
                for _ in range(2):  # the first call finds dead connections, later ones none
                    for name, call in calls().items():
                        started = time.monotonic()
                        response = call()
                        elapsed = time.monotonic() - started
                        assert response.status_code == 503, (name, response.text)
                        assert response.headers["Retry-After"].isdigit(), name
                        assert elapsed < 2.5, (name, elapsed)
                        if name.startswith("admin"):
                            assert "text/html" in response.headers["Content-Type"]
                            assert "Traceback" not in response.text
                        else:
                            error = response.json()["error"]
                            assert error["code"] == "service_unavailable"
                            assert error["retryable"] is True
                            assert "postgres://" not in response.text

            def all_ok():
                return all(ok(name, call()) for name, call in calls().items())

            wait_for(all_ok, timeout=30, interval=0.2, message="200 again after the outage")
            for client in (api, agent_client, staff):
                client.close()


def test_readyz_503_carries_retry_after(db, settings):
    """Every 503 of /readyz says when to ask again, whichever check failed."""
    from reach_platform import health

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    response = health.readyz(RequestFactory().get("/readyz"))
    assert response.status_code == 503
    assert response["Retry-After"] == str(settings.DB_UNAVAILABLE_RETRY_AFTER)
    settings.REDIS_URL = None
    assert not health.readyz(RequestFactory().get("/readyz")).has_header("Retry-After")


# How long the database stays away in the recovery test. Long enough that psycopg_pool's
# reconnect backoff (1 s, doubling) has grown past the recovery bound.
OUTAGE_S = 8.0
RECOVERY_BOUND_S = 5.0


@pytest.mark.skipif(not _POSTGRES, reason="needs PostgreSQL over TCP to cut")
def test_the_api_recovers_within_seconds_once_postgresql_is_back(transactional_db, tmp_path):
    tenant = factories.tenant()
    key = factories.api_key(tenant=tenant).plaintext
    with Forwarder.for_url(_database_url()) as postgres:
        env = platform_env(tmp_path, DATABASE_URL=postgres.url(_database_url()),
                           REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS))
        port = free_port()
        with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "log") as base, \
                httpx.Client(base_url=base, timeout=10,
                             headers={"Authorization": f"Bearer {key}"}) as api:
            assert api.get("/api/v1/tenants/").status_code == 200
            assert postgres.accepted, "the server does not reach PostgreSQL via the forwarder"
            with postgres.outage():
                cut_at = time.monotonic()
                # Keep asking for the whole outage, as clients do: every answer a quick 503.
                while time.monotonic() - cut_at < OUTAGE_S:
                    response = api.get("/api/v1/tenants/")
                    assert response.status_code == 503, response.text
                    assert response.headers["Retry-After"].isdigit()
                ready = api.get("/readyz")
                assert ready.status_code == 503
                assert ready.headers["Retry-After"].isdigit()
            restored_at = time.monotonic()
            statuses: list[int] = []

            def recovered() -> bool:
                statuses.append(api.get("/api/v1/tenants/").status_code)
                return statuses[-1] == 200

            wait_for(recovered, timeout=60, interval=0.05, message="200 after the outage")
            recovery_s = time.monotonic() - restored_at
            assert set(statuses) <= {200, 503}, statuses
            print(f"\nrecovered {recovery_s:.2f}s after PostgreSQL returned "
                  f"({len(statuses)} requests)", file=sys.stderr)
            assert recovery_s < RECOVERY_BOUND_S, (recovery_s, statuses)
            assert api.get("/readyz").status_code == 200
