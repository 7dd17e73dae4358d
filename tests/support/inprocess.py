"""The gateway in process: a ``GatewayApp`` around a hand-built route table, called
through ``httpx.ASGITransport``, forwarding to real agents on loopback.

No database and no uvicorn: a test builds the table it needs, so what it asserts is
the gateway's behaviour and nothing else. Use a real server (``tests.support.servers``)
only for what needs a socket: framing, disconnects, lifespan, smuggling.
"""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import sys
import types
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import httpx

from gateway.app import GatewayApp
from gateway.breaker import CircuitBreakers
from gateway.budgets import MemoryBudgets
from gateway.config import GatewayConfig
from gateway.governance import Governor
from gateway.idempotency import MemoryStore
from gateway.limits import InProcessLimiter
from gateway.usage import UsageQueue
from reach_core import keys
from reach_core.endpoints import EndpointPolicy
from routing.router import Router
from routing.table import (
    AgentEntry,
    ApiKeyEntry,
    CapabilityEntry,
    InstanceEntry,
    QuotaEntry,
    RouteTable,
    TenantEntry,
)

TENANT_PK = 1
OTHER_PK = TENANT_PK + 1
_pk = itertools.count(100)


@dataclass
class ScriptedAgent:
    """``tests.agents.scripted_agent`` running in its own process."""

    port: int
    proc: subprocess.Popen

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def seen(self) -> list[dict]:
        return httpx.get(f"http://127.0.0.1:{self.port}/_seen").json()

    def calls_with(self, marker: str) -> int:
        """How many requests this agent received whose body mentions ``marker``."""
        return sum(1 for entry in self.seen() if marker in repr(entry.get("body")))


