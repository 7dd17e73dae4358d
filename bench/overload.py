"""Overload: one gateway process at 5x its sustainable load, open loop, then back at 1x.

    .venv/bin/python bench/overload.py [--seconds 60] [--after 30] [--service-ms 30]
        [--rate R] [--caps 64,128,256,512,1024,0] [--lags 0,20,50] [--generators 2]

Starts a loopback agent (a raw ASGI app on uvicorn that answers after an async
``--service-ms`` sleep and counts the replies it sent) and the platform's ASGI app
on uvicorn, one process, as deployed (embedded mode unless ``DATABASE_URL`` and
``REDIS_URL`` are set, then those: use a database of your own), with the agent
registered and a tenant key. Nothing in the gateway is switched off.

The load is open loop: ``--generators`` processes send requests at a constant
arrival rate whatever the answers do (a closed-loop client such as wrk slows down
with the server and hides overload). Each keeps up to ``--max-conns`` keep-alive
connections, one request outstanding on each; a request that finds every
connection busy is counted ``not_sent`` (the generator's bound, reported), one
unanswered after ``--client-timeout`` seconds is a client timeout. Latency is from
the scheduled send time, so a generator that falls behind shows up as latency, and
its own send lag and CPU are printed so that case can be told apart.

1. Sustainable load (unless ``--rate``): the unloaded p99 at ``--probe-rate``, then
   rising rates of ``--step-seconds`` each; sustainable is the highest at which every
   call succeeded with p99 within ``--slack`` x the unloaded p99.
2. For each cap in ``--caps`` (``REACH_GATEWAY_MAX_IN_FLIGHT``; 0 means unlimited; by
   default only the configured one), and each lag bound in ``--lags``
   (``REACH_GATEWAY_MAX_LOOP_LAG_MS``, 0 off): a fresh gateway, ``--baseline`` s at 1x, 5x
   (``--factor``) for ``--seconds``, then 1x for ``--after`` seconds. Printed per run:
   status counts (200/429/503/504/other, client timeouts, connection errors, not
   sent), whether every 429/503 had Retry-After, p50/p99 of 200s during and after,
   the time until the per-second p99 stays within ``--slack`` x the baseline p99 with
   nothing but 200s, the gateway's and the agent's CPU (share of one core), and calls
   the agent answered that the client never got as a 200 (``lost``).

Everything is on 127.0.0.1 and bounded by the options. On a shared machine read the
ratios and counts, not absolute speeds. Last line per run:
``overload cap=<n> ok=<n> shed=<n> s504=<n> timeouts=<n> lost=<n> p99_during_ms=<x>
recovery_s=<x>``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this folder comes first on sys.path, and bench/routing.py
# would shadow the routing package: put the project first, bench/ nowhere.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from bench.gateway_overhead import cpu_seconds, wait_port  # noqa: E402
from bench.upstream_clients import free_port  # noqa: E402

HOST = "127.0.0.1"
TIMEOUT, CONN_ERROR, NOT_SENT = -1, -2, -3  # pseudo status codes of the generator

# ---- the agent --------------------------------------------------------------------------

SERVICE_S = float(os.environ.get("BENCH_SERVICE_MS", "30")) / 1000
REPLY = b'{"reply":"done","tokens":{"in":3,"out":5}}'
_answered = 0


async def agent_app(scope, receive, send) -> None:
    """An agent with a service time: an async sleep, then a small JSON reply.
    ``GET /_answered`` says how many replies it has sent."""
    global _answered
    if scope["type"] != "http":
        return
    if scope["path"] == "/_answered":
        body = str(_answered).encode()
    else:
        while (await receive()).get("more_body"):
            pass
        await asyncio.sleep(SERVICE_S)
        body = REPLY
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
    if body is REPLY:
        _answered += 1


# ---- the open-loop generator (a separate process) ---------------------------------------


class _Conn(asyncio.Protocol):
    """One keep-alive connection with at most one request outstanding."""

    __slots__ = ("buf", "dead", "gen", "phase", "sched", "transport")

    def __init__(self, gen: _Generator, sched: float, phase: int) -> None:
        self.gen, self.transport, self.buf = gen, None, bytearray()
        self.sched, self.phase, self.dead = sched, phase, False

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.sched is not None:
            transport.write(self.gen.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0:  # the gateway always sends a length for non-streamed replies
            self.gen.finish(self, CONN_ERROR, False)
            self.transport.close()
            return
        stop = head.find(b"\r\n", at + 17)
        length = int(head[at + 17:stop if stop > 0 else len(head)])
        if len(self.buf) < end + 4 + length:
            return
        status, code = int(head[9:12]), ""
        if status != 200:  # the error code: overloaded, upstream_busy, ...
            body = bytes(self.buf[end + 4:end + 4 + length])
            at = body.find(b'"code":"')
            code = body[at + 8:body.find(b'"', at + 8)].decode() if at >= 0 else "?"
        del self.buf[:end + 4 + length]
        self.gen.finish(self, status, b"\r\nretry-after:" in head, code)
        if b"\r\nconnection: close" in head:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.dead = True
        if self.sched is not None:
            self.gen.finish(self, CONN_ERROR, False)
        self.gen.forget(self)


class _Generator:
    def __init__(self, port: int, request: bytes, max_conns: int, timeout_s: float) -> None:
        self.port, self.request = port, request
        self.max_conns, self.timeout_s = max_conns, timeout_s
        self.idle: deque[_Conn] = deque()
        self.busy: set[_Conn] = set()
        self.conns = 0
        # (phase, scheduled s from start, latency ms, status, retry_after)
        self.records: list[tuple] = []
        self.lags: list[float] = []
        self.start = 0.0

    def finish(self, conn: _Conn, status: int, retry_after: bool, code: str = "") -> None:
        if conn.sched is None:
            return
        self.records.append((conn.phase, round(conn.sched - self.start, 4),
                             round((time.monotonic() - conn.sched) * 1000, 3), status,
                             retry_after, code))
        conn.sched = None
        self.busy.discard(conn)
        if not conn.dead:
            self.idle.append(conn)

    def forget(self, conn: _Conn) -> None:
        self.busy.discard(conn)
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)
        self.conns -= 1

    def dispatch(self, loop, sched: float, phase: int) -> None:
        while self.idle:
            conn = self.idle.pop()
            if conn.dead:
                continue
            conn.sched, conn.phase = sched, phase
            self.busy.add(conn)
            conn.transport.write(self.request)
            return
        if self.conns >= self.max_conns:
            self.records.append((phase, round(sched - self.start, 4), 0.0, NOT_SENT, False, ""))
            return
        conn = _Conn(self, sched, phase)
        self.conns += 1
        self.busy.add(conn)
        loop.create_task(self._connect(loop, conn))

    async def _connect(self, loop, conn: _Conn) -> None:
        try:
            await loop.create_connection(lambda: conn, HOST, self.port)
        except OSError:
            conn.dead = True
            self.gen_failed(conn)

    def gen_failed(self, conn: _Conn) -> None:
        self.finish(conn, CONN_ERROR, False)
        self.busy.discard(conn)
        self.conns -= 1

    async def sweep(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            cutoff = time.monotonic() - self.timeout_s
            for conn in [c for c in self.busy if c.sched is not None and c.sched < cutoff]:
                self.finish(conn, TIMEOUT, False)
                conn.dead = True
                if conn.transport is not None:
                    conn.transport.abort()

    async def run(self, start_epoch: float, phases: list[tuple[float, float]]) -> None:
        loop = asyncio.get_running_loop()
        self.start = time.monotonic() + (start_epoch - time.time())
        await asyncio.sleep(max(0.0, self.start - time.monotonic()))
        sweeper = loop.create_task(self.sweep())
        phase_start = self.start
        for index, (rate, seconds) in enumerate(phases):
            total, sent = int(rate * seconds), 0
            while sent < total:
                now = time.monotonic()
                due = min(total, int((now - phase_start) * rate) + 1)
                while sent < due:
                    sched = phase_start + sent / rate
                    if sent % 64 == 0:
                        self.lags.append(now - sched)
                    self.dispatch(loop, sched, index)
                    sent += 1
                await asyncio.sleep(0.001)
            phase_start += seconds
        deadline = time.monotonic() + self.timeout_s + 1
        while self.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        sweeper.cancel()


def generate(args) -> None:
    """The generator process: runs the phases, writes its records as JSON to --out."""
    import uvloop

    body = b'{"capability":"bench.work","input":{"text":"hello agent"}}'
    request = (f"POST /v1/invoke HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer "
               f"{args.key}\r\nContent-Type: application/json\r\nContent-Length: "
               f"{len(body)}\r\n\r\n").encode() + body
    phases = [(float(r), float(s)) for r, s in (p.split("x") for p in args.phases.split(","))]
    gen = _Generator(args.port, request, args.max_conns, args.client_timeout)
    started = time.monotonic()
    uvloop.run(gen.run(args.start, phases))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    lags = sorted(gen.lags) or [0.0]
    Path(args.out).write_bytes(orjson.dumps({
        "records": gen.records, "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": time.monotonic() - started,
        "lag_p99_ms": lags[int(len(lags) * 0.99)] * 1000, "max_conns_used": gen.conns,
    }))


# ---- the driver ---------------------------------------------------------------------------


class Platform:
    """The agent, the control-plane setup, and gateway processes started on demand."""

    def __init__(self, args) -> None:
        from cryptography.fernet import Fernet

        self.args = args
        data_dir = Path(tempfile.mkdtemp(prefix="reach-overload-"))
        self.env = {
            **os.environ, "DJANGO_SETTINGS_MODULE": "reach_platform.settings",
            "REACH_DATA_DIR": str(data_dir), "REACH_SECRET_KEY": "bench-" + uuid.uuid4().hex,
            "REACH_CREDENTIAL_KEYS": Fernet.generate_key().decode(),
            "REACH_LOG_LEVEL": "WARNING", "BENCH_SERVICE_MS": str(args.service_ms),
        }
        if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
            for name in ("DATABASE_URL", "REDIS_URL"):
                self.env.pop(name, None)
        self.mode = "redis" if self.env.get("REDIS_URL") else "embedded"
        self.uvicorn = [sys.executable, "-m", "uvicorn", "--host", HOST, "--log-level",
                        "warning", "--no-access-log", "--no-proxy-headers",
                        "--no-server-header"]
        self.agent_port = free_port()
        self.agent = subprocess.Popen([*self.uvicorn, "--port", str(self.agent_port),
                                       "bench.overload:agent_app"], cwd=ROOT, env=self.env,
                                      stdout=subprocess.DEVNULL)
        self.gateway: subprocess.Popen | None = None
        self.port = 0
        try:
            wait_port(self.agent_port, self.agent, "agent")
            self.key = self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> str:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=self.env,
                       check=True)
        os.environ.update(self.env)
        import django

        django.setup()
        from registry.services import agent_register
        from registry.spec import AgentSpec, CapabilitySpec
        from tenants.choices import ApiKeyScope
        from tenants.models import Tenant
        from tenants.services import api_key_create

        slug = "overload-" + uuid.uuid4().hex[:8]
        tenant = Tenant.objects.create(slug=slug, name="Overload bench")
        agent_register(tenant=tenant, spec=AgentSpec(
            name=slug, endpoint=f"http://{HOST}:{self.agent_port}/",
            pool_max_connections=self.args.agent_conns,
            # No heartbeats in the bench: a lease that outlives it.
            lease_ttl_seconds=24 * 3600,
            capabilities=(CapabilitySpec(capability_id="bench.work", path="/work",
                                         timeout_ms=self.args.timeout_ms),)))
        return api_key_create(tenant=tenant, name="bench", scopes=[ApiKeyScope.INVOKE]).plaintext

    def start_gateway(self, cap: int | None, lag_ms: float | None = None) -> None:
        self.stop_gateway()
        env = dict(self.env)
        if cap is not None:
            env["REACH_GATEWAY_MAX_IN_FLIGHT"] = str(cap or 1_000_000_000)
        if lag_ms is not None:
            env["REACH_GATEWAY_MAX_LOOP_LAG_MS"] = str(lag_ms)
        self.port = free_port()
        self.gateway = subprocess.Popen([*self.uvicorn, "--port", str(self.port),
                                         "reach_platform.asgi:application"], cwd=ROOT, env=env,
                                        stdout=subprocess.DEVNULL)
        wait_port(self.port, self.gateway, "gateway")
        import httpx

        for _ in range(50):  # the route table arrives a moment after the port opens
            reply = httpx.post(f"http://{HOST}:{self.port}/v1/invoke",
                               json={"capability": "bench.work", "input": {"text": "x"}},
                               headers={"Authorization": f"Bearer {self.key}"}, timeout=10)
            if reply.status_code == 200:
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"the gateway does not answer the bench call: {reply.text}")
        self.load([(20, 2)])  # warm-up: pools, caches

    def stop_gateway(self) -> None:
        if self.gateway is not None and self.gateway.poll() is None:
            self.gateway.terminate()
            try:
                self.gateway.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.gateway.kill()
        self.gateway = None

    def answered(self) -> int:
        import httpx

        return int(httpx.get(f"http://{HOST}:{self.agent_port}/_answered").text)

    def load(self, phases: list[tuple[float, float]]) -> dict:
        """Run the phases (rate per second, seconds) from all generators at once; returns
        the merged records, the generators' figures and the gateway's CPU per second."""
        n = self.args.generators
        start = time.time() + 1.0
        outs = [tempfile.mkstemp(suffix=".json")[1] for _ in range(n)]
        spec = ",".join(f"{rate / n}x{seconds}" for rate, seconds in phases)
        procs = [subprocess.Popen(
            [sys.executable, str(Path(__file__)), "--generate", "--port", str(self.port),
             "--key", self.key, "--phases", spec, "--start", repr(start), "--out", out,
             "--max-conns", str(self.args.max_conns // n),
             "--client-timeout", str(self.args.client_timeout)], cwd=ROOT) for out in outs]
        cpu: list[tuple] = []  # (s from start, gateway cpu s, agent cpu s, gateway MB)
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError, AttributeError):
                    cpu.append((time.time() - start, cpu_seconds(self.gateway.pid),
                                cpu_seconds(self.agent.pid), rss_mb(self.gateway.pid)))
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        total = sum(s for _, s in phases)
        for proc in procs:
            proc.wait(timeout=total + self.args.client_timeout + 60)
        stop.set()
        sampler.join()
        records: list = []
        gens = []
        for out in outs:
            data = orjson.loads(Path(out).read_bytes())
            os.unlink(out)
            records.extend(data.pop("records"))
            gens.append(data)
        return {"records": records, "generators": gens, "cpu": cpu}

    def close(self) -> None:
        self.stop_gateway()
        if self.agent.poll() is None:
            self.agent.terminate()
            self.agent.wait(timeout=10)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def cpu_share(cpu: list, which: int, begin: float, end: float) -> float:
    """Share of one core the process used between two times (s from the load's start)."""
    inside = [c for c in cpu if begin <= c[0] <= end]
    if len(inside) < 2:
        return float("nan")
    return (inside[-1][which] - inside[0][which]) / (inside[-1][0] - inside[0][0])


def summary(records: list) -> dict:
    statuses = Counter(r[3] for r in records)
    codes = Counter(f"{r[3]} {r[5]}" for r in records if r[3] >= 300)
    ok = [r[2] for r in records if r[3] == 200]
    return {
        "n": len(records), "statuses": statuses, "codes": codes, "ok": len(ok),
        "p50": pct(ok, 0.5), "p99": pct(ok, 0.99),
        "retry_after_missing": sum(1 for r in records if r[3] in (429, 503) and not r[4]),
    }


def counts_line(s: dict) -> str:
    st = s["statuses"]
    other = sum(v for k, v in st.items() if k not in (200, 429, 503, 504, TIMEOUT, CONN_ERROR,
                                                      NOT_SENT))
    return (f"200={st[200]} 429={st[429]} 503={st[503]} 504={st[504]} other={other} "
            f"client_timeouts={st[TIMEOUT]} conn_errors={st[CONN_ERROR]} "
            f"not_sent={st[NOT_SENT]}"
            + "".join(f" [{code}: {n}]" for code, n in sorted(s["codes"].items())))


def step(platform: Platform, rate: float, seconds: float) -> dict:
    result = platform.load([(rate, seconds)])
    # The first second warms connections up: judge the rest.
    s = summary([r for r in result["records"] if r[1] >= 1.0])
    s["gen_lag_ms"] = max(g["lag_p99_ms"] for g in result["generators"])
    s["gw_cpu"] = cpu_share(result["cpu"], 1, 0, seconds)
    return s


def find_sustainable(platform: Platform, args) -> tuple[float, float]:
    """(sustainable rate, unloaded p99 ms)."""
    probe = step(platform, args.probe_rate, args.step_seconds)
    unloaded = probe["p99"]
    limit = unloaded * args.slack
    print(f"unloaded ({args.probe_rate:.0f}/s): p50 {probe['p50']:.1f} ms, p99 "
          f"{unloaded:.1f} ms; sustainable means every call 200 and p99 <= {limit:.1f} ms")

    def good(rate: float) -> bool:
        s = step(platform, rate, args.step_seconds)
        passed = s["ok"] == s["n"] and s["p99"] <= limit
        print(f"  {rate:7.0f}/s  p50 {s['p50']:7.1f}  p99 {s['p99']:7.1f} ms  "
              f"{counts_line(s)}  gateway cpu {s['gw_cpu']:.2f}  gen lag p99 "
              f"{s['gen_lag_ms']:.1f} ms  {'ok' if passed else 'over'}")
        return passed

    low, high = 0.0, None
    rate = args.start_rate
    while high is None and rate <= args.max_rate:
        if good(rate):
            low, rate = rate, rate * 1.5
        else:
            high = rate
    if high is None:
        print(f"  no limit found up to --max-rate {args.max_rate}")
        return low, unloaded
    for _ in range(3):
        mid = (low + high) / 2
        if good(mid):
            low = mid
        else:
            high = mid
    return low, unloaded


def overload_run(platform: Platform, args, cap: int | None, lag_ms: float | None,
                 rate: float) -> dict:
    platform.start_gateway(cap, lag_ms)
    answered_before = platform.answered()
    b, o, a = args.baseline, args.seconds, args.after
    result = platform.load([(rate, b), (rate * args.factor, o), (rate, a)])
    lost = platform.answered() - answered_before - sum(
        1 for r in result["records"] if r[3] == 200)
    records = result["records"]
    phases = [summary([r for r in records if r[0] == i and (i or r[1] >= 1.0)])
              for i in range(3)]
    base_p99 = phases[0]["p99"]
    limit = base_p99 * args.slack
    # Per-second windows after the overload: recovered from the first second after which
    # every window has only 200s and its p99 within the limit.
    windows: dict[int, list] = {}
    for r in records:
        if r[0] == 2:
            windows.setdefault(int(r[1] - b - o), []).append(r)
    recovery = None
    for second in sorted(windows, reverse=True):
        w = windows[second]
        if all(r[3] == 200 for r in w) and pct([r[2] for r in w], 0.99) <= limit:
            recovery = second
        else:
            break
    during_s = phases[1]
    shed = [r[2] for r in records if r[0] == 1 and r[3] in (429, 503)]
    return {
        "cap": cap, "lag_ms": lag_ms, "rate": rate, "phases": phases, "base_p99": base_p99,
        "limit": limit,
        "recovery_s": recovery if recovery is not None and recovery < len(windows)
        else None, "lost": lost,
        "goodput": during_s["ok"] / o, "shed_p99": pct(shed, 0.99),
        "gw_cpu": [cpu_share(result["cpu"], 1, 0, b), cpu_share(result["cpu"], 1, b, b + o),
                   cpu_share(result["cpu"], 1, b + o, b + o + a)],
        "agent_cpu": cpu_share(result["cpu"], 2, b, b + o),
        "rss_mb": max((c[3] for c in result["cpu"]), default=float("nan")),
        "generators": result["generators"],
    }


def run_label(run: dict) -> str:
    cap, lag = run["cap"], run["lag_ms"]
    label = "cap " + ("configured" if cap is None else "unlimited" if cap == 0 else str(cap))
    return label if lag is None else f"{label} lag_ms {lag:g}"


def report(run: dict, args) -> None:
    names = ("1x before", f"{args.factor:g}x", "1x after")
    label = run_label(run)
    print(f"\n== {label}: {run['rate']:.0f}/s, {args.factor:g}x = "
          f"{run['rate'] * args.factor:.0f}/s for {args.seconds:g} s, service {args.service_ms} ms")
    for name, s, cpu in zip(names, run["phases"], run["gw_cpu"], strict=True):
        print(f"  {name:10} n={s['n']:<7} {counts_line(s)}  200s p50 {s['p50']:.1f} "
              f"p99 {s['p99']:.1f} ms  gateway cpu {cpu:.2f}")
    missing = sum(s["retry_after_missing"] for s in run["phases"])
    verdict = "yes" if missing == 0 else f"NO ({missing} without)"
    print(f"  every 429/503 had Retry-After: {verdict}")
    print(f"  goodput during overload {run['goodput']:.0f}/s ({run['goodput'] / run['rate']:.2f}"
          f" x the 1x rate); shed answers p99 {run['shed_p99']:.1f} ms; agent cpu "
          f"{run['agent_cpu']:.2f}; gateway RSS peak {run['rss_mb']:.0f} MB")
    rec = run["recovery_s"]
    print(f"  p99 back within {args.slack:g} x baseline ({run['limit']:.1f} ms) after: "
          f"{'never within the after phase' if rec is None else f'{rec} s'}")
    print(f"  answered by the agent but not a 200 to the client (lost): {run['lost']}")
    gens = run["generators"]
    print("  generators: cpu " + ", ".join(f"{g['cpu_s'] / g['wall_s']:.2f}" for g in gens)
          + " of a core; send lag p99 " + ", ".join(f"{g['lag_p99_ms']:.1f}" for g in gens)
          + " ms; connections " + ", ".join(str(g["max_conns_used"]) for g in gens))
    during = run["phases"][1]
    st = during["statuses"]
    print(f"overload {label.replace(' ', '=')} ok={st[200]} shed={st[429] + st[503]} "
          f"s504={st[504]} "
          f"timeouts={st[TIMEOUT]} lost={run['lost']} p99_during_ms={during['p99']:.1f} "
          f"recovery_s={rec}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60, help="overload duration")
    parser.add_argument("--after", type=float, default=30, help="1x load after the overload")
    parser.add_argument("--baseline", type=float, default=10, help="1x load before it")
    parser.add_argument("--factor", type=float, default=5.0)
    parser.add_argument("--service-ms", type=int, default=30)
    parser.add_argument("--timeout-ms", type=int, default=5000, help="the capability's")
    parser.add_argument("--agent-conns", type=int, default=64, help="pool_max_connections")
    parser.add_argument("--rate", type=float, help="the sustainable rate (skips the search)")
    parser.add_argument("--caps", help="REACH_GATEWAY_MAX_IN_FLIGHT values, 0 = unlimited")
    parser.add_argument("--lags", help="REACH_GATEWAY_MAX_LOOP_LAG_MS values, 0 = off")
    parser.add_argument("--generators", type=int, default=2)
    parser.add_argument("--max-conns", type=int, default=6000, help="all generators together")
    parser.add_argument("--client-timeout", type=float, default=10.0)
    parser.add_argument("--slack", type=float, default=1.5)
    parser.add_argument("--probe-rate", type=float, default=20)
    parser.add_argument("--start-rate", type=float, default=100)
    parser.add_argument("--max-rate", type=float, default=20000)
    parser.add_argument("--step-seconds", type=float, default=6)
    # The generator process's own options.
    parser.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    parser.add_argument("--phases", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        generate(args)
        return

    # A SIGTERM (timeout, Ctrl-C from a supervisor) still stops the servers started here.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    platform = Platform(args)
    try:
        print(f"mode {platform.mode}, agent service {args.service_ms} ms, "
              f"{args.generators} generator processes, client timeout {args.client_timeout:g} s")
        rate = args.rate
        if rate is None:
            platform.start_gateway(None)
            rate, unloaded = find_sustainable(platform, args)
            print(f"sustainable: {rate:.0f}/s (unloaded p99 {unloaded:.1f} ms)")
        caps = [None] if not args.caps else [int(c) for c in args.caps.split(",")]
        lags = [None] if not args.lags else [float(v) for v in args.lags.split(",")]
        runs = [overload_run(platform, args, cap, lag, rate) for cap in caps for lag in lags]
        for run in runs:
            report(run, args)
        if len(runs) > 1:
            print(f"\n{'run':>22} {'1x shed':>8} {'goodput/s':>10} {'p99 200 ms':>11} "
                  f"{'504':>5} {'timeouts':>8} {'lost':>5} {'recovery s':>10} {'gw cpu':>6}")
            for run in runs:
                during, before = run["phases"][1], run["phases"][0]
                st = during["statuses"]
                shed_1x = before["statuses"][503] + run["phases"][2]["statuses"][503]
                print(f"{run_label(run):>22} {shed_1x:>8} {run['goodput']:>10.0f} "
                      f"{during['p99']:>11.1f} "
                      f"{st[504]:>5} {st[TIMEOUT]:>8} {run['lost']:>5} "
                      f"{run['recovery_s']!s:>10} {run['gw_cpu'][1]:>6.2f}")
    finally:
        platform.close()


if __name__ == "__main__":
    main()
