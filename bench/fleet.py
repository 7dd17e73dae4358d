"""The fleet: heartbeats, registrations and propagation at 100, 1,000 and 10,000 agents.

    .venv/bin/python bench/fleet.py [--sizes 100,1000,10000] [--instances 5]
        [--seconds 10] [--registrations 40] [--gateways 4] [--workers 2]

Against real PostgreSQL and Redis (a database and key prefix of its own), a control
plane under uvicorn with ``--workers`` workers serving the API only
(``REACH_SERVE_GATEWAY=false``, the production layout) and ``--gateways`` gateway
processes (``reach_platform.gateway_asgi``), plus one loopback agent. Per fleet size N:

1. The fleet is written straight into the database (N agents x ``--instances``
   instances, one capability and one agent token each) and each instance's steady
   record is put in Redis, as the view leaves it after an instance's first heartbeat:
   the fleet has been beating for a while. Writing 50,000 instances through the API
   would measure registration N times over, which step 4 measures on its own.
2. The processes start, the gateways one after another (a rolling start); each
   gateway's first-serve time is from its spawn to its first answered call (a call
   through it to the loopback agent), and its RSS is read after and again at the end.
3. Heartbeat capacity: wrk, ``--connections`` keep-alive connections for ``--seconds``,
   each request the heartbeat of the next instance of the fleet with its agent's token
   (so every instance beats in turn, as a fleet does). Prints req/s, p50/p99, errors.
   Then the same for ``--judged`` seconds with a tenant key instead of agent tokens, so
   every beat goes to the view (what a fleet's first beats, or all beats without Redis,
   cost).
4. Registration and propagation, while a wrk in the background sends heartbeats at
   N/10 per second (the fleet at its 10 s interval): ``--registrations`` agents
   registered one at a time over the API with a tenant key, each with a new capability.
   Registration latency is the API call; propagation is from sending the request until
   every gateway routes the new capability (``GET /v1/route``, polled every 2 ms).

Prints a line per N; the last line is machine-readable:
``fleet agents=<N> heartbeat_capacity_per_s=<x> heartbeat_p99_ms=<x> register_p99_ms=<x>
propagation_p99_ms=<x> gateway_rss_mb=<x> gateway_private_mb=<x> first_serve_s=<x>
capacity_vs_smallest=<x>`` (RSS, private memory and first serve: the worst gateway;
private is RSS less the shared-library pages every process maps once). Everything is
on 127.0.0.1 and bounded by the options; on a shared
machine compare the sizes within one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this folder comes first on sys.path, and bench/routing.py
# would shadow the routing package: put the project first, bench/ nowhere.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.gateway_overhead import run_wrk, wait_port  # noqa: E402
from bench.upstream_clients import free_port, parse_wrk  # noqa: E402

HOST = "127.0.0.1"
DB = "reach_bench_fleet"
BEAT = '{"cpu":0.2,"memory":0.3,"queue_depth":1,"in_flight":1,"processed_recent":9}'


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def private_mb(pid: int) -> float:
    """Memory only this process holds (USS): RSS less the pages of shared libraries and
    interpreter code every process on the machine maps once."""
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total / 1024


# ---- the fleet in the database ----------------------------------------------------------


def grow_fleet(tenant, size: int, instances: int, agent_endpoint: str) -> list[tuple]:
    """Top the fleet up to ``size`` agents; returns (instance pk, token) for all."""
    import datetime as dt

    from django.utils import timezone

    from reach_core import keys
    from registry.models import Agent, AgentToken, Capability, Instance, Namespace
    from registry.tokens import AGENT_TOKEN_MARK

    # The default namespace: the one a call routes in unless it names another.
    namespace, _ = Namespace.objects.get_or_create(name="default")
    have = Agent.objects.filter(namespace=namespace, name__startswith="fleet-").count()
    lease = timezone.now() + dt.timedelta(hours=2)
    batch = 2000
    for start in range(have, size, batch):
        agents = Agent.objects.bulk_create([
            Agent(namespace=namespace, name=f"fleet-{n}", owner_tenant=tenant,
                  description=f"fleet agent {n}")
            for n in range(start, min(size, start + batch))])
        Capability.objects.bulk_create([
            Capability(agent=a, capability_id=f"fleet.cap{a.name.split('-')[1]}",
                       description=f"answers fleet question {a.name}", path="/echo")
            for a in agents])
        Instance.objects.bulk_create([
            Instance(agent=a, endpoint=f"{agent_endpoint}i{i}/", lease_expires_at=lease,
                     last_heartbeat_at=timezone.now())
            for a in agents for i in range(instances)])
        tokens = []
        for a in agents:
            plaintext, prefix, key_hash = keys.generate(AGENT_TOKEN_MARK)
            tokens.append(AgentToken(agent=a, prefix=prefix, key_hash=key_hash))
            a.plaintext = plaintext
        AgentToken.objects.bulk_create(tokens)
        _TOKENS.update((a.pk, a.plaintext) for a in agents)
    # Leases as fresh as a beating fleet's (an earlier size's beats ran them down).
    Instance.objects.filter(agent__namespace=namespace).update(lease_expires_at=lease)
    return [(pk, agent_pk, _TOKENS[agent_pk]) for pk, agent_pk in
            Instance.objects.filter(agent__namespace=namespace, agent__name__startswith="fleet-")
            .values_list("pk", "agent_id")]


_TOKENS: dict[int, str] = {}  # agent pk -> its token's plaintext, for the load generator


def seed_steady(pairs: list[tuple]) -> None:
    """Each instance's steady record and token key, as the view leaves them after a
    heartbeat."""
    import time as _time

    from reach_core import keys
    from registry import heartbeats

    client = heartbeats._client()
    pipe = client.pipeline(transaction=False)
    now = _time.time()
    for n, (pk, agent_pk, token) in enumerate(pairs):
        pipe.hset(heartbeats.key(pk), mapping={
            "lease": repr(now + 7200), "tier": "healthy", "agent": str(agent_pk),
            "caps": "", "review": "0.0", "ttl": "30", "interval": "10"})
        pipe.pexpire(heartbeats.key(pk), 7200 * 1000)
        pipe.set(heartbeats.token_key(keys.hash_key(token)), str(agent_pk), px=7200 * 1000)
        if n % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def beats_script(pairs: list[tuple], rate: float | None, connections: int) -> Path:
    """wrk's Lua: each request the next instance's heartbeat; ``rate`` spreads them."""
    listing = Path(tempfile.mkstemp(suffix=".txt")[1])
    listing.write_text("".join(f"{pk} {token}\n" for pk, _, token in pairs))
    delay = "" if rate is None else (
        f"function delay() return {connections * 1000 / rate:.3f} end\n")
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(f"""
local fleet = {{}}
for line in io.lines("{listing}") do
  local pk, token = line:match("(%S+) (%S+)")
  fleet[#fleet + 1] = {{pk, token}}
end
local counter = 0
local next_id = 0
function setup(thread)
  thread:set("offset", counter * 7919)
  counter = counter + 1
end
function init(args)
  next_id = (offset or 0) % #fleet
end
function request()
  next_id = next_id % #fleet + 1
  local beat = fleet[next_id]
  return wrk.format("POST", "/api/v1/instances/" .. beat[1] .. "/heartbeat",
    {{["Authorization"] = "Bearer " .. beat[2], ["Content-Type"] = "application/json"}},
    '{BEAT}')
end
{delay}""")
    return script


# ---- processes --------------------------------------------------------------------------


def start(argv: list[str], env: dict, port: int, name: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", *argv, "--host", HOST,
                             "--port", str(port), "--log-level", "warning",
                             "--no-access-log"], cwd=ROOT, env=env)
    proc.name = name
    return proc


def first_serve(proc: subprocess.Popen, port: int, key: str, spawned: float) -> float:
    wait_port(port, proc, proc.name)
    deadline = time.monotonic() + 120
    with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=5,
                      headers={"Authorization": f"Bearer {key}"}) as client:
        reply = None
        while time.monotonic() < deadline:
            try:
                reply = client.post("/v1/invoke", json={"capability": "fleet.cap0",
                                                        "input": {"text": "hi"}})
                if reply.status_code == 200:
                    return time.monotonic() - spawned
            except httpx.TransportError:
                pass
            time.sleep(0.01)
    raise SystemExit(f"{proc.name} never served: {reply and reply.text[:300]}")


class Watcher:
    """Polls every gateway for a capability, one kept-alive client and thread each, so
    what is timed is the gateways, not the set-up of clients and threads."""

    def __init__(self, ports: list[int], key: str) -> None:
        self._clients = [httpx.Client(base_url=f"http://{HOST}:{p}", timeout=5,
                                      headers={"Authorization": f"Bearer {key}"})
                         for p in ports]
        self._pool = ThreadPoolExecutor(len(ports))

    def until_routable(self, capability: str, sent: float, timeout: float = 30.0) -> float:
        """Seconds from ``sent`` until every gateway routes ``capability``."""

        def poll(client: httpx.Client) -> float:
            while time.monotonic() - sent < timeout:
                reply = client.get("/v1/route", params={"capability": capability})
                if reply.status_code == 200 and "error" not in reply.json():
                    return time.monotonic()
                time.sleep(0.002)
            return float("inf")

        return max(self._pool.map(poll, self._clients)) - sent

    def close(self) -> None:
        self._pool.shutdown()
        for client in self._clients:
            client.close()


# ---- one fleet size ---------------------------------------------------------------------


def measure(n: int, args, env: dict, tenant, keys_: dict, agent_url: str) -> dict:
    from django.db import connections

    print(f"\n== {n} agents x {args.instances} instances", flush=True)
    t = time.monotonic()
    pairs = grow_fleet(tenant, n, args.instances, agent_url)
    seed_steady(pairs)
    connections.close_all()
    print(f"fleet written and seeded in {time.monotonic() - t:.1f} s "
          f"({len(pairs)} instances)", flush=True)

    cp_port = free_port()
    cp_env = {**env, "REACH_SERVE_GATEWAY": "false"}
    control = start(["reach_platform.asgi:application", "--workers", str(args.workers)],
                    cp_env, cp_port, "control plane")
    gateways, ports, firsts = [], [], []
    result: dict = {"agents": n}
    try:
        # Up (both workers answering) before the gateways start: its start-up is not theirs.
        wait_port(cp_port, control, "control plane")
        answered = 0
        with httpx.Client(base_url=f"http://{HOST}:{cp_port}", timeout=5) as probe:
            for _ in range(600):
                answered = answered + 1 if probe.get("/healthz").status_code == 200 else 0
                if answered >= 20:
                    break
                time.sleep(0.05)
        # One after another, as a rolling start does: each gateway's first serve is its
        # own, not four processes' start-up sharing two cores.
        for g in range(args.gateways):
            port = free_port()
            spawned = time.monotonic()
            gateways.append(start(["reach_platform.gateway_asgi:application", "--lifespan", "on"],
                                  env, port, f"gateway {g}"))
            ports.append(port)
            firsts.append(first_serve(gateways[-1], port, keys_["invoke"], spawned))
        rss = [rss_mb(p.pid) for p in gateways]
        private = [private_mb(p.pid) for p in gateways]
        result.update(first_serve_s=max(firsts), gateway_rss_mb=max(rss),
                      gateway_private_mb=max(private))
        print(f"gateways: first serve {', '.join(f'{f:.2f}' for f in firsts)} s "
              f"(started one after another); RSS "
              f"{', '.join(f'{r:.0f}' for r in rss)} MB, private "
              f"{', '.join(f'{r:.0f}' for r in private)} MB", flush=True)

        steady = pairs
        out = parse_wrk("heartbeats", args.connections, run_wrk(
            beats_script(steady, None, args.connections), cp_port, 2, args.connections,
            args.seconds))
        result.update(heartbeat_capacity_per_s=out.rps, heartbeat_p99_ms=out.p99_ms)
        print(f"steady heartbeats: {out.rps:.0f}/s p50 {out.p50_ms:.1f} ms "
              f"p99 {out.p99_ms:.1f} ms errors {out.errors} ({out.requests} requests, "
              f"{args.connections} connections, {args.workers} workers)", flush=True)
        managed = [(pk, agent_pk, keys_["manage"]) for pk, agent_pk, _ in pairs]
        out = parse_wrk("judged", args.connections, run_wrk(
            beats_script(managed, None, args.connections), cp_port, 2, args.connections,
            args.judged))
        # Beyond what the view can judge at once it sheds (503 "overloaded", retryable):
        # the answered rate is the capacity, the rest is shed quickly.
        judged = (out.requests - out.errors) / max(args.judged, 1)
        print(f"heartbeats judged by the view (tenant key): {judged:.0f}/s judged, "
              f"{out.errors} of {out.requests} shed (503), p99 {out.p99_ms:.1f} ms",
              flush=True)

        rate = n / 10
        background = subprocess.Popen(
            [shutil.which("wrk"), "-t1", "-c10", f"-d{max(60, args.registrations * 3)}s", "-s",
             str(beats_script(steady, rate, 10)), f"http://{HOST}:{cp_port}/"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        registers, propagations = [], []
        watcher = Watcher(ports, keys_["invoke"])
        try:
            with httpx.Client(base_url=f"http://{HOST}:{cp_port}", timeout=30,
                              headers={"Authorization": f"Bearer {keys_['register']}"}) as api:
                time.sleep(1)  # the background beats under way
                for k in range(args.registrations):
                    name = f"new-{n}-{k}-{uuid.uuid4().hex[:6]}"
                    sent = time.monotonic()
                    reply = api.post("/api/v1/agents/register", json={
                        "agent_id": name, "reach": {"protocol": "http",
                                                    "endpoint": agent_url},
                        "capabilities": [{"id": f"fleet.{name}", "path": "/echo",
                                          "description": "a newly registered agent"}]})
                    registers.append(time.monotonic() - sent)
                    if reply.status_code != 201:
                        raise SystemExit(f"registration failed: {reply.status_code} "
                                         f"{reply.text[:300]}")
                    propagations.append(watcher.until_routable(f"fleet.{name}", sent))
        finally:
            watcher.close()
            background.terminate()
            background.wait(timeout=10)
        result.update(register_p50_ms=statistics.median(registers) * 1000,
                      register_p99_ms=percentile(registers, 0.99) * 1000,
                      propagation_p50_ms=statistics.median(propagations) * 1000,
                      propagation_p99_ms=percentile(propagations, 0.99) * 1000)
        print(f"registration ({args.registrations}, heartbeats at {rate:.0f}/s meanwhile): "
              f"p50 {result['register_p50_ms']:.0f} ms p99 {result['register_p99_ms']:.0f} ms;"
              f" routable on all {args.gateways} gateways: p50 "
              f"{result['propagation_p50_ms']:.0f} ms p99 "
              f"{result['propagation_p99_ms']:.0f} ms", flush=True)
        result["gateway_rss_mb"] = max(result["gateway_rss_mb"],
                                       *(rss_mb(p.pid) for p in gateways))
        result["gateway_private_mb"] = max(result["gateway_private_mb"],
                                           *(private_mb(p.pid) for p in gateways))
        print(f"gateways at the end: RSS {result['gateway_rss_mb']:.0f} MB, private "
              f"{result['gateway_private_mb']:.0f} MB (the largest)", flush=True)
    finally:
        for proc in [control, *gateways]:
            proc.terminate()
        for proc in [control, *gateways]:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--instances", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--judged", type=int, default=5)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--registrations", type=int, default=40)
    parser.add_argument("--gateways", type=int, default=4)
    # The sentence encoder (the default) adds its weights and every capability's vectors
    # to each gateway: the fleet figures are for gateways matching by words, and
    # ``--embedder multilingual`` measures the difference.
    parser.add_argument("--embedder", default="lexical", choices=("lexical", "multilingual"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()

    import psycopg
    from cryptography.fernet import Fernet

    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB}")
    data_dir = Path(tempfile.mkdtemp(prefix="reach-fleet-"))
    prefix = f"reach-bench-fleet-{uuid.uuid4().hex[:6]}:"
    env = {
        **os.environ, "DJANGO_SETTINGS_MODULE": "reach_platform.settings",
        "DATABASE_URL": f"{args.pg}/{DB}", "REDIS_URL": args.redis,
        "REACH_REDIS_KEY_PREFIX": prefix, "REACH_DATA_DIR": str(data_dir),
        "REACH_SECRET_KEY": "bench-" + uuid.uuid4().hex,
        "REACH_CREDENTIAL_KEYS": Fernet.generate_key().decode(),
        "REACH_LOG_LEVEL": os.environ.get("FLEET_LOG_LEVEL", "WARNING"),
        "REACH_INTENT_EMBEDDER": args.embedder,
    }
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                   check=True)
    import django

    django.setup()
    from tenants.choices import ApiKeyScope
    from tenants.models import Tenant
    from tenants.services import api_key_create

    tenant = Tenant.objects.create(slug="fleet", name="Fleet")
    keys_ = {
        "register": api_key_create(tenant=tenant, name="register",
                                   scopes=[ApiKeyScope.REGISTER]).plaintext,
        "invoke": api_key_create(tenant=tenant, name="invoke",
                                 scopes=[ApiKeyScope.INVOKE]).plaintext,
        "manage": api_key_create(tenant=tenant, name="manage",
                                 scopes=[ApiKeyScope.MANAGE]).plaintext,
    }
    agent_port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench.gateway_overhead:agent_app", "--host", HOST,
         "--port", str(agent_port), "--log-level", "warning", "--no-access-log"], cwd=ROOT)
    wait_port(agent_port, agent, "agent")
    results = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            results.append(measure(n, args, env, tenant, keys_,
                                   f"http://{HOST}:{agent_port}/"))
    finally:
        agent.terminate()
        agent.wait(timeout=10)
        from registry import heartbeats

        client = heartbeats._client()
        for batch in _batches(client.scan_iter(f"{prefix}*", count=5000), 5000):
            client.delete(*batch)
    print()
    base = results[0]["heartbeat_capacity_per_s"]
    for r in results:
        print(f"fleet agents={r['agents']} "
              f"heartbeat_capacity_per_s={r['heartbeat_capacity_per_s']:.0f} "
              f"heartbeat_p99_ms={r['heartbeat_p99_ms']:.1f} "
              f"register_p99_ms={r['register_p99_ms']:.0f} "
              f"propagation_p99_ms={r['propagation_p99_ms']:.0f} "
              f"gateway_rss_mb={r['gateway_rss_mb']:.0f} "
              f"gateway_private_mb={r['gateway_private_mb']:.0f} "
              f"first_serve_s={r['first_serve_s']:.2f} "
              f"capacity_vs_smallest={r['heartbeat_capacity_per_s'] / base:.2f}")


def _batches(iterable, size):
    batch = []
    for item in iterable:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


if __name__ == "__main__":
    main()