def start_scripted_agent(port: int) -> ScriptedAgent:
    from tests.support.servers import ROOT

    proc = subprocess.Popen([sys.executable, "-m", "tests.agents.scripted_agent", str(port)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    if proc.stdout.readline().strip() != "READY":
        proc.kill()
        raise RuntimeError("scripted agent did not start")
    return ScriptedAgent(port=port, proc=proc)


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()


def capability(capability_id: str, **kw) -> CapabilityEntry:
    return CapabilityEntry(pk=next(_pk), capability_id=capability_id, **kw)


def agent(name: str, endpoint: str, *capabilities: CapabilityEntry, instances: int = 1,
          **kw) -> AgentEntry:
    pk = next(_pk)
    rows = tuple(InstanceEntry(pk=next(_pk), agent_pk=pk, endpoint=endpoint)
                 for _ in range(instances))
    return AgentEntry(pk=pk, namespace="default", name=name, owner_tenant_pk=TENANT_PK,
                      capabilities=capabilities, instances=rows, **kw)


def scripted_agents(endpoint: str) -> list[AgentEntry]:
    """The scripted agent as three agents, one per protocol."""
    return [
        agent("scripted", endpoint,
              capability("echo.all", path="/echo",
                         output_schema={"type": "object", "required": ["echo"]}),
              capability("strict.echo", path="/echo", input_schema={
                  "type": "object", "required": ["text"], "additionalProperties": False,
                  "properties": {"text": {"type": "string", "minLength": 1}}}),
              capability("slow.op", path="/slow", timeout_ms=5000),
              capability("bad.op", path="/bad",
                         output_schema={"type": "object", "required": ["answer"]}),
              capability("fail.op", path="/fail"),
              capability("refuse.op", path="/refuse"),
              capability("echo.limited", path="/echo", qps=1, burst=2),
              price_per_call=0.5),
        agent("scripted-chat", endpoint,
              capability("chat.scripted", path="/v1/chat/completions", kind="stream"),
              protocol="openai"),
        agent("scripted-a2a", endpoint, capability("a2a.scripted", path="/a2a", kind="stream"),
              protocol="a2a"),
    ]


def route_table(agents: list[AgentEntry], *, quotas: tuple[QuotaEntry, ...] = (),
                scopes: frozenset[str] = frozenset({"invoke"})) -> tuple[RouteTable, str]:
    """A table with one tenant and one key for it; returns the table and the key."""
    plaintext, prefix, key_hash = keys.generate()
    table = RouteTable(
        version=1,
        agents=types.MappingProxyType({a.pk: a for a in agents}),
        tenants=types.MappingProxyType({TENANT_PK: TenantEntry(pk=TENANT_PK, slug="acme")}),
        api_keys=types.MappingProxyType({1: ApiKeyEntry(
            pk=1, prefix=prefix, key_hash=key_hash, tenant_pk=TENANT_PK, scopes=scopes)}),
        quotas=types.MappingProxyType({q.pk: q for q in quotas}),
    ).indexed()
    return table, plaintext


def two_tenants(endpoint: str):
    """The scripted agents, public, and a key for each of two tenants (``TENANT_PK``
    and ``OTHER_PK``, slug globex)."""
    agents = [replace(a, visibility="public") for a in scripted_agents(endpoint)]
    table, first = route_table(agents)
    second, prefix, key_hash = keys.generate()
    table = replace(
        table,
        tenants=types.MappingProxyType({**table.tenants,
                                        OTHER_PK: TenantEntry(pk=OTHER_PK, slug="globex")}),
        api_keys=types.MappingProxyType({**table.api_keys, 2: ApiKeyEntry(
            pk=2, prefix=prefix, key_hash=key_hash, tenant_pk=OTHER_PK,
            scopes=frozenset({"invoke"}))}),
    ).indexed()
    return table, first, second


def quota(**kw) -> QuotaEntry:
    return QuotaEntry(pk=next(_pk), tenant_pk=TENANT_PK, **kw)


@dataclass
class InProcessGateway:
    app: GatewayApp
    key: str
    client: httpx.AsyncClient

    @property
    def usage(self) -> UsageQueue:
        return self.app.usage

    async def post(self, path: str, body: dict, **headers: str) -> httpx.Response:
        return await self.client.post(path, json=body, headers=self._headers(headers))

    async def get(self, path: str, **kw) -> httpx.Response:
        return await self.client.get(path, headers=self._headers(kw.pop("headers", {})), **kw)

    def _headers(self, extra: dict) -> dict:
        return {"Authorization": f"Bearer {self.key}",
                **{k.replace("_", "-"): v for k, v in extra.items()}}


def gateway_app(table: RouteTable, *, breakers: CircuitBreakers | None = None,
                router: Router | None = None, route_feedback=None, **config) -> GatewayApp:
    policy = EndpointPolicy(allow=("127.0.0.0/8",), own_ports=())
    return GatewayApp(
        table=lambda: table, router=router or Router(),
        config=GatewayConfig(policy=policy, **config), breakers=breakers or CircuitBreakers(),
        governor=Governor(limiter=InProcessLimiter(), ledger=MemoryBudgets()),
        usage=UsageQueue(), idempotency=MemoryStore(), route_feedback=route_feedback,
    )


@contextlib.asynccontextmanager
async def in_process(table: RouteTable, key: str, *, breakers: CircuitBreakers | None = None,
                     **options) -> AsyncIterator[InProcessGateway]:
    """The gateway for ``table``; closed (jobs stopped, pools closed) at the end.
    ``options``: ``gateway_app``'s (a router, a route-feedback recorder, config)."""
    app = gateway_app(table, breakers=breakers, **options)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway",
                                 timeout=10) as client:
        try:
            yield InProcessGateway(app=app, key=key, client=client)
        finally:
            await app.close()


def with_instances(entry: AgentEntry, *endpoints: str) -> AgentEntry:
    """``entry`` served by one instance per endpoint (in this order of pks)."""
    rows = tuple(InstanceEntry(pk=next(_pk), agent_pk=entry.pk, endpoint=e) for e in endpoints)
    return replace(entry, instances=rows)
