"""Routing at scale: decision latency, intent matching quality, and route-table memory.

    .venv/bin/python bench/routing.py [--agents 10000] [--instances 5] [--capabilities 2000]

Builds an in-memory route table of 10,000 agents x 5 instances offering 2,000
capability ids (each id offered by 5 agents), then times the router:
capability-id routing (filters, scores, priority, smooth weighted round robin)
and lexical intent routing (matching over 2,000 capability texts, then
routing). Prints the labelled set's hit rate with every confusion, and the
held-out set's if present. Prints figures; asserts nothing.

Last line: ``routing id_p50_us=<x> id_p99_us=<x> intent_p99_ms=<x> hit_rate=<x> table_mb=<x>``
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this folder comes first on sys.path, and bench/routing.py
# would shadow the routing package: put the project first, bench/ nowhere.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from routing.evaluation import evaluate, load_catalogue, load_requests  # noqa: E402
from routing.matcher import IntentIndex  # noqa: E402
from routing.router import IntentIndexHolder, Router, RouteRequest  # noqa: E402
from routing.table import AgentEntry, CapabilityEntry, InstanceEntry, RouteTable  # noqa: E402

DATA = ROOT / "tests" / "routing" / "data"
FILLER = ("fast", "reliable", "enterprise", "batch", "streaming", "secure", "regional",
          "v2", "beta", "premium", "低延迟", "高精度", "批量", "实时", "私有化")


def build_table(agents: int, instances: int, capabilities: int, seed: int = 7) -> RouteTable:
    rng = random.Random(seed)
    base = load_catalogue(DATA / "catalogue.json")
    pk = 0
    rows = {}
    for a in range(agents):
        cap_index = a % capabilities
        text = base[cap_index % len(base)]
        extra = " ".join(rng.sample(FILLER, 3))
        pk += 1
        cap = CapabilityEntry(
            pk=pk, capability_id=f"{text.capability_id}.{cap_index:04d}",
            display_name=text.display_name, description=f"{text.description} {extra}",
            keywords=text.keywords, input_schema={"type": "object"}, timeout_ms=30_000,
            version=f"1.{rng.randint(0, 9)}.0",
        )
        agent_pk = pk + 1
        pk += 1
        insts = []
        for _ in range(instances):
            pk += 1
            insts.append(InstanceEntry(
                pk=pk, agent_pk=agent_pk, endpoint=f"http://10.{a // 250}.{a % 250}.{pk % 250}/",
                cpu=rng.random() * 0.6, memory=rng.random() * 0.6,
                queue_depth=rng.randint(0, 20),
            ))
        rows[agent_pk] = AgentEntry(
            pk=agent_pk, namespace="default", name=f"agent-{a}", owner_tenant_pk=1 + a % 50,
            visibility="public", weight=rng.choice((50, 100, 200)), priority=1,
            capabilities=(cap,), instances=tuple(insts),
        )
    return RouteTable(version=1, agents=types.MappingProxyType(rows)).indexed()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--instances", type=int, default=5)
    parser.add_argument("--capabilities", type=int, default=2_000)
    parser.add_argument("--id-calls", type=int, default=20_000)
    parser.add_argument("--intent-calls", type=int, default=2_000)
    parser.add_argument("--embedder", default="lexical",
                        help="also score the labelled sets with this embedder (minilm needs "
                        "the semantic extra); the timed runs stay lexical")
    args = parser.parse_args()

    gc.collect()
    tracemalloc.start()
    table = build_table(args.agents, args.instances, args.capabilities)
    table_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    table_mb = table_bytes / 1e6
    print(f"table: {len(table.agents)} agents, "
          f"{sum(len(a.instances) for a in table.agents.values())} instances, "
          f"{len(table.agents_by_capability)} capability ids, {table_mb:.1f} MB")

    started = time.perf_counter()
    holder = IntentIndexHolder()
    holder.update(table)
    print(f"intent index over {len(table.agents_by_capability)} capability texts built in "
          f"{(time.perf_counter() - started) * 1000:.0f} ms")
    router = Router(index=holder)
    ids = list(table.agents_by_capability)
    rng = random.Random(1)

    for cid in ids:  # warm the per-table candidate cache, as a running gateway has it
        router.route(table, RouteRequest(tenant_pk=1, capability=cid))
    id_times = []
    for _ in range(args.id_calls):
        request = RouteRequest(tenant_pk=1, capability=rng.choice(ids))
        t0 = time.perf_counter_ns()
        decision = router.route(table, request)
        id_times.append((time.perf_counter_ns() - t0) / 1000)
        assert decision.chosen is not None
    id_p50, id_p99 = statistics.median(id_times), percentile(id_times, 0.99)
    print(f"capability-id routing: p50 {id_p50:.1f} us  p99 {id_p99:.1f} us "
          f"({args.id_calls} calls, 25 candidates each)")

    intents = [row["request"] for row in load_requests(DATA / "requests.jsonl")]
    intent_times = []
    for i in range(args.intent_calls):
        request = RouteRequest(tenant_pk=1, intent=intents[i % len(intents)])
        t0 = time.perf_counter_ns()
        router.route(table, request)
        intent_times.append((time.perf_counter_ns() - t0) / 1e6)
    intent_p50, intent_p99 = statistics.median(intent_times), percentile(intent_times, 0.99)
    print(f"lexical intent routing: p50 {intent_p50:.2f} ms  p99 {intent_p99:.2f} ms "
          f"({args.intent_calls} calls over {len(ids)} capability texts)")

    index = IntentIndex(load_catalogue(DATA / "catalogue.json"))
    labelled = evaluate(index, load_requests(DATA / "requests.jsonl"))
    print(f"labelled set: hit rate {labelled.hit_rate:.3f} ({labelled.hits}/{labelled.total}),"
          " lexical only")
    for request, want, got in labelled.confusions:
        print(f"  confusion: want {want}, got {got}: {request}")
    heldout_path = DATA / "heldout.jsonl"
    if heldout_path.exists():
        heldout = evaluate(index, load_requests(heldout_path))
        print(f"held-out set (written after tuning, never tuned on): hit rate "
              f"{heldout.hit_rate:.3f} ({heldout.hits}/{heldout.total})")
        for request, want, got in heldout.confusions:
            print(f"  held-out confusion: want {want}, got {got}: {request}")
    if args.embedder != "lexical":
        from routing.embedders import configured_embedder

        semantic = IntentIndex(load_catalogue(DATA / "catalogue.json"),
                               embedder=configured_embedder(args.embedder))
        for name in ("requests.jsonl", "heldout.jsonl"):
            if (DATA / name).exists():
                result = evaluate(semantic, load_requests(DATA / name))
                print(f"{name} with {args.embedder}: hit rate {result.hit_rate:.3f} "
                      f"({result.hits}/{result.total})")
    print(f"routing id_p50_us={id_p50:.1f} id_p99_us={id_p99:.1f} intent_p99_ms={intent_p99:.2f}"
          f" hit_rate={labelled.hit_rate:.3f} table_mb={table_mb:.1f}")


if __name__ == "__main__":
    main()
