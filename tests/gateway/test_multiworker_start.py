"""Start-up of a multi-worker server: each worker loads its table from the database.

uvicorn imports the application inside each worker's running event loop, where the
ORM refuses to run; a first load attempted there fails and the worker would fall
back to ``routes.json``. Here that file is a foreign one, left by a run on another
database, naming an agent this database never had: no worker may ever serve it.
"""

from __future__ import annotations

import orjson
import pytest
from django.conf import settings

from registry.services import agent_register
from routing.table import table_to_json
from tenants.choices import ApiKeyScope
from tests import factories
from tests.gateway.conftest import database_url, scripted_spec
from tests.support.inprocess import agent, capability, route_table
from tests.support.servers import free_port, platform_env, running, uvicorn_args

pytestmark = pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="several processes share the database: PostgreSQL")


def test_two_workers_load_from_the_database_and_never_serve_a_foreign_snapshot(
        transactional_db, tmp_path):
    import httpx

    factories.seed_defaults()
    tenant = factories.tenant()
    for spec in scripted_spec(free_port()):
        agent_register(tenant=tenant, spec=spec)
    key = factories.api_key(tenant=tenant, scopes=[ApiKeyScope.INVOKE]).plaintext
    ghost, _ = route_table([agent("ghost", "http://127.0.0.1:9/", capability("ghost.cap"))])
    (tmp_path / "routes.json").write_bytes(orjson.dumps(
        {"identity": "another-database", "table": orjson.loads(table_to_json(ghost))}))
    env = platform_env(tmp_path, DATABASE_URL=database_url(),
                       REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS))
    port = free_port()
    log = tmp_path / "workers.log"

    with running([*uvicorn_args(port), "--workers", "2"], env=env, port=port, log=log) as base:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=10) as client:
            # Fresh connections, so the kernel spreads them over both workers.
            ghosts = [httpx.get(f"{base}/v1/route", params={"capability": "ghost.cap"},
                                headers=headers).json()["error"]["code"] for _ in range(40)]
            real = [client.get("/v1/route", params={"capability": "echo.all"}).status_code
                    for _ in range(10)]

    assert set(ghosts) == {"no_capability"}
    assert set(real) == {200}
    text = log.read_text()
    assert "cold start" not in text, text[-3000:]
    assert "reload failed" not in text, text[-3000:]


def test_a_control_plane_process_follows_no_route_table(transactional_db, tmp_path):
    import httpx

    env = platform_env(tmp_path, DATABASE_URL=database_url(), REACH_SERVE_GATEWAY="false",
                       REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS))
    port = free_port()
    with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "cp.log") as base:
        api = httpx.get(f"{base}/api/v1/agents/")
        gateway = httpx.post(f"{base}/v1/invoke", json={"capability": "x", "input": {}})

    assert api.status_code == 401  # the API is served (and wants a key)
    assert gateway.status_code == 404
    assert "control plane only" in gateway.json()["error"]["message"]
    # Nothing followed, nothing persisted.
    assert not (tmp_path / "routes.json").exists()
