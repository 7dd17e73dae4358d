"""The field reports' descriptors, end to end on a real platform process.

Registered over HTTP with a registration key, read back with GET, and called
through the gateway to the scripted agent (which echoes what it was sent).
"""

from __future__ import annotations

from pathlib import Path

import httpx

from registry.snapshot import current_version
from tenants.choices import ApiKeyScope
from tests import factories
from tests.gateway.conftest import wait_for_table

EXAMPLES = Path(__file__).parents[1] / "registry" / "examples"


def test_field_report_descriptors_round_trip_and_their_inputs_are_enforced(gateway):
    registrar = factories.api_key(tenant=gateway.tenant,
                                  scopes=[ApiKeyScope.REGISTER, ApiKeyScope.READ]).plaintext
    headers = {"Authorization": f"Bearer {registrar}"}
    echo = f"http://127.0.0.1:{gateway.agent_port}"
    # The name lent to this tenant by default: DOWNSTREAM_<its slug>__*.
    lent = f"DOWNSTREAM_{gateway.tenant.slug.upper().replace('-', '_')}__CLOUD_SALES_TOKEN"
    entry = (f"agents:\n  - name: cloud-chat-sales\n    endpoint: {echo}/v1\n"
             "    protocol: openai-compatible\n    capabilities: [chat, tool-calling]\n"
             "    internal_only: true\n"
             "    auth: {type: header, key: Authorization,\n"
             f"           value_env: {lent}}}\n"
             "    pool: {max_conns: 64, idle_timeout: 90s}\n"
             "    routing: {weight: 70, priority: 1}\n")
    summary = (EXAMPLES / "field-report.capability.yaml").read_text().replace(
        "http://127.0.0.1:9102/", f"{echo}/").replace("path: /v1/summarize", "path: /echo")

    with httpx.Client(base_url=gateway.base, headers=headers, timeout=10) as api:
        yaml_type = {"Content-Type": "application/yaml"}
        created = api.post("/api/v1/agents/register", content=entry, headers=yaml_type)
        assert created.status_code == 201, created.text
        got = api.get(f"/api/v1/agents/{created.json()['agent']['id']}/").json()
        registered = api.post("/api/v1/agents/register", content=summary, headers=yaml_type)
        assert registered.status_code == 201, registered.text

    assert (got["protocol"], got["internal_only"], got["weight"], got["priority"]) == (
        "openai", True, 70, 1)
    assert (got["pool_max_connections"], got["pool_idle_seconds"]) == (64, 90)
    assert [(c["kind"], c["field_name"], c["value_env"]) for c in got["credentials"]] == [
        ("header", "Authorization", lent)]
    assert got["descriptor"]["protocol"] == "openai-compatible"

    wait_for_table([gateway.base], current_version())
    with gateway.client() as caller:
        def summarise(**input_):
            return caller.post("/v1/invoke", json={"capability": "summarize_document",
                                                   "input": input_})
        empty = summarise()
        defaulted = summarise(document_url="https://example.invalid/a.pdf")
        chosen = summarise(document_url="d", dest_lang="en")

    assert empty.status_code == 400
    assert empty.json()["error"]["code"] == "invalid_input"
    assert empty.json()["error"]["details"] == {"document_url": ["is required"]}
    assert defaulted.status_code == 200, defaulted.text
    assert defaulted.json()["output"]["echo"] == {
        "document_url": "https://example.invalid/a.pdf", "target_lang": "zh"}
    assert chosen.json()["output"]["echo"] == {"document_url": "d", "target_lang": "en"}
