"""Intent CPU fairness on an injected clock: who is served while other tenants flood.

    .venv/bin/python bench/intent_cpu_fairness.py [--seconds 60]

Drives ``gateway.intent_cpu.IntentCpu`` with the gateway's defaults (500 ms per second
per tenant, burst 500) and a schedule of decisions, each charged what it is said to
cost, in time order on a fake clock: so the figures are the rule's, whatever the machine
does. Attackers send 150 ms decisions (a 2,000-character intent on the sentence
encoder) as fast as they may (every 50 ms), or paced to one every 2.1 s; a victim sends
a 5 ms decision every 0.5 s (or 13 a second: helper-49's case) and an innocent tenant
one every 3 s. Prints, per scenario, the matching CPU admitted per second (what the
event loop spends on intents) and how many of the victim's and the innocent's decisions
were served. Asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from gateway.intent_cpu import IntentCpu  # noqa: E402
from reach_core.errors import ReachError  # noqa: E402

VICTIM, INNOCENT = 1, 2


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scenario(attackers: int, paced: bool, seconds: float,
             victim_period: float = 0.5) -> tuple[float, str, str]:
    clock = Clock()
    cpu = IntentCpu(ms_per_s=500, burst_ms=500, clock=clock)
    rng = random.Random(attackers)
    events = []
    for a in range(attackers):
        period = 2.1 if paced else 0.05
        t = rng.random() * period
        while t < seconds:
            events.append((t, 100 + a, 150.0))
            t += period
    for who, period, first in ((VICTIM, victim_period, 0.0), (INNOCENT, 3.0, 0.3)):
        t = first
        while t < seconds:
            events.append((t, who, 5.0))
            t += period
    events.sort()
    spent, served, asked = 0.0, {VICTIM: 0, INNOCENT: 0}, {VICTIM: 0, INNOCENT: 0}
    for when, who, ms in events:
        clock.now = when
        try:
            cpu.charge(cpu.check(who), ms)
        except ReachError:
            ok = False
        else:
            ok, spent = True, spent + ms
        if who in asked:
            asked[who] += 1
            served[who] += ok
    return (spent / seconds, f"{served[VICTIM]}/{asked[VICTIM]}",
            f"{served[INNOCENT]}/{asked[INNOCENT]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    print("attackers  paced  victim/s  matching ms/s  victim served  innocent served")
    for attackers, paced, period in ((0, False, 0.5), (1, False, 0.5), (2, False, 0.5),
                                     (6, False, 0.5), (12, False, 0.5), (12, True, 0.5),
                                     (40, True, 0.5), (1, False, 1 / 13), (2, False, 1 / 13)):
        rate, victim, innocent = scenario(attackers, paced, args.seconds, period)
        print(f"{attackers:9d}  {'yes' if paced else 'no':5s}  {1 / period:8.0f}  "
              f"{rate:13.0f}  {victim:>13s}  {innocent:>15s}")


if __name__ == "__main__":
    main()
