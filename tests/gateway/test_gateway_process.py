"""A gateway process (``reach_platform.gateway_asgi``) serves the data plane and the health
checks, names the control plane for everything else, and never loads the control plane's
stack: that is what keeps it small at fleet size (bench/fleet.py)."""

from __future__ import annotations

import subprocess
import sys

import httpx

from tests.gateway.conftest import another_gateway, gateway_env
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
    assert ready.json()["checks"]["database"]["ok"] is True
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
