"""Asynchronous tasks end to end: a real gateway process, a real Celery worker (with beat)
running the task engine, task agents and callback receivers on loopback, on this run's
PostgreSQL and Redis."""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.utils import timezone

from registry.models import Agent, Instance
from registry.services import agent_register
from registry.spec import AgentSpec, CapabilitySpec
from tasks.services import signing_secret_create
from tenants.choices import ApiKeyScope
from tests import factories
from tests.gateway.conftest import database_url
from tests.support.inprocess import stop_process
from tests.support.servers import ROOT, free_port, platform_env, running, uvicorn_args
from tests.support.waiting import wait_for

needs_services = pytest.mark.skipif(
    not (settings.REDIS_URL and settings.DATABASES["default"]["ENGINE"].endswith("postgresql")),
    reason="needs the machine's PostgreSQL and Redis (.ci/run sets them)")


def start_helper(module: str, *args: str, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env)
    if proc.stdout.readline().strip() != "READY":
        proc.kill()
        raise RuntimeError(f"{module} did not start")
    return proc


class Worker:
    """``celery -A reach_platform worker -B`` on a queue of its own, killable."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log, self.proc = env, log, None

    def start(self) -> Worker:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "reach_platform", "worker", "-B",
                 "--pool=threads", "--concurrency=4", "-n", f"tasks-{uuid.uuid4().hex[:6]}@%h",
                 "-s", str(self.log.parent / f"beat-{uuid.uuid4().hex[:6]}"),
                 "--loglevel=WARNING", "--without-mingle", "--without-gossip",
                 "--without-heartbeat"],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class TaskPlatform:
    base: str
    key: str  # invoke
    manage_key: str
    secret: str  # the tenant's "default" signing secret
    tenant: object
    agents: list  # task agent processes (ports)
    agent_ports: list[int]
    agent_token: str  # the HTTP task agent's own token
    worker: Worker
    tmp: Path
    workers: list = field(default_factory=list)  # every worker started, to stop them all
    extra: list = field(default_factory=list)

    def client(self, key: str | None = None, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=30,
                            headers={"Authorization": f"Bearer {key or self.key}"}, **kw)

    def submit(self, client: httpx.Client, capability: str, input_: dict, *,
               headers: dict | None = None, **extra):
        return client.post("/v1/invoke", json={"capability": capability, "input": input_,
                                               "mode": "async", **extra}, headers=headers)

    def task(self, client: httpx.Client, task_id: str) -> dict:
        reply = client.get(f"/v1/tasks/{task_id}")
        assert reply.status_code == 200, reply.text
        return reply.json()

    def wait_state(self, client: httpx.Client, task_id: str, states, timeout: float = 30):
        states = {states} if isinstance(states, str) else set(states)
        found = {}

        def reached() -> bool:
            found.update(self.task(client, task_id))
            return found["state"] in states

        wait_for(reached, timeout=timeout, interval=0.1,
                 message=f"task {task_id} to reach {states}")
        return found

    def restart_worker(self, *, kill: bool = False, **env: str) -> Worker:
        """Stop (or SIGKILL) the worker and start another, with ``env`` added."""
        if kill:
            self.worker.kill()
        else:
            self.worker.stop()
        n = len(self.workers)
        self.worker = Worker({**self.worker.env, **env}, self.tmp / f"worker-{n}.log").start()
        self.workers.append(self.worker)
        return self.worker

    def seen(self, index: int = 0) -> list[dict]:
        return httpx.get(f"http://127.0.0.1:{self.agent_ports[index]}/_seen").json()

    def receiver(self, *, fail: bool = False) -> tuple[str, subprocess.Popen, int]:
        port = free_port()
        args = [str(port), self.base, self.key] + (["--fail"] if fail else [])
        proc = start_helper("tests.agents.receiver", *args,
                            env={**platform_env(self.tmp), "SIGNING_SECRET": self.secret})
        self.extra.append(proc)
        return f"http://127.0.0.1:{port}/hook", proc, port


def task_agents(tenant, ports: list[int]) -> str:
    """Registers the task agents; returns the HTTP agent's token."""
    endpoints = [f"http://127.0.0.1:{p}/" for p in ports]
    http = AgentSpec(name="task-agent", protocol="http", endpoint=endpoints[0], capabilities=(
        CapabilitySpec(capability_id="work.do", path="/work"),
        CapabilitySpec(capability_id="ask.language", path="/ask"),
        CapabilitySpec(capability_id="accept.later", path="/accept"),
        CapabilitySpec(capability_id="deep.reply", path="/deep"),
    ))
    registered = agent_register(tenant=tenant, spec=http)
    for endpoint in endpoints[1:]:
        Instance.objects.create(agent=registered.agent, endpoint=endpoint)
    agent_register(tenant=tenant, spec=AgentSpec(
        name="task-a2a", protocol="a2a", endpoint=endpoints[0], capabilities=(
            CapabilitySpec(capability_id="a2a.translate", path="/a2a"),)))
    # These agents never heartbeat: leases that outlive the test.
    Instance.objects.update(lease_expires_at=timezone.now() + dt.timedelta(hours=1))
    return registered.token


@pytest.fixture
def platform(transactional_db, tmp_path, request):
    """A tenant with keys and a signing secret, two task-agent processes (one HTTP agent
    with an instance on each, one A2A agent), a gateway and a worker.
    ``@pytest.mark.gateway_env(KEY=value)`` adds settings to both processes."""
    factories.seed_defaults()
    tenant = factories.tenant()
    key = factories.api_key(tenant=tenant, scopes=[ApiKeyScope.INVOKE]).plaintext
    manage = factories.api_key(tenant=tenant, scopes=[ApiKeyScope.READ,
                                                      ApiKeyScope.MANAGE]).plaintext
    _, secret = signing_secret_create(tenant=tenant)
    ports = [free_port(), free_port()]
    agents = [start_helper("tests.agents.task_agent", str(p)) for p in ports]
    marker = request.node.get_closest_marker("gateway_env")
    port = free_port()
    env = platform_env(
        tmp_path, DATABASE_URL=database_url(), REDIS_URL=settings.REDIS_URL,
        REACH_REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX,
        REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS),
        REACH_SECRET_KEY=settings.SECRET_KEY, REACH_CELERY_QUEUE=f"q-{uuid.uuid4().hex[:8]}",
        CELERY_BROKER_URL=settings.REDIS_URL, REACH_PUBLIC_URL=f"http://127.0.0.1:{port}",
        REACH_CALLBACK_BACKOFF_S="0.2", REACH_TASK_LEASE_S="3", REACH_OWN_PORTS=str(port),
        **(marker.kwargs if marker else {}))
    worker = Worker(env, tmp_path / "worker.log")
    try:
        token = task_agents(tenant, ports)
        worker.start()
        with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "gw.log") as base:
            platform = TaskPlatform(base=base, key=key, manage_key=manage, secret=secret,
                                    tenant=tenant, agents=agents, agent_ports=ports,
                                    agent_token=token, worker=worker, tmp=tmp_path,
                                    workers=[worker])
            try:
                yield platform
            finally:
                for proc in platform.extra:
                    stop_process(proc)
                for started in platform.workers[1:]:
                    started.stop()
    finally:
        worker.stop()
        for agent in agents:
            stop_process(agent)
        Agent.objects.all().delete()
