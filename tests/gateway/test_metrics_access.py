"""/metrics names every tenant, agent and capability with their volumes: it answers
only the operator's networks or its token, not whoever can reach the gateway's port (a
break test read another tenant's private agent names from it with no key)."""

from __future__ import annotations

import asyncio
import ipaddress

import httpx

from gateway.config import GatewayConfig
from tests.support.inprocess import gateway_app, route_table, scripted_agents


def scrape(client_address: str, **config) -> list[httpx.Response]:
    table, _ = route_table(scripted_agents("http://127.0.0.1:9/"))
    app = gateway_app(table, **config)

    async def run():
        transport = httpx.ASGITransport(app=app, client=(client_address, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            try:
                return [await client.get("/metrics"),
                        await client.get("/metrics", headers={"Authorization": "Bearer t0k3n"}),
                        await client.get("/metrics", headers={"Authorization": "Bearer nope"})]
            finally:
                await app.close()

    return asyncio.run(run())


def test_metrics_answer_the_operators_networks_and_token_only():
    plain, token, wrong = scrape("203.0.113.9", metrics_token="t0k3n")
    assert plain.status_code == 403 and plain.json()["error"]["code"] == "forbidden"
    assert "REACH_METRICS_TOKEN" in plain.json()["error"]["message"]
    assert "reach_" not in plain.text
    assert token.status_code == 200 and "reach_route_table_version" in token.text
    assert wrong.status_code == 403

    loopback, _, _ = scrape("127.0.0.1")
    assert loopback.status_code == 200
    assert scrape("::1")[0].status_code == 200
    no_token, still_none, _ = scrape("203.0.113.9")  # no token set: none opens it
    assert (no_token.status_code, still_none.status_code) == (403, 403)
    scraper = scrape("10.1.2.3", metrics_networks=(ipaddress.ip_network("10.0.0.0/8"),))[0]
    assert scraper.status_code == 200


def test_the_default_config_serves_loopback_only():
    from reach_core.endpoints import EndpointPolicy

    config = GatewayConfig(policy=EndpointPolicy(allow=(), own_ports=()))
    assert config.may_read_metrics("127.0.0.1", None)
    assert not config.may_read_metrics("192.168.1.20", None)
    assert not config.may_read_metrics(None, "Bearer ")
