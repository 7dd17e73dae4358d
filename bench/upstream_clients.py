"""Upstream HTTP client for the gateway: httpx vs aiohttp as a pass-through proxy.

    .venv/bin/python bench/upstream_clients.py [--duration 5]

Method. A mock agent (raw ASGI app on uvicorn, one process) answers ``POST /echo``
with a fixed ~200-byte JSON body. Two pass-through proxies, each a raw ASGI app on
uvicorn in its own single process, read the request body and forward it as
``POST`` to the mock agent, then return the upstream status and body:

* ``httpx``: one long-lived ``httpx.AsyncClient`` (64 connections, 64 keep-alive,
  5 s timeout), created lazily on the first request inside the running loop;
* ``aiohttp``: one long-lived ``aiohttp.ClientSession`` over
  ``TCPConnector(limit=64, keepalive_timeout=90, ttl_dns_cache=30)`` and a 5 s
  total timeout, created the same way; the body is read with ``await resp.read()``.

``wrk`` POSTs a small JSON body (via a Lua script) at concurrency 1 (``-t1 -c1``)
and 32 (``-t2 -c32``), first straight at the mock agent, then at each proxy,
started one at a time. Each target gets a short unreported warm-up so that
connection pools and lazily created clients exist before measuring. The table
gives req/s, p50 and p99 latency, throughput relative to the direct run and the
p50 latency each proxy adds. Every process shares this machine's cores with wrk,
so the figures compare the clients with each other, not with production.

All traffic stays on 127.0.0.1; every wait is bounded; servers are terminated in
``finally``. The servers are this same file re-invoked with ``--serve-agent`` or
``--serve-proxy {httpx,aiohttp}``. Prints figures; asserts nothing.

Last line: ``upstream_clients httpx_c32_ratio=<x> aiohttp_c32_ratio=<x>
httpx_c1_added_p50_ms=<x> aiohttp_c1_added_p50_ms=<x>``
"""

from __future__ import annotations

import argparse
import http.client
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
WARMUP_S = 1
CLIENTS = ("httpx", "aiohttp")
# (wrk threads, wrk connections) per measured run.
LOADS = ((1, 1), (2, 32))

REQUEST_BODY = '{"input":{"text":"hello agent","lang":"en"},"trace_id":"bench-0001"}'
# Fixed rather than echoed: the agent's own cost should be as small and constant as possible
# so that what differs between targets is the proxy.
AGENT_BODY = (
    b'{"status":"ok","agent":"mock-agent","capability":"echo","output":{"text":"hello agent",'
    b'"lang":"en","tokens":3},"usage":{"input_tokens":3,"output_tokens":3},'
    b'"latency_ms":0,"trace_id":"bench-0001"}'
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# --------------------------------------------------------------------------- servers


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def respond(send: Send, status: int, body: bytes) -> None:
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    })
    await send({"type": "http.response.body", "body": body})


async def lifespan(
    receive: Receive, send: Send, on_shutdown: Callable[[], Awaitable[None]] | None = None
) -> None:
    # Handled explicitly so uvicorn does not log "lifespan unsupported" and so that proxies
    # close their client on SIGTERM instead of warning about unclosed sessions.
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if on_shutdown is not None:
                await on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def agent_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    await read_body(receive)
    if scope["method"] == "POST" and scope["path"] == "/echo":
        await respond(send, 200, AGENT_BODY)
    else:
        await respond(send, 404, b'{"error":"not found"}')


class HttpxForwarder:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.client: Any = None

    async def forward(self, path: str, body: bytes) -> tuple[int, bytes]:
        import httpx

        if self.client is None:
            # Created here rather than at import: the client must belong to uvicorn's loop.
            # trust_env=False so an HTTP_PROXY in the environment cannot divert loopback
            # traffic; aiohttp ignores the environment by default, so this also keeps parity.
            self.client = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
                timeout=httpx.Timeout(5.0),
                trust_env=False,
            )
        resp = await self.client.post(
            self.upstream + path, content=body, headers={"content-type": "application/json"}
        )
        return resp.status_code, resp.content

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()


