"""At fleet size, the chat door finds the agent named by ``model`` without scanning."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Iterator, Mapping
from dataclasses import replace

from tests.support.inprocess import agent, capability, in_process, route_table, scripted_agents


class NoScan(Mapping):
    """The table's agents, refusing to be iterated: any scan over the fleet fails the test."""

    def __init__(self, rows: Mapping) -> None:
        self._rows = rows

    def __getitem__(self, pk):
        return self._rows[pk]

    def get(self, pk, default=None):
        return self._rows.get(pk, default)

    def __contains__(self, pk) -> bool:
        return pk in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator:
        raise AssertionError("the call scanned every agent in the table")


def test_a_chat_completion_by_agent_name_among_ten_thousand_does_not_scan(scripted):
    fleet = [agent(f"fleet-{n:05d}", "http://127.0.0.1:9/", capability(f"fleet.cap{n}"))
             for n in range(10_000)]
    table, key = route_table([*fleet, *scripted_agents(scripted.endpoint)])
    guarded = replace(table, agents=NoScan(types.MappingProxyType(dict(table.agents))))

    async def go(model: str):
        async with in_process(guarded, key) as gw:
            return await gw.post("/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": "hi"}]})

    # Names are unique regardless of letter case: any spelling finds the agent.
    for model in ("scripted-chat", "Scripted-CHAT", "default/scripted-chat"):
        response = asyncio.run(go(model))
        assert response.status_code == 200, (model, response.text)
        assert response.json()["model"] == "scripted-chat"


def test_an_openai_endpoint_given_as_the_sdks_base_url_is_not_doubled(scripted):
    """Field reports register OpenAI-compatible agents by their base URL (``…/v1``); the
    protocol's path also starts with ``/v1``: the call must reach ``/v1/chat/completions``."""
    base = agent("cloud-chat", f"{scripted.endpoint}v1", capability("chat"), protocol="openai")
    table, key = route_table([base])

    async def go():
        async with in_process(table, key) as gw:
            return await gw.post("/v1/chat/completions", {
                "model": "cloud-chat", "messages": [{"role": "user", "content": "hi"}]})

    response = asyncio.run(go())

    assert response.status_code == 200, response.text
    assert scripted.seen()[-1]["path"] == "/v1/chat/completions"
