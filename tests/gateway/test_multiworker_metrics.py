"""Two gateway workers behind one port share their metrics (PROMETHEUS_MULTIPROC_DIR):
whichever worker a scrape reaches, it counts every call."""

from __future__ import annotations

import collections

import httpx
import pytest
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from registry.services import agent_register
from tenants.choices import ApiKeyScope
from tests import factories
from tests.gateway.conftest import database_url, scripted_spec
from tests.support.inprocess import start_scripted_agent, stop_process
from tests.support.servers import GATEWAY_ONLY, free_port, platform_env, running, uvicorn_args

pytestmark = pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="several processes share the database: PostgreSQL")


def calls_by_outcome(base: str, tenant: str) -> dict[str, float]:
    out: dict[str, float] = collections.Counter()
    # A fresh connection per scrape: the kernel hands it to either worker.
    text = httpx.get(f"{base}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "reach_agent_calls_total" and sample.labels["tenant"] == tenant:
                out[sample.labels["outcome"]] += sample.value
    return dict(out)


def test_every_scrape_of_two_workers_counts_every_call(transactional_db, tmp_path):
    factories.seed_defaults()
    tenant = factories.tenant()
    agent_port = free_port()
    agent = start_scripted_agent(agent_port).proc
    try:
        for spec in scripted_spec(agent_port):
            agent_register(tenant=tenant, spec=spec)
        key = factories.api_key(tenant=tenant, scopes=[ApiKeyScope.INVOKE]).plaintext
        shared = tmp_path / "prometheus"
        shared.mkdir()
        env = platform_env(tmp_path, DATABASE_URL=database_url(),
                           REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS),
                           PROMETHEUS_MULTIPROC_DIR=str(shared))
        port = free_port()
        with running([*uvicorn_args(port, GATEWAY_ONLY), "--workers", "2"], env=env,
                     port=port, log=tmp_path / "workers.log") as base:
            headers = {"Authorization": f"Bearer {key}"}
            statuses = [httpx.post(f"{base}/v1/invoke", headers=headers, timeout=10, json={
                "capability": capability, "input": {"n": n}}).status_code
                for n, capability in enumerate(["echo.all"] * 24 + ["no.such"] * 6)]
            assert statuses == [200] * 24 + [404] * 6
            scrapes = [calls_by_outcome(base, tenant.slug) for _ in range(8)]
        # Both workers served (each wrote its own file), and every scrape saw all calls.
        pids = {p.name.rsplit("_", 1)[-1] for p in shared.glob("counter_*.db")}
        assert len(pids) == 2, sorted(p.name for p in shared.iterdir())
        assert all(s == {"success": 24, "no_capability": 6} for s in scrapes), scrapes
    finally:
        stop_process(agent)