class AiohttpForwarder:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.session: Any = None

    async def forward(self, path: str, body: bytes) -> tuple[int, bytes]:
        import aiohttp

        if self.session is None:
            # Same lazy creation as httpx; the 5 s total timeout matches httpx.Timeout(5.0)
            # so neither client runs with looser (cheaper) timeout bookkeeping.
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=90, ttl_dns_cache=30),
                timeout=aiohttp.ClientTimeout(total=5.0),
            )
        async with self.session.post(
            self.upstream + path, data=body, headers={"content-type": "application/json"}
        ) as resp:
            return resp.status, await resp.read()

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


def make_proxy_app(client: str, upstream: str) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    forwarder = HttpxForwarder(upstream) if client == "httpx" else AiohttpForwarder(upstream)

    async def proxy_app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, forwarder.close)
            return
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        try:
            status, payload = await forwarder.forward(scope["path"], body)
        except Exception as exc:
            # A 502 shows up in wrk's non-2xx count, so a failing proxy cannot pass for a fast one.
            status, payload = 502, f'{{"error":"{type(exc).__name__}"}}'.encode()
        await respond(send, status, payload)

    return proxy_app


def serve(app: Callable[[Scope, Receive, Send], Awaitable[None]], port: int) -> None:
    import uvicorn

    # Same as `uvicorn --log-level warning --no-access-log`; loop and http stay "auto" so
    # uvloop and httptools are used when installed, as in the gateway's deployment.
    uvicorn.run(
        app, host=HOST, port=port, log_level="warning", access_log=False, lifespan="on"
    )


# --------------------------------------------------------------------------- driver


@dataclass
class Result:
    target: str
    connections: int
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int  # wrk socket errors plus non-2xx/3xx responses


def free_port() -> int:
    # Ask the kernel for a free port, then hand the number to uvicorn; the tiny race until
    # uvicorn binds it is acceptable on a loopback-only benchmark and readiness polling
    # would catch a clash.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def start_server(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args], stdin=subprocess.DEVNULL
    )


