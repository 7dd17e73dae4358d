"""Gateway scale-out on cores: one worker process against two, in the production layout.

    .venv/bin/python bench/gateway_workers.py [--duration 5] [--connections 64]

The production layout (docs/production.md): PostgreSQL (a database of its own on the
machine's server, dropped afterwards), a Redis server of its own (started here on a
free port, so limits, budgets and idempotency are shared by the workers through it), and
``uvicorn reach_platform.gateway_asgi:application --workers N`` with
``PROMETHEUS_MULTIPROC_DIR``. The mock agent of ``bench/gateway_overhead.py`` is
registered with a tenant-wide rate limit far above the load and a monthly request
budget, so every call debits a Redis token bucket and reserves and settles a budget: the
state the workers share is exercised on each call.

wrk drives ``POST /v1/invoke`` at ``--connections`` for ``--duration`` seconds against
1 worker, then 2. Nothing is pinned: the point is what a second core buys, and wrk and
the agent share the two cores with the gateway (so 2.0x is out of reach here; on a
machine with cores to spare for them it is the bound). CPU per request is summed over
the worker processes. All traffic on 127.0.0.1; every run bounded.

Last line: ``gateway_workers w1_rps=<x> w2_rps=<x> scale=<x> w1_cpu_us=<x> w2_cpu_us=<x>``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.gateway_overhead import (  # noqa: E402
    AGENT_APPS,
    HOST,
    child_pids,
    cpu_seconds,
    lua,
    run_wrk,
    setup_platform,
    stop,
    wait_port,
)
from bench.upstream_clients import free_port, parse_wrk  # noqa: E402

PG_ADMIN = os.environ.get("REACH_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    redis_server = shutil.which("redis-server")
    if redis_server is None or shutil.which("wrk") is None:
        raise SystemExit("needs redis-server and wrk (apt-get install -y redis-server wrk)")
    import psycopg
    from cryptography.fernet import Fernet

    data_dir = Path(tempfile.mkdtemp(prefix="reach-workers-bench-"))
    database = f"reach_bench_{uuid.uuid4().hex[:8]}"
    redis_port, agent_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    try:
        redis = subprocess.Popen(
            [redis_server, "--port", str(redis_port), "--bind", HOST, "--save", "",
             "--appendonly", "no", "--dir", str(data_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(redis)
        wait_port(redis_port, redis, "redis")
        env = {
            **os.environ, "DJANGO_SETTINGS_MODULE": "reach_platform.settings",
            "REACH_DATA_DIR": str(data_dir), "REACH_SECRET_KEY": "bench-" + uuid.uuid4().hex,
            "REACH_CREDENTIAL_KEYS": Fernet.generate_key().decode(),
            "REACH_LOG_LEVEL": "WARNING",
            "DATABASE_URL": PG_ADMIN.rsplit("/", 1)[0] + f"/{database}",
            "REDIS_URL": f"redis://{HOST}:{redis_port}/0",
        }
        uvicorn = [sys.executable, "-m", "uvicorn", "--host", HOST, "--log-level", "warning",
                   "--no-access-log", "--no-proxy-headers", "--no-server-header"]
        agent = subprocess.Popen([*uvicorn, "--port", str(agent_port),
                                  *AGENT_APPS["openai"]], cwd=ROOT, env=env)
        procs.append(agent)
        wait_port(agent_port, agent, "mock agent")
        key = setup_platform(env, agent_port)
        script = lua("/v1/invoke", '{"capability":"bench.chat","input":{"messages":'
                     '[{"role":"user","content":"hello agent"}]}}', key)
        results = {}
        for workers in (1, 2):
            metrics_dir = Path(tempfile.mkdtemp(prefix="reach-prom-", dir=data_dir))
            port = free_port()
            gateway = subprocess.Popen(
                [*uvicorn, "--port", str(port), "--workers", str(workers), "--lifespan", "on",
                 "--http", "reach_platform.http_protocol:GuardedHttpToolsProtocol",
                 "reach_platform.gateway_asgi:application"], cwd=ROOT,
                env={**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)})
            try:
                wait_port(port, gateway, "gateway")
                deadline = time.monotonic() + 60
                while len(child_pids(gateway.pid)) < (workers if workers > 1 else 0):
                    if time.monotonic() > deadline:
                        raise SystemExit("the gateway's workers did not start")
                    time.sleep(0.1)
                run_wrk(script, port, 2, args.connections, 2)  # warm-up: every worker
                pids = [gateway.pid, *child_pids(gateway.pid)]
                before = sum(cpu_seconds(p) for p in pids)
                out = run_wrk(script, port, 2, args.connections, args.duration)
                used = sum(cpu_seconds(p) for p in pids) - before
                result = parse_wrk(f"w{workers}", args.connections, out)
                results[workers] = (result, used * 1e6 / max(1, result.requests))
            finally:
                stop(gateway, timeout=20)
        print(f"{'workers':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} "
              f"{'cpu us/req':>10}")
        for workers, (r, cpu) in results.items():
            print(f"{workers:>7} {r.rps:>9.0f} {r.p50_ms:>8.3f} {r.p99_ms:>8.3f} {r.errors:>6} "
                  f"{cpu:>10.0f}")
        (r1, c1), (r2, c2) = results[1], results[2]
        print(f"gateway_workers w1_rps={r1.rps:.0f} w2_rps={r2.rps:.0f} "
              f"scale={r2.rps / r1.rps:.2f} w1_cpu_us={c1:.0f} w2_cpu_us={c2:.0f}")
    finally:
        for proc in reversed(procs):
            stop(proc)
        from django.db import connections

        connections.close_all()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
