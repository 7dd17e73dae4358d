"""Metering: ingestion rate, and what limits + metering cost the gateway.

    .venv/bin/python bench/metering.py [--duration 5] [--events 20000]

Production mode on this machine's PostgreSQL and Redis (a scratch database,
a unique key prefix). Two figures:

1. Ingestion: ``--events`` usage events appended to the Redis stream, then
   drained by the metering consumer (``metering.ingest.usage_stream_consume``,
   what the Celery task runs) into PostgreSQL, exactly once. Events per second.
2. Gateway throughput with limits + metering on vs off: the same mock agent,
   one gateway process, wrk at concurrency 32. "On": the tenant has a quota and
   the capability a qps limit (a Redis token-bucket check per call), every call
   emits a usage event shipped to the Redis stream and adds to the budget
   counters, and the consumer drains the stream concurrently. "Off":
   ``bench/ungoverned_asgi.py``. The ratio on/off.

Prints figures, asserts nothing; traffic stays on 127.0.0.1, runs are bounded.
Last line: ``metering events_per_s=<x> on_off_ratio=<x>``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this folder comes first on sys.path, and bench/routing.py
# would shadow the routing package: put the project first, bench/ nowhere.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.gateway_overhead import lua, run_wrk, wait_port  # noqa: E402
from bench.upstream_clients import free_port, parse_wrk  # noqa: E402

HOST = "127.0.0.1"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=int, default=5)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--live-consumer", action="store_true",
                        help="also run the metering consumer during the 'on' run, on the "
                        "same two cores (production runs it on worker machines)")
    args = parser.parse_args()

    import psycopg
    from cryptography.fernet import Fernet

    database = "reach_bench_metering"
    with psycopg.connect(f"{args.pg}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {database}")
    prefix = f"reach-bench-{uuid.uuid4().hex[:6]}:"
    env = {
        **os.environ, "DJANGO_SETTINGS_MODULE": "reach_platform.settings",
        "DATABASE_URL": f"{args.pg}/{database}", "REDIS_URL": args.redis,
        "REACH_REDIS_KEY_PREFIX": prefix,
        "REACH_DATA_DIR": tempfile.mkdtemp(prefix="reach-bench-m-"),
        "REACH_SECRET_KEY": "bench-" + uuid.uuid4().hex,
        "REACH_CREDENTIAL_KEYS": Fernet.generate_key().decode(), "REACH_LOG_LEVEL": "WARNING",
    }
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                   check=True)
    os.environ.update(env)
    import django

    django.setup()
    import redis
    from django.db import close_old_connections

    from metering.ingest import STREAM, usage_stream_append, usage_stream_consume
    from metering.models import UsageEvent
    from registry.models import Capability
    from registry.services import agent_register
    from registry.spec import AgentSpec, CapabilitySpec
    from tenants.choices import ApiKeyScope
    from tenants.models import Quota, Tenant
    from tenants.services import api_key_create

    client = redis.Redis.from_url(args.redis)

    # 1. ingestion
    tenant = Tenant.objects.create(slug="bench", name="Bench")
    pipe = client.pipeline(transaction=False)
    for n in range(args.events):
        usage_stream_append(pipe, {
            "request_id": f"ingest-{n}", "tenant": tenant.pk, "agent": None,
            "capability": None, "instance": None, "outcome": "success",
            "input_tokens": 10, "output_tokens": 20, "cost": 0.001, "latency_ms": 5,
            "occurred_at": time.time()})
        if n % 1000 == 999:
            pipe.execute()
    pipe.execute()
    started = time.perf_counter()
    stored = 0
    while stored < args.events and time.perf_counter() - started < 300:
        stored += usage_stream_consume(client=client, consumer="bench", batch=1000,
                                       block_ms=100, max_batches=50)
    elapsed = time.perf_counter() - started
    events_per_s = stored / elapsed
    print(f"ingestion: {stored} events stream -> PostgreSQL in {elapsed:.2f} s = "
          f"{events_per_s:.0f} events/s (exactly once; rows {UsageEvent.objects.count()})")

    # 2. gateway throughput, governed on vs off
    agent_port = free_port()
    uvicorn = [sys.executable, "-m", "uvicorn", "--host", HOST, "--log-level", "warning",
               "--no-access-log", "--no-proxy-headers", "--no-server-header"]
    agent = subprocess.Popen([*uvicorn, "--port", str(agent_port),
                              "bench.gateway_overhead:agent_app"], cwd=ROOT, env=env)
    wait_port(agent_port, agent, "mock agent")
    registration = agent_register(tenant=tenant, spec=AgentSpec(
        name="bench-echo", endpoint=f"http://{HOST}:{agent_port}/",
        capabilities=(CapabilitySpec(capability_id="bench.echo", path="/echo",
                                     qps=1_000_000, burst=1_000_000),)))
    Quota.objects.create(tenant=tenant, requests_per_minute=60_000_000, burst=1_000_000,
                         monthly_requests=10**12)
    assert Capability.objects.filter(agent=registration.agent, qps__gt=0).exists()
    key = api_key_create(tenant=tenant, name="bench", scopes=[ApiKeyScope.INVOKE]).plaintext
    script = lua("/v1/invoke", '{"capability":"bench.echo","input":{"text":"hello"}}', key)

    stop = threading.Event()

    def consume() -> None:  # the metering worker, running beside the gateway
        while not stop.is_set():
            usage_stream_consume(client=client, consumer="bench-live", batch=500,
                                 block_ms=200, max_batches=20)
            close_old_connections()

    results = {}
    try:
        for label, app in (("off", "bench.ungoverned_asgi:application"),
                           ("on", "reach_platform.asgi:application")):
            port = free_port()
            gateway = subprocess.Popen([*uvicorn, "--port", str(port), app], cwd=ROOT,
                                       env=env)
            consumer = None
            try:
                wait_port(port, gateway, f"gateway ({label})")
                run_wrk(script, port, 2, 32, 1)
                if label == "on" and args.live_consumer:
                    consumer = threading.Thread(target=consume, daemon=True)
                    consumer.start()
                results[label] = parse_wrk(label, 32, run_wrk(script, port, 2, 32,
                                                              args.duration))
            finally:
                stop.set() if label == "on" else None
                if consumer is not None:
                    consumer.join(timeout=10)
                gateway.terminate()
                gateway.wait(timeout=10)
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    for label in ("off", "on"):
        r = results[label]
        print(f"gateway, limits + metering {label:3}: {r.rps:8.0f} req/s  p50 {r.p50_ms:.2f} ms"
              f"  p99 {r.p99_ms:.2f} ms  errors {r.errors}")
    ratio = results["on"].rps / results["off"].rps
    while usage_stream_consume(client=client, consumer="bench-after", batch=1000,
                               block_ms=100, max_batches=50):
        pass  # drain what the 'on' run produced
    metered = UsageEvent.objects.filter(tenant=tenant).exclude(
        request_id__startswith="ingest-").count()
    print(f"calls of the 'on' run metered, exactly once: {metered}; left in the stream: "
          f"{client.xlen(STREAM())}")
    for key_name in client.scan_iter(f"{prefix}*"):
        client.delete(key_name)
    print(f"metering events_per_s={events_per_s:.0f} on_off_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