def wait_ready(proc: subprocess.Popen[bytes], port: int, name: str) -> None:
    """Poll with a real POST /echo: for a proxy this also proves the upstream path works."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last_error = "no attempt"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} before ready")
        conn = http.client.HTTPConnection(HOST, port, timeout=2.0)
        try:
            conn.request("POST", "/echo", body=REQUEST_BODY,
                         headers={"content-type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            if resp.status == 200:
                return
            last_error = f"HTTP {resp.status}"
        except OSError as exc:
            last_error = repr(exc)
        finally:
            conn.close()
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready within {READY_TIMEOUT_S:.0f} s: {last_error}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    # SIGTERM first so uvicorn runs lifespan shutdown and the clients close cleanly.
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_TIMEOUT_S)


UNIT_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3, "h": 3600e3}
PERCENTILE_RE = re.compile(r"^\s*(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m|h)\s*$", re.MULTILINE)


def parse_wrk(target: str, connections: int, out: str) -> Result:
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    percentiles = {
        int(m.group(1)): float(m.group(2)) * UNIT_MS[m.group(3)]
        for m in PERCENTILE_RE.finditer(out)
    }
    errors = 0
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if sock:
        errors += sum(int(g) for g in sock.groups())
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if non2xx:
        errors += int(non2xx.group(1))
    if rps is None or 50 not in percentiles or 99 not in percentiles:
        print(f"could not parse wrk output for {target} c{connections}:\n{out}", file=sys.stderr)
    return Result(
        target=target,
        connections=connections,
        rps=float(rps.group(1)) if rps else math.nan,
        p50_ms=percentiles.get(50, math.nan),
        p99_ms=percentiles.get(99, math.nan),
        requests=int(total.group(1)) if total else 0,
        errors=errors,
    )


def run_wrk(wrk: str, lua: Path, port: int, threads: int, connections: int,
            duration: int) -> str:
    cmd = [wrk, f"-t{threads}", f"-c{connections}", f"-d{duration}s", "--latency",
           "-s", str(lua), f"http://{HOST}:{port}/echo"]
    # wrk stops itself after -d; the timeout only guards against it hanging.
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=duration + 30, check=False
    )
    if proc.returncode != 0:
        print(f"wrk exited {proc.returncode}: {proc.stderr.strip()}", file=sys.stderr)
    return proc.stdout


def measure(wrk: str, lua: Path, port: int, target: str, duration: int) -> list[Result]:
    run_wrk(wrk, lua, port, 2, 32, WARMUP_S)
    results = []
    for threads, connections in LOADS:
        out = run_wrk(wrk, lua, port, threads, connections, duration)
        results.append(parse_wrk(target, connections, out))
    return results


def fmt(value: float, digits: int = 2) -> str:
    return "nan" if math.isnan(value) else f"{value:.{digits}f}"


def print_table(results: list[Result]) -> dict[tuple[str, int], tuple[float, float]]:
    direct = {r.connections: r for r in results if r.target == "direct"}
    derived: dict[tuple[str, int], tuple[float, float]] = {}
    header = (f"{'target':<8} {'conc':>4} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'ratio':>6} {'+p50 ms':>8} {'requests':>9} {'errors':>6}")
    print(header)
    print("-" * len(header))
    for r in results:
        base = direct.get(r.connections)
        ratio = r.rps / base.rps if base and base.rps > 0 else math.nan
        added = r.p50_ms - base.p50_ms if base else math.nan
        derived[(r.target, r.connections)] = (ratio, added)
        print(f"{r.target:<8} {r.connections:>4} {fmt(r.rps, 0):>10} {fmt(r.p50_ms, 3):>8} "
              f"{fmt(r.p99_ms, 3):>8} {fmt(ratio):>6} {fmt(added, 3):>8} "
              f"{r.requests:>9} {r.errors:>6}")
    return derived


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"python {platform.python_version()}"]
    for pkg in ("httpx", "aiohttp", "uvicorn", "uvloop", "httptools"):
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{pkg} absent")
    return ", ".join(parts)


def bench(duration: int) -> None:
    wrk = shutil.which("wrk")
    if wrk is None:
        sys.exit("wrk not found on PATH")
    print(f"{versions()}; {os.cpu_count()} CPUs shared by wrk, proxy and agent; "
          f"{duration} s per run")
    procs: list[subprocess.Popen[bytes]] = []
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        lua = Path(tmp) / "post.lua"
        lua.write_text(
            'wrk.method = "POST"\n'
            f"wrk.body = '{REQUEST_BODY}'\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
        try:
            agent_port = free_port()
            agent = start_server(["--serve-agent", "--port", str(agent_port)])
            procs.append(agent)
            wait_ready(agent, agent_port, "mock agent")
            results += measure(wrk, lua, agent_port, "direct", duration)

            for client in CLIENTS:
                port = free_port()
                proxy = start_server(["--serve-proxy", client, "--port", str(port),
                                      "--upstream", f"http://{HOST}:{agent_port}"])
                procs.append(proxy)
                try:
                    wait_ready(proxy, port, f"{client} proxy")
                    results += measure(wrk, lua, port, client, duration)
                finally:
                    # One proxy at a time: the other must not compete for CPU.
                    stop_server(proxy)
        finally:
            for proc in procs:
                stop_server(proc)

    print()
    derived = print_table(results)

    def key(target: str, conns: int, index: int) -> str:
        return fmt(derived.get((target, conns), (math.nan, math.nan))[index], 3)

    print()
    print(f"upstream_clients httpx_c32_ratio={key('httpx', 32, 0)} "
          f"aiohttp_c32_ratio={key('aiohttp', 32, 0)} "
          f"httpx_c1_added_p50_ms={key('httpx', 1, 1)} "
          f"aiohttp_c1_added_p50_ms={key('aiohttp', 1, 1)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    parser.add_argument("--serve-agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-proxy", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_agent:
        serve(agent_app, args.port)
    elif args.serve_proxy:
        serve(make_proxy_app(args.serve_proxy, args.upstream), args.port)
    else:
        bench(max(1, args.duration))


if __name__ == "__main__":
    main()
