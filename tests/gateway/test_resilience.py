"""Outages against real processes. (Retries and breakers are tested in process, on an
injected clock: tests/gateway/test_pipeline.py.)"""

from __future__ import annotations

import httpx
import pytest
from django.conf import settings

from tests.support.waiting import wait_for


@pytest.mark.skipif(not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
                    reason="needs PostgreSQL over TCP to cut; runs under .ci/run")
@pytest.mark.gateway_via_forwarders
def test_calls_keep_succeeding_while_postgresql_is_unreachable(gateway):
    # Only the gateway loses PostgreSQL: its connections go through a forwarder this test
    # owns and cuts; the machine's server, and this process's connections, are untouched.
    assert gateway.postgres.accepted, "the gateway does not reach PostgreSQL via the forwarder"
    with gateway.client() as client:
        before = client.post("/v1/invoke", json={"capability": "translate.text",
                                                 "input": {"text": "hello", "dest_lang": "ja"}})
        assert before.status_code == 200
        with gateway.postgres.outage():
            for _ in range(5):
                during = client.post("/v1/invoke", json={
                    "capability": "translate.text",
                    "input": {"text": "thank you", "dest_lang": "zh"}})
                assert during.status_code == 200, during.text
                assert during.json()["reply_content"] == "谢谢"
            ready = httpx.get(f"{gateway.base}/readyz", timeout=10)
            assert ready.status_code == 503  # the control plane knows it is degraded
    # Reachable again: the gateway reconnects by itself.
    wait_for(lambda: httpx.get(f"{gateway.base}/readyz", timeout=10).status_code == 200,
             timeout=30, interval=0.2, message="/readyz to pass after the outage")
