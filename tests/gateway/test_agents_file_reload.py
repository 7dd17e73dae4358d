"""Editing the watched agents file changes a weight on every gateway within 2 s: the
scheduler's job (as the run command and Celery beat run it, every second) applies the
change, and the route-table delta reaches both gateway processes."""

from __future__ import annotations

import time

import httpx
import pytest
from django.conf import settings as django_settings

from reach_platform.scheduler import InProcessScheduler, registry_jobs
from tests.gateway.conftest import another_gateway, wait_for_table
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(
    not (django_settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
         and django_settings.REDIS_URL),
    reason="two gateway processes follow the table over Redis (.ci/run sets both)")

AGENTS = """agents:
  - name: file-agent
    endpoint: http://127.0.0.1:{port}/
    protocol: raw-http
    capabilities: [file.echo]
    routing:
      weight: {weight}
      priority: 1
"""


def weight_seen(base: str, key: str) -> int | None:
    reply = httpx.get(f"{base}/v1/route", params={"capability": "file.echo"},
                      headers={"Authorization": f"Bearer {key}"}, timeout=5)
    if reply.status_code != 200:
        return None
    candidates = reply.json().get("candidates") or []
    return candidates[0]["scores"]["weight"] if candidates else None


@pytest.mark.django_db(transaction=True)
def test_an_edit_reaches_every_gateway_within_two_seconds(gateway, tmp_path, settings):
    path = tmp_path / "agents.yaml"
    path.write_text(AGENTS.format(port=gateway.agent_port, weight=40))
    settings.AGENTS_FILE, settings.AGENTS_TENANT = str(path), gateway.tenant.slug
    jobs = {name: job for name, job in registry_jobs().items()
            if name == "registry.apply_agents_file"}
    scheduler = InProcessScheduler(jobs)
    scheduler.start()
    try:
        with another_gateway(tmp_path, "second") as second:
            bases = (gateway.base, second)
            from registry.snapshot import current_version

            wait_for(lambda: all(weight_seen(b, gateway.key) == 40 for b in bases),
                     timeout=20, interval=0.05, message="the file's first version")
            wait_for_table(bases, current_version())
            path.write_text(AGENTS.format(port=gateway.agent_port, weight=85))
            edited = time.monotonic()
            seen = wait_for(lambda: all(weight_seen(b, gateway.key) == 85 for b in bases)
                            and time.monotonic(), timeout=20, interval=0.02,
                            message="the new weight on both gateways")
            elapsed = seen - edited
    finally:
        scheduler.stop()
    assert elapsed < 2.0, f"{elapsed:.2f} s from the edit to both gateways"
