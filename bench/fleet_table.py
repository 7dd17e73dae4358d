"""What one gateway process pays for a fleet: the route table at N agents x 5 instances.

    .venv/bin/python bench/fleet_table.py [--agents 100,1000,10000]

In process, no servers: builds the wire form of a table of N agents (each with two
capabilities and five instances), then measures, per N, what a subscriber does:
loading it (``table_from_wire`` + indexes), the resident memory it adds, applying one
agent's delta, applying one heartbeat's load report, rebuilding the intent texts,
updating the intent index for one agent whose capability text changed (what
``IntentIndexHolder`` does per registration), and finding an agent by name (the chat
door). Figures are per process on this machine;
the growth with N is the point. Prints one ``fleet_table`` line per N.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this folder comes first on sys.path and bench/routing.py would
# shadow the routing package: the project first, bench/ nowhere.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from routing.router import IntentIndexHolder, capability_texts  # noqa: E402
from routing.table import (  # noqa: E402
    AgentEntry,
    CapabilityEntry,
    Delta,
    InstanceEntry,
    LoadReport,
    RouteTable,
    table_from_wire,
    table_to_json,
)

INSTANCES = 5


def fleet(n: int) -> RouteTable:
    agents = {}
    for a in range(1, n + 1):
        caps = tuple(CapabilityEntry(
            pk=a * 10 + c, capability_id=f"fleet.{a}.{c}", display_name=f"Agent {a} task {c}",
            description=f"Does task {c} for team {a % 97}: translate, summarise or classify.",
            keywords=("fleet", f"team-{a % 97}", f"task-{c}"),
            input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        ) for c in range(2))
        instances = tuple(InstanceEntry(pk=a * 100 + i, agent_pk=a,
                                        endpoint=f"http://127.0.0.1:{10000 + i}/a{a}/",
                                        lease_expires_at=2e9) for i in range(INSTANCES))
        agents[a] = AgentEntry(pk=a, namespace="default", name=f"fleet-agent-{a:05d}",
                               owner_tenant_pk=1, capabilities=caps, instances=instances)
    return RouteTable(version=1, agents=agents)


def timed(fn, repeat: int) -> float:
    """Median milliseconds of ``fn()``."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def intent_update_ms(table: RouteTable, some: AgentEntry, repeat: int) -> float:
    """Median milliseconds of the intent index's update after ``some`` changed its
    capabilities' description (the index built over ``table`` first, untimed)."""
    caps = tuple(replace(c, description=c.description + " Now also in French.")
                 for c in some.capabilities)
    other = table.apply(Delta(version=table.version + 1, kind="agent", op="upsert",
                              pk=some.pk, entry=replace(some, capabilities=caps)))
    holder = IntentIndexHolder()
    holder.update(table)
    tables = itertools.cycle((other, table))  # each update: that one agent changed
    # As a subscriber's tables tell it: that one agent is what changed.
    return timed(lambda: holder.update(next(tables), frozenset({some.pk})), repeat)


def measure(n: int) -> dict[str, float]:
    # As a subscriber gets it: the snapshot's bytes (or a reload's rows), decoded.
    data = table_to_json(fleet(n).indexed())
    gc.collect()
    started = time.perf_counter()
    table = table_from_wire(orjson.loads(data))
    load_s = time.perf_counter() - started
    del table
    gc.collect()
    tracemalloc.start()  # a second load, traced: what the table keeps, not the process
    table = table_from_wire(orjson.loads(data))
    gc.collect()
    table_mb = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    some = table.agents[n // 2]
    changed = replace(some, version="9.9.9")
    delta = Delta(version=table.version + 1, kind="agent", op="upsert", pk=some.pk,
                  entry=changed)
    report = LoadReport(agent_pk=some.pk, instance_pk=some.instances[0].pk, cpu=0.5,
                        memory=0.5, queue_depth=3, in_flight=1, lease_expires_at=2e9 + 1)
    name = some.name
    return {
        "agents": n,
        "load_s": round(load_s, 3),
        "table_mb": round(table_mb, 1),
        "delta_ms": round(timed(lambda: table.apply(delta), 5), 2),
        "heartbeat_us": round(timed(lambda: table.apply_load(report), 200) * 1000, 2),
        "intent_texts_ms": round(timed(lambda: capability_texts(table), 3), 1),
        "intent_update_ms": round(intent_update_ms(table, some, 5), 1),
        "by_name_us": round(timed(lambda: table.agents_by_name[name], 200) * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", default="100,1000,10000")
    args = parser.parse_args()
    for n in (int(x) for x in args.agents.split(",")):
        figures = measure(n)
        print("fleet_table " + " ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
