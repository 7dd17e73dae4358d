"""Leases mean it, end to end: two real agent processes heartbeat a real control plane,
one is SIGSTOPped, and a real gateway process (uvicorn, route table over Redis) keeps
answering 10 calls a second.

The acceptance: lease TTL 10 s, success >= 99 %, and the stopped instance gets no call
more than TTL + 2 s after its last heartbeat. A relay in front of the stopped agent
records when each request reached it, since the stopped process itself cannot say.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from django.conf import settings

from registry.models import Instance
from tenants.choices import ApiKeyScope
from tests import factories
from tests.gateway.conftest import gateway_env
from tests.support.lossy import RelayProxy
from tests.support.servers import ROOT, free_port, running, uvicorn_args
from tests.support.waiting import wait_for

pytestmark = pytest.mark.skipif(not settings.REDIS_URL,
                                reason="the route table travels over Redis between processes")

TTL_S = 10
RATE = 10  # calls per second
CALLS = 200  # 20 s
STOP_AT = 30  # the call before which one agent is stopped


def _agent(control: str, key: str, *, port: int, endpoint: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.agents.registered_agent", control, key,
         "--name", "lease-echo", "--capability", "lease.echo", "--port", str(port),
         "--endpoint", endpoint, "--ttl", str(TTL_S), "--declared-interval", "3",
         "--interval", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"agent did not start: {line!r}")
    proc.ready = json.loads(line[len("READY "):])
    return proc


def test_a_stopped_instance_gets_no_calls_after_its_lease_and_callers_barely_notice(
        transactional_db, tmp_path):
    factories.seed_defaults()
    tenant = factories.tenant()
    key = factories.api_key(tenant=tenant,
                            scopes=[ApiKeyScope.REGISTER, ApiKeyScope.INVOKE]).plaintext
    port = free_port()
    stopped_port = free_port()
    agents: list[subprocess.Popen] = []
    with running(uvicorn_args(port), env=gateway_env(tmp_path), port=port,
                 log=tmp_path / "gw.log") as base, RelayProxy(stopped_port) as relay:
        try:
            agents.append(_agent(base, key, port=stopped_port, endpoint=relay.endpoint))
            healthy_port = free_port()
            agents.append(_agent(base, key, port=healthy_port,
                                 endpoint=f"http://127.0.0.1:{healthy_port}/"))
            stopped = agents[0]
            auth = {"Authorization": f"Bearer {key}"}

            def routable() -> bool:
                dry = httpx.get(f"{base}/v1/route", params={"capability": "lease.echo"},
                                headers=auth, timeout=5).json()
                return len(dry.get("candidates", ())) == 2

            wait_for(routable, timeout=20, message="both instances in the gateway's table")

            results: list[tuple[float, int, int | None]] = []  # sent at, status, port
            limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
            with httpx.Client(base_url=base, headers=auth, timeout=15,
                              limits=limits) as http:

                def one(n: int) -> tuple[float, int, int | None]:
                    sent = time.time()
                    reply = http.post("/v1/invoke", json={
                        "capability": "lease.echo", "input": {"n": n}},
                        headers={"X-Reach-Deadline-Ms": "3000"})
                    served = reply.json()["output"]["port"] if reply.status_code == 200 \
                        else None
                    return sent, reply.status_code, served

                with concurrent.futures.ThreadPoolExecutor(64) as pool:
                    futures = []
                    start = time.monotonic()
                    for n in range(CALLS):
                        if n == STOP_AT:
                            os.kill(stopped.pid, signal.SIGSTOP)
                            stopped_at = time.time()
                        # Pacing the load (10 calls/s), not waiting for anything.
                        time.sleep(max(0.0, start + n / RATE - time.monotonic()))
                        futures.append(pool.submit(one, n))
                    results = [f.result() for f in futures]
            ended = time.time()
            instance = Instance.objects.get(pk=stopped.ready["instance"])
            last_heartbeat = instance.last_heartbeat_at.timestamp()
            dry = httpx.get(f"{base}/v1/route", params={"capability": "lease.echo"},
                            headers=auth, timeout=5).json()
        finally:
            for proc in agents:
                with_suppressed_kill(proc)
        late = relay.since(last_heartbeat + TTL_S + 2)
        to_stopped_after = relay.since(stopped_at)

    ok = sum(1 for _, status, _ in results if status == 200)
    success = ok / len(results)
    print(f"success {success:.1%} ({ok}/{len(results)}); calls reaching the stopped agent "
          f"after SIGSTOP: {[round(t - last_heartbeat, 2) for t in to_stopped_after]} s "
          f"after its last heartbeat (SIGSTOP {stopped_at - last_heartbeat:.2f} s after it, "
          f"run ended {ended - last_heartbeat:.1f} s after it)")
    assert ended > last_heartbeat + TTL_S + 2  # the run outlived the lease
    assert success >= 0.99
    assert late == []
    # Served by both before the stop, by the healthy one after the lease ran out.
    assert {p for _, status, p in results[:STOP_AT] if status == 200} == \
        {stopped_port, healthy_port}
    assert {p for sent, status, p in results
            if status == 200 and sent > last_heartbeat + TTL_S + 2} == {healthy_port}
    reasons = {d["reason"] for d in dry["dropped"] if d.get("instance_id") == instance.pk}
    assert reasons == {"lease_expired"}


def with_suppressed_kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()
