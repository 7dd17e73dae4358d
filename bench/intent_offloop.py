"""Another tenant's calls while one tenant floods long intents: matching on the event
loop against matching in its own thread, in one run.

    .venv/bin/python bench/intent_offloop.py [--seconds 8] [--attackers 8]

One gateway in process (the multilingual sentence encoder, the scripted agent on
loopback), each tenant within the default share of intent CPU (500 ms a second). The
attacker, tenant acme, keeps ``--attackers`` dry runs of unique 1,500-character
intents in flight; most get 429 once its share is spent, the admitted ones cost some
25–100 ms of matching each. The victim, tenant globex, sends one capability-named call
after another, and a short dry run now and then. Printed per mode: the victim's call
latency (p50, p99, max), its dry runs' p50, and the attacker's admitted matches. The
figure to read is the ratio of the victim's p99 between the modes; absolute times
depend on the machine. The last line is machine-readable.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from gateway.intent_cpu import IntentCpu  # noqa: E402
from routing.embedders import configured_embedder  # noqa: E402
from routing.router import IntentIndexHolder, Router  # noqa: E402
from tests.support.inprocess import (  # noqa: E402
    in_process,
    start_scripted_agent,
    stop_process,
    two_tenants,
)
from tests.support.servers import free_port  # noqa: E402

HAN = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]


class OnLoop:
    """The earlier way: the match in the event loop's own step, charged its wall time."""

    def __init__(self, cpu: IntentCpu) -> None:
        self.cpu = cpu

    async def run(self, tenant_pk: int, match):
        buckets = self.cpu.check(tenant_pk)
        started = time.perf_counter()
        try:
            return match()
        finally:
            self.cpu.charge(buckets, (time.perf_counter() - started) * 1000)

    def close(self) -> None:
        pass


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def one_mode(table, acme: str, globex: str, router: Router, *, on_loop: bool,
                   seconds: float, attackers: int, rng: random.Random) -> dict:
    async with in_process(table, acme, router=router) as gw:
        if on_loop:
            gw.app.pipeline.matching = OnLoop(gw.app.pipeline.intent_cpu)
        stop = time.monotonic() + seconds
        admitted = refused = 0

        def dry(key: str, intent: str):
            return gw.client.get("/v1/route", params={"intent": intent},
                                 headers={"Authorization": f"Bearer {key}"})

        async def attacker() -> None:
            nonlocal admitted, refused
            while time.monotonic() < stop:
                intent = "".join(rng.choice(HAN) for _ in range(1500))
                reply = await dry(acme, intent)
                if reply.status_code == 429:
                    refused += 1
                    await asyncio.sleep(0.02)
                else:
                    admitted += 1

        named: list[float] = []
        dries: list[float] = []

        async def victim() -> None:
            n = 0
            while time.monotonic() < stop:
                started = time.perf_counter()
                if n % 10 == 9:
                    # The scripted capabilities have no descriptions: no match is an
                    # answer too; what is measured is how long it took.
                    reply = await dry(globex, "echo back what I send")
                    dries.append((time.perf_counter() - started) * 1000)
                    assert reply.status_code in (200, 404), reply.text
                else:
                    reply = await gw.client.post(
                        "/v1/invoke", json={"capability": "echo.all", "input": {}},
                        headers={"Authorization": f"Bearer {globex}"})
                    named.append((time.perf_counter() - started) * 1000)
                    assert reply.status_code == 200, reply.text
                n += 1
                await asyncio.sleep(0.005)

        await asyncio.gather(victim(), *(attacker() for _ in range(attackers)))
        return {"p50": statistics.median(named), "p99": pct(named, 0.99), "max": max(named),
                "dry_p50": statistics.median(dries), "admitted": admitted,
                "refused": refused, "calls": len(named)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--attackers", type=int, default=8)
    args = parser.parse_args()
    agent = start_scripted_agent(free_port())
    try:
        table, acme, globex = two_tenants(agent.endpoint)
        holder = IntentIndexHolder(embedder=configured_embedder("multilingual"))
        holder.update(table)
        router = Router(index=holder)
        # Warm the encoder and the scorer's caches, so neither mode pays for the first.
        from routing.router import RouteRequest

        for text in ("echo back what I send", "".join(random.Random(1).choices(HAN, k=1500))):
            router.route(table, RouteRequest(intent=text, tenant_pk=1), pick=False)
        results = {}
        for on_loop in (True, False):
            name = "on_loop" if on_loop else "off_loop"
            results[name] = r = asyncio.run(one_mode(
                table, acme, globex, router, on_loop=on_loop, seconds=args.seconds,
                attackers=args.attackers, rng=random.Random(7)))
            print(f"{name:9s} victim named call p50 {r['p50']:.2f} ms  p99 {r['p99']:.2f} ms  "
                  f"max {r['max']:.2f} ms ({r['calls']} calls); victim dry run p50 "
                  f"{r['dry_p50']:.2f} ms; attacker matches admitted {r['admitted']}, "
                  f"refused {r['refused']}")
    finally:
        stop_process(agent.proc)
    on, off = results["on_loop"], results["off_loop"]
    print(f"intent_offloop victim_p99_on_loop_ms={on['p99']:.2f} "
          f"victim_p99_off_loop_ms={off['p99']:.2f} p99_ratio={off['p99'] / on['p99']:.3f} "
          f"victim_max_on_loop_ms={on['max']:.2f} victim_max_off_loop_ms={off['max']:.2f} "
          f"victim_dry_p50_on_loop_ms={on['dry_p50']:.2f} "
          f"victim_dry_p50_off_loop_ms={off['dry_p50']:.2f}")


if __name__ == "__main__":
    main()
