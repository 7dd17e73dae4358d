"""A gateway process (``reach_platform.gateway_asgi``) serves the data plane and the health
checks, names the control plane for everything else, and never loads the control plane's
stack: that is what keeps it small at fleet size (bench/fleet.py)."""

from __future__ import annotations

import subprocess
import sys

import httpx

from tests.gateway.conftest import another_gateway, database_url, gateway_env
from tests.support.servers import GATEWAY_ONLY, ROOT

CONTROL_PLANE_STACK = ("rest_framework", "drf_spectacular", "celery", "django.contrib.admin",
                       "django.contrib.sessions", "metering", "audit", "registry.services",
                       "registry.descriptors")


def test_a_gateway_process_serves_calls_and_health_checks_and_nothing_else(gateway, tmp_path):
    with another_gateway(tmp_path, "gateway-only", app=GATEWAY_ONLY) as base:
        headers = {"Authorization": f"Bearer {gateway.key}"}
        call = httpx.post(f"{base}/v1/invoke", headers=headers, timeout=10,
                          json={"capability": "echo.all", "input": {"x": 1}})
        health = httpx.get(f"{base}/healthz", timeout=5)
        ready = httpx.get(f"{base}/readyz", timeout=5)
        metrics = httpx.get(f"{base}/metrics", timeout=5)
        elsewhere = [httpx.request(method, f"{base}{path}", headers=headers, timeout=5)
                     for method, path in (("GET", "/api/v1/agents"), ("GET", "/admin/"),
                                          ("POST", "/api/v1/instances/1/heartbeat"),
                                          ("GET", "/api/schema/"))]

    assert call.status_code == 200, call.text
    assert call.json()["output"]["echo"] == {"x": 1}
    assert (health.status_code, ready.status_code) == (200, 200), (health.text, ready.text)
    assert ready.json()["status"] == "ready" and ready.json()["table_version"] > 0
    assert metrics.status_code == 200 and "reach_route_table_version" in metrics.text
    for reply in elsewhere:
        assert reply.status_code == 404, reply.text
        error = reply.json()["error"]
        assert error["code"] == "not_found"
        assert "control-plane" in error["message"]


def test_a_gateway_process_imports_none_of_the_control_planes_stack(gateway, tmp_path):
    probe = ("import sys, reach_platform.gateway_asgi as entry\n"
             "assert entry.gateway_application is not None\n"
             f"print(sorted(m for m in sys.modules if m.startswith({CONTROL_PLANE_STACK!r})))")
    env = gateway_env(tmp_path)
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, timeout=60,
                            capture_output=True, text=True, check=False)

    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_gateway_started_with_the_database_away_says_so_and_serves_once_it_is_back(
        gateway, tmp_path):
    """No table yet (database away, no snapshot): a valid key gets 503 with Retry-After,
    never a 401 that would count towards the address's failed authentications, and the
    gateway is not ready; once the database answers it serves."""
    from tests.support.forwarder import Forwarder
    from tests.support.servers import free_port, running, uvicorn_args
    from tests.support.waiting import wait_for

    with Forwarder.for_url(database_url()) as postgres:
        postgres.cut()
        env = {**gateway_env(tmp_path), "DATABASE_URL": postgres.url(database_url())}
        port = free_port()
        with running(uvicorn_args(port, GATEWAY_ONLY), env=env, port=port,
                     log=tmp_path / "cold.log") as base, httpx.Client(
                base_url=base, timeout=10,
                headers={"Authorization": f"Bearer {gateway.key}"}) as client:
            away = [client.post("/v1/invoke", json={"capability": "echo.all", "input": {}})
                    for _ in range(30)]
            not_ready = httpx.get(f"{base}/readyz", timeout=5)
            head = httpx.head(f"{base}/healthz", timeout=5)
            postgres.restore()
            wait_for(lambda: client.post("/v1/invoke", json={
                "capability": "echo.all", "input": {}}).status_code == 200,
                timeout=30, message="the gateway to serve once the database is back")
            ready = httpx.get(f"{base}/readyz", timeout=5)
            # And readiness is the table's, not the database's: it stays ready without it.
            postgres.cut()
            still_ready = httpx.get(f"{base}/readyz", timeout=5)
            postgres.restore()

    assert {r.status_code for r in away} == {503}
    assert all(r.json()["error"]["code"] == "service_unavailable" for r in away)
    assert int(away[0].headers["retry-after"]) >= 1
    assert not_ready.status_code == 503 and head.status_code == 200
    assert ready.status_code == 200 and ready.json()["table_version"] > 0
    assert still_ready.status_code == 200


def test_a_gateway_process_names_the_request_it_refuses(gateway, tmp_path):
    with another_gateway(tmp_path, "gateway-only", app=GATEWAY_ONLY) as base:
        reply = httpx.get(f"{base}/api/v1/agents", headers={"X-Request-ID": "req-elsewhere"})
        long_intent = httpx.post(f"{base}/v1/invoke", headers={
            "Authorization": f"Bearer {gateway.key}"},
            json={"intent": "translate " * 1000, "input": {}})
    assert reply.status_code == 404
    assert reply.headers["x-request-id"] == "req-elsewhere"
    assert reply.json()["error"]["request_id"] == "req-elsewhere"
    assert long_intent.status_code == 400
    assert long_intent.json()["error"]["details"] == {"intent": ["too long"]}
