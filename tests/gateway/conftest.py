"""A real gateway (uvicorn in a subprocess) in front of real agents on loopback."""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass, field

import httpx
import pytest
from django.conf import settings
from django.utils import timezone

from reach_platform.demo_agents import run_in_thread
from registry.descriptors import parse_json_descriptor
from registry.models import Instance
from registry.services import agent_register
from registry.spec import AgentSpec, CapabilitySpec
from tenants.choices import ApiKeyScope
from tests import factories
from tests.support.forwarder import Forwarder
from tests.support.inprocess import start_scripted_agent, stop_process
from tests.support.servers import ALL_IN_ONE, free_port, platform_env, running, uvicorn_args


def database_url() -> str:
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("postgresql"):
        return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return f"sqlite:///{db['NAME']}"


@pytest.fixture(scope="session")
def scripted():
    """One scripted agent for the in-process gateway tests of the whole session."""
    agent = start_scripted_agent(free_port())
    yield agent
    stop_process(agent.proc)


@dataclass
class Gateway:
    base: str
    key: str
    tenant: object
    agent_port: int
    procs: list = field(default_factory=list)
    # With @pytest.mark.gateway_via_forwarders: what the gateway reaches PostgreSQL and
    # Redis through (None where that service is not configured); cut one for an outage.
    postgres: Forwarder | None = None
    redis: Forwarder | None = None

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=10,
                            headers={"Authorization": f"Bearer {self.key}"}, **kw)

    def seen(self) -> list[dict]:
        return httpx.get(f"http://127.0.0.1:{self.agent_port}/_seen").json()


def scripted_spec(port: int) -> list[AgentSpec]:
    endpoint = f"http://127.0.0.1:{port}/"
    return [
        AgentSpec(name="scripted", protocol="http", endpoint=endpoint, capabilities=(
            CapabilitySpec(capability_id="echo.all", path="/echo",
                           output_schema={"type": "object", "required": ["echo"]}),
            CapabilitySpec(capability_id="slow.op", path="/slow", timeout_ms=5000),
            CapabilitySpec(capability_id="bad.op", path="/bad",
                           output_schema={"type": "object", "required": ["answer"]}),
            CapabilitySpec(capability_id="redirect.op", path="/redirect"),
            CapabilitySpec(capability_id="deep.op", path="/deep"),
        )),
        AgentSpec(name="scripted-chat", protocol="openai", endpoint=endpoint, capabilities=(
            CapabilitySpec(capability_id="chat.scripted", path="/v1/chat/completions",
                           kind="stream"),
        )),
    ]


@pytest.fixture
def gateway(transactional_db, tmp_path, request):
    """Demo agents, the scripted agent, and a gateway process, all registered for one
    tenant. ``@pytest.mark.gateway_env(KEY=value)`` adds gateway settings;
    ``@pytest.mark.gateway_tenant(slug=...)`` names the tenant;
    ``@pytest.mark.gateway_via_forwarders`` routes the gateway's PostgreSQL and Redis
    connections through test-owned forwarders (``gateway.postgres``, ``gateway.redis``)."""
    factories.seed_defaults()
    named = request.node.get_closest_marker("gateway_tenant")
    tenant = factories.tenant(**(named.kwargs if named else {}))
    demo_agents, stop_demo = run_in_thread()
    agent_port = free_port()
    agent = start_scripted_agent(agent_port).proc
    try:
        for demo in demo_agents:
            agent_register(tenant=tenant, spec=parse_json_descriptor(demo.descriptor))
        for spec in scripted_spec(agent_port):
            agent_register(tenant=tenant, spec=spec)
        # These agents never heartbeat, and leases mean it: a 30 s lease would lapse under
        # a long test on a busy machine and turn its last calls into no_healthy_instance.
        Instance.objects.update(lease_expires_at=timezone.now() + dt.timedelta(hours=1))
        key = factories.api_key(tenant=tenant, scopes=[ApiKeyScope.INVOKE]).plaintext
        marker = request.node.get_closest_marker("gateway_env")
        extra = marker.kwargs if marker else {}
        with contextlib.ExitStack() as forwarders:  # entered first: closed after the gateway
            db_url, redis_url = database_url(), settings.REDIS_URL
            postgres = redis = None
            if request.node.get_closest_marker("gateway_via_forwarders"):
                if not db_url.startswith("sqlite"):
                    postgres = forwarders.enter_context(Forwarder.for_url(db_url))
                    db_url = postgres.url(db_url)
                if redis_url:
                    redis = forwarders.enter_context(Forwarder.for_url(redis_url))
                    redis_url = redis.url(redis_url)
            env = platform_env(tmp_path, DATABASE_URL=db_url,
                               REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS),
                               **extra)
            if redis_url:
                env |= {"REDIS_URL": redis_url,
                        "REACH_REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX}
            port = free_port()
            with running(uvicorn_args(port), env=env, port=port,
                         log=tmp_path / "gw.log") as base:
                yield Gateway(base=base, key=key, tenant=tenant, agent_port=agent_port,
                              procs=[agent], postgres=postgres, redis=redis)
    finally:
        stop_process(agent)
        stop_demo()


def gateway_env(tmp_path, *, redis_url: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of another gateway process on the fixture's database and Redis
    (or ``redis_url``, e.g. a forwarder's)."""
    env = platform_env(tmp_path, DATABASE_URL=database_url(),
                       REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS), **extra)
    redis_url = redis_url or settings.REDIS_URL
    if redis_url:
        env |= {"REDIS_URL": redis_url, "REACH_REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX}
    return env


@contextlib.contextmanager
def another_gateway(tmp_path, name: str, *, redis_url: str | None = None,
                    app: str = ALL_IN_ONE, **extra: str):
    """A second gateway process beside the fixture's (``extra``: settings of its own);
    yields its base URL."""
    port = free_port()
    with running(uvicorn_args(port, app),
                 env=gateway_env(tmp_path, redis_url=redis_url, **extra),
                 port=port, log=tmp_path / f"{name}.log") as base:
        yield base


def wait_for_table(bases, version: int) -> None:
    """Until every gateway in ``bases`` serves route-table ``version`` or later."""
    from tests.support.metrics import scrape
    from tests.support.waiting import wait_for

    for base in bases:
        wait_for(lambda base=base: (scrape(base, "reach_route_table_version") or 0) >= version,
                 timeout=15, interval=0.05, message=f"{base} to serve table v{version}")
