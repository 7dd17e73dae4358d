"""Reverse-tunnel overhead: one SDK agent reached directly and through its tunnel.

    .venv/bin/python bench/tunnel_overhead.py [--samples 600]

Starts the platform's ASGI app on uvicorn (one process, embedded mode: SQLite control
plane, in-process bus and channel layer) and, in a second process, two copies of the same
SDK agent (``agent_reach.Agent``): ``bench-direct`` serves HTTP on a loopback port,
``bench-tunnel`` listens on no port and holds a WebSocket tunnel to the gateway. Both
register and heartbeat through the real control plane.

A client calls both through the gateway, interleaved (one call to each in turn, so
machine noise lands on both alike), at concurrency 1: a small JSON call and a streamed
call of four chunks (time to the last byte). The tunnel's cost is the difference:
``added = tunnel - direct`` at p50 and p99. All traffic stays on 127.0.0.1; the run is
bounded by ``--samples``. Prints figures, asserts nothing.

Last line: ``tunnel added_p50_ms=<x> added_p99_ms=<x>`` (JSON calls; the target is an
added p50 of at most 3 ms).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.gateway_overhead import wait_port  # noqa: E402
from bench.upstream_clients import free_port  # noqa: E402

HOST = "127.0.0.1"


def run_agents(platform: str, key: str) -> None:
    """The second process: the same agent twice, direct and tunnelled, until SIGTERM."""
    from agent_reach import Agent

    running = []
    for reach in ("direct", "tunnel"):
        agent = Agent(f"bench-{reach}", description="tunnel overhead bench")

        @agent.capability(f"bench.{reach}.echo")
        def echo(input, ctx):
            return {"echo": input}

        @agent.capability(f"bench.{reach}.words")
        def words(input, ctx):
            yield from ("one", "two", "three", "four")

        running.append(agent.start(platform=platform, key=key, reach=reach))
    print("agents ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    for each in running:
        each.stop()


def setup_platform(env: dict) -> tuple[str, str]:
    """Migrate and make a tenant with an invoke key and a register key (in this process)."""
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env,
                   check=True)
    os.environ.update(env)
    import django

    django.setup()
    from tenants.choices import ApiKeyScope
    from tenants.models import Tenant
    from tenants.services import api_key_create

    tenant = Tenant.objects.create(slug="bench", name="Bench")
    invoke = api_key_create(tenant=tenant, name="bench", scopes=[ApiKeyScope.INVOKE])
    manage = api_key_create(tenant=tenant, name="bench-agents",
                            scopes=[ApiKeyScope.READ, ApiKeyScope.MANAGE,
                                    ApiKeyScope.REGISTER])
    return invoke.plaintext, manage.plaintext


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=600)
    args = parser.parse_args()
    from cryptography.fernet import Fernet

    data_dir = Path(tempfile.mkdtemp(prefix="reach-tunnel-bench-"))
    env = {
        **os.environ, "DJANGO_SETTINGS_MODULE": "reach_platform.settings",
        "REACH_DATA_DIR": str(data_dir), "REACH_SECRET_KEY": "bench-" + uuid.uuid4().hex,
        "REACH_CREDENTIAL_KEYS": Fernet.generate_key().decode(), "REACH_LOG_LEVEL": "WARNING",
    }
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    port = free_port()
    base = f"http://{HOST}:{port}"
    invoke_key, agent_key = setup_platform(env)
    gateway = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--host", HOST, "--port", str(port),
         "--log-level", "warning", "--no-access-log", "--no-proxy-headers",
         "reach_platform.asgi:application"], cwd=ROOT, env=env)
    agents = None
    try:
        wait_port(port, gateway, "gateway")
        agents = subprocess.Popen([sys.executable, __file__, "--agents", base, agent_key],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        if agents.stdout.readline().strip() != "agents ready":
            raise SystemExit("the bench agents did not start")
        import httpx

        headers = {"Authorization": f"Bearer {invoke_key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=10) as http:
            def call(reach: str) -> float:
                started = time.perf_counter()
                reply = http.post("/v1/invoke", json={"capability": f"bench.{reach}.echo",
                                                      "input": {"text": "hello agent"}})
                took = (time.perf_counter() - started) * 1000
                if reply.status_code != 200:
                    raise RuntimeError(f"{reach}: {reply.status_code} {reply.text[:200]}")
                return took

            def stream(reach: str) -> float:
                started = time.perf_counter()
                with http.stream("POST", "/v1/invoke", json={
                        "capability": f"bench.{reach}.words", "stream": True,
                        "input": {}}) as reply:
                    body = reply.read()
                took = (time.perf_counter() - started) * 1000
                if reply.status_code != 200 or body.count(b"data:") < 4:
                    raise RuntimeError(f"{reach} stream: {reply.status_code} {body[:200]!r}")
                return took

            deadline = time.monotonic() + 30
            while True:  # both routable: the registrations reached the gateway's table
                try:
                    call("direct"), call("tunnel")
                    break
                except RuntimeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            for _ in range(50):  # warm-up: pools, caches
                call("direct"), call("tunnel"), stream("direct"), stream("tunnel")
            timings = {k: [] for k in ("direct", "tunnel", "direct_stream", "tunnel_stream")}
            for _ in range(args.samples):
                timings["direct"].append(call("direct"))
                timings["tunnel"].append(call("tunnel"))
                timings["direct_stream"].append(stream("direct"))
                timings["tunnel_stream"].append(stream("tunnel"))
    finally:
        for proc in (agents, gateway):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()

    print(f"samples per path: {args.samples} (interleaved, concurrency 1)")
    print(f"{'path':<16}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for name, values in timings.items():
        print(f"{name:<16}{percentile(values, 0.5):>10.2f}{percentile(values, 0.99):>10.2f}"
              f"{statistics.fmean(values):>10.2f}")
    added = {q: percentile(timings["tunnel"], q) - percentile(timings["direct"], q)
             for q in (0.5, 0.99)}
    added_stream = percentile(timings["tunnel_stream"], 0.5) - percentile(
        timings["direct_stream"], 0.5)
    print(f"stream (4 chunks, to the last byte) added p50: {added_stream:.2f} ms")
    print(f"tunnel added_p50_ms={added[0.5]:.2f} added_p99_ms={added[0.99]:.2f}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--agents":
        run_agents(sys.argv[2], sys.argv[3])
    else:
        main()
