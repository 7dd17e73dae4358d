"""Gateway CPU per call as an instruction count: a figure that does not drift with the machine.

    .venv/bin/python bench/gateway_instructions.py [--calls 1500] [--python PATH ...]

``bench/gateway_overhead.py`` reads CPU time, and on a shared 2-core machine that moved
by a third within one session (another tenant of the host): a change of a few per cent
cannot be seen in it, even interleaved. valgrind's callgrind counts the instructions
the gateway process executes, and that count is the same whatever else the machine is
doing. It is not time (a cache miss costs no instruction), so it ranks changes to the
call path rather than predicting microseconds.

The same embedded platform as ``gateway_overhead.py`` (SQLite control plane, the mock
OpenAI-compatible agent, a tenant key, limits and a monthly budget on): the gateway runs
under ``valgrind --tool=callgrind`` with instrumentation off while it starts; a caller
sends warm-up calls, then the count runs over ``--idle-s`` seconds with no calls and
over ``--calls`` sequential kept-alive calls. Under valgrind a call takes some 50x its
usual time, so the gateway's own timers (the load shedder's 10 ms tick, the route
table's check) run 50x more often per call than in service: their rate, taken from the
idle window, is subtracted (the load shedder's lag watch is off for this reason: see
``main``). Each ``--python`` interpreter (default: this one) is measured in turn against
the same agent and database, which compares interpreter builds (``--python
/usr/bin/python3.11`` beside a virtualenv's) with everything else equal.

Needs valgrind (``apt-get install valgrind``). Last line, for the first interpreter:
``gateway_instructions per_call=<x> idle_per_s=<x>``.
"""

from __future__ import annotations

import argparse
import http.client
import json
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
    CHAT_PATH,
    HOST,
    setup_platform,
    stop,
    wait_port,
)
from bench.upstream_clients import free_port  # noqa: E402

CALL = json.dumps({"capability": "bench.chat", "input": {"messages": [
    {"role": "user", "content": "hello agent"}]}})


def calls(port: int, key: str, count: int) -> None:
    """``count`` calls one after another on one kept-alive connection; each must be 200."""
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        for _ in range(count):
            connection.request("POST", "/v1/invoke", CALL, {
                "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
            reply = connection.getresponse()
            body = reply.read()
            if reply.status != 200:
                raise SystemExit(f"the gateway answered {reply.status}: {body[:300]!r}")
    finally:
        connection.close()


def control(pid: int, *args: str) -> None:
    subprocess.run([shutil.which("callgrind_control") or "callgrind_control", *args, str(pid)],
                   check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)


def total(path: Path) -> int:
    """The instruction total of one callgrind dump."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def measure(python: str, env: dict, key: str, n_calls: int, idle_s: float,
            out: Path) -> tuple[float, float]:
    """(instructions per call net of the idle rate, idle instructions per second)."""
    port = free_port()
    gateway = subprocess.Popen(
        [shutil.which("valgrind") or "valgrind", "--tool=callgrind", "--instr-atstart=no",
         "--separate-threads=yes",
         f"--callgrind-out-file={out}", python, "-m", "uvicorn", "--host", HOST, "--port",
         str(port), "--log-level", "warning", "--no-access-log", "--no-proxy-headers",
         "--no-server-header", "--http",
         "reach_platform.http_protocol:GuardedHttpToolsProtocol",
         "reach_platform.asgi:application"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, gateway, "gateway under valgrind", timeout_s=900)
        calls(port, key, 300)  # warm: pools, caches, the interpreter's specialisation
        control(gateway.pid, "--zero")
        control(gateway.pid, "--instr=on")
        started = time.monotonic()
        time.sleep(idle_s)  # the idle window: what timers cost per second
        idle_wall = time.monotonic() - started
        control(gateway.pid, "--dump=idle")
        started = time.monotonic()
        calls(port, key, n_calls)
        load_wall = time.monotonic() - started
        control(gateway.pid, "--dump=load")
        control(gateway.pid, "--instr=off")
    finally:
        stop(gateway, timeout=60)
    # The event loop's thread only (``-01``): the calls run there. The others are the
    # executor's threads, where the route table's version check (every 2 s, a database
    # query) runs: work by the clock, and under a busy machine's stretched wall time
    # it moved the all-threads figure by 7 %.
    idle = total(out.parent / f"{out.name}.1-01")
    load = total(out.parent / f"{out.name}.2-01")
    rate = idle / idle_wall
    return (load - rate * load_wall) / n_calls, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--python", action="append",
                        help="interpreter(s) to run the gateway with (default: this one); "
                        "each needs the project's packages importable")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is needed: apt-get install -y valgrind")
    pythons = args.python or [sys.executable]

    from cryptography.fernet import Fernet

    data_dir = Path(tempfile.mkdtemp(prefix="reach-gw-instr-"))
    env = {
        **os.environ, "DJANGO_SETTINGS_MODULE": "reach_platform.settings",
        "REACH_DATA_DIR": str(data_dir), "REACH_SECRET_KEY": "bench-" + uuid.uuid4().hex,
        "REACH_CREDENTIAL_KEYS": Fernet.generate_key().decode(), "REACH_LOG_LEVEL": "WARNING",
        # The loop-lag watch off: under valgrind the loop lags 50x, so the watch's work
        # while calls run is not its work while idle, and its subtraction would be off
        # (with it on, two runs differed by 4 %; with it off, by 0.01 %). It costs
        # nothing per call; the limit it would cut is not reached by one caller.
        "REACH_GATEWAY_MAX_LOOP_LAG_MS": "0",
    }
    for name in ("DATABASE_URL", "REDIS_URL"):
        env.pop(name, None)
    agent_port = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "uvicorn", "--host", HOST, "--port",
                              str(agent_port), "--log-level", "warning", "--no-access-log",
                              *AGENT_APPS["openai"]], cwd=ROOT, env=env)
    results = []
    try:
        wait_port(agent_port, agent, "mock agent")
        key = setup_platform(env, agent_port)
        print(f"agent: openai mock at {HOST}:{agent_port}{CHAT_PATH}; {args.calls} calls "
              f"per interpreter, idle window {args.idle_s:g} s")
        for python in pythons:
            build = subprocess.run(
                [python, "-c", "import sys, sysconfig; print(sys.version.split()[0], "
                 "sysconfig.get_config_var('OPT'))"],
                capture_output=True, text=True, check=True).stdout.strip()
            per_call, idle = measure(python, env, key, args.calls, args.idle_s,
                                     data_dir / "callgrind.out")
            for dump in data_dir.glob("callgrind.out*"):
                dump.unlink()
            results.append((python, per_call, idle))
            print(f"{python} ({build}): {per_call:,.0f} instructions per call "
                  f"(timers while idle: {idle / 1e6:.1f} M/s under valgrind)")
    finally:
        stop(agent)
    for python, per_call, _ in results[1:]:
        print(f"{python} ÷ {results[0][0]}: {per_call / results[0][1]:.3f}")
    print(f"gateway_instructions per_call={results[0][1]:.0f} idle_per_s={results[0][2]:.0f}")


if __name__ == "__main__":
    main()
