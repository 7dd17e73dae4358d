"""Registry propagation and heartbeat absorption, against PostgreSQL + Redis.

    .venv/bin/python bench/registry_propagation.py [--agents 200] [--heartbeats 3000]

Starts the control plane under uvicorn (2 workers) and, as a separate process,
a route-table subscriber (``manage.py reach_routes``, what a gateway runs).
Registers agents one at a time over HTTP and measures, per registration, the
time from receiving the 201 to the new instance being present in the other
process's table (0 when it got there before the 201 did). Then fires
heartbeats from 8 threads and reports how many per second the control plane
absorbs. Prints figures; asserts nothing. Loops are bounded by the arguments.

Last line: ``registry_propagation p50_ms=<x> p99_ms=<x> heartbeats_per_s=<x>``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this folder comes first on sys.path, and bench/routing.py
# would shadow the routing package: put the project first, bench/ nowhere.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--heartbeats", type=int, default=3000)
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()

    import psycopg

    dbname = "reach_bench"
    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {dbname}")
    from cryptography.fernet import Fernet

    data_dir = Path(tempfile.mkdtemp(prefix="reach-bench-"))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "reach_platform.settings",
        "DATABASE_URL": f"{args.pg}/{dbname}",
        "REDIS_URL": args.redis,
        "REACH_REDIS_KEY_PREFIX": f"reach-bench-{uuid.uuid4().hex[:6]}:",
        "REACH_DATA_DIR": str(data_dir),
        "REACH_SECRET_KEY": "bench-" + uuid.uuid4().hex,
        "REACH_CREDENTIAL_KEYS": Fernet.generate_key().decode(),
        "REACH_LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                   check=True)

    import django

    django.setup()
    from tenants.choices import ApiKeyScope
    from tenants.models import Tenant
    from tenants.services import api_key_create

    tenant = Tenant.objects.create(slug="bench", name="Bench")
    key = api_key_create(tenant=tenant, name="bench", scopes=[ApiKeyScope.REGISTER]).plaintext

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "reach_platform.asgi:application", "--port",
         str(port), "--workers", "2", "--lifespan", "on", "--log-level", "warning",
         "--no-access-log"],
        cwd=ROOT, env=env,
    )
    watcher = subprocess.Popen(
        [sys.executable, "manage.py", "reach_routes"], cwd=ROOT, env=env,
        stdout=subprocess.PIPE,
    )
    seen: dict[str, int] = {}
    ready = threading.Event()

    def follow() -> None:
        for raw in watcher.stdout:
            line = json.loads(raw)
            ready.set()
            now = line["t_ns"]
            for endpoint in line["instances"]:
                seen.setdefault(endpoint, now)

    threading.Thread(target=follow, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("control plane did not start")
            time.sleep(0.1)
        if not ready.wait(30):
            raise SystemExit("subscriber did not start")

        client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"},
                              timeout=10)
        acked: dict[str, int] = {}
        agents = []
        for n in range(args.agents):
            endpoint = f"http://127.0.0.1:{20000 + n}/"
            reply = client.post("/api/v1/agents/register", json={
                "agent_id": f"bench-{n}", "reach": {"protocol": "http", "endpoint": endpoint},
                "capabilities": [{"id": f"bench.cap{n % 50}", "description": "bench"}],
            })
            acked[endpoint] = time.monotonic_ns()
            reply.raise_for_status()
            body = reply.json()
            agents.append((body["instance"]["id"], body["agent_token"]))
        wait_until = time.monotonic() + 10
        while len([e for e in acked if e in seen]) < len(acked) and time.monotonic() < wait_until:
            time.sleep(0.05)
        missing = [e for e in acked if e not in seen]
        raw = sorted((seen[e] - acked[e]) / 1e6 for e in acked if e in seen)
        latencies = [max(0.0, x) for x in raw]
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(f"registrations: {len(acked)}  seen by the other process: {len(latencies)}"
              f"  missing: {len(missing)}")
        print(f"201 -> present in subscriber: p50 {p50:.2f} ms  p99 {p99:.2f} ms"
              f"  max {latencies[-1]:.2f} ms")
        # Negative: the other process had the instance before the caller had its 201
        # (the delta is published on commit, before the response is written).
        print(f"signed (present - 201): min {raw[0]:.2f} ms  median {statistics.median(raw):.2f}"
              f" ms  max {raw[-1]:.2f} ms")

        per_thread = args.heartbeats // 8

        def beat(worker: int) -> int:
            sent = 0
            with httpx.Client(base_url=base, timeout=10) as c:
                for i in range(per_thread):
                    instance_id, token = agents[(worker * per_thread + i) % len(agents)]
                    r = c.post(f"/api/v1/instances/{instance_id}/heartbeat",
                               json={"cpu": 0.2, "memory": 0.3, "queue_depth": i % 5},
                               headers={"Authorization": f"Bearer {token}"})
                    r.raise_for_status()
                    sent += 1
            return sent

        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            total = sum(pool.map(beat, range(8)))
        elapsed = time.perf_counter() - started
        rate = total / elapsed
        print(f"heartbeats: {total} in {elapsed:.2f} s = {rate:.0f}/s (8 client threads, "
              "2 uvicorn workers, PostgreSQL + Redis)")
        print(f"registry_propagation p50_ms={p50:.2f} p99_ms={p99:.2f} heartbeats_per_s={rate:.0f}")
    finally:
        server.terminate()
        watcher.terminate()
        server.wait(timeout=10)
        watcher.wait(timeout=10)


if __name__ == "__main__":
    main()
