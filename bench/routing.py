"""Intent routing: quality on the sealed set, and decision latency at 10,000 capabilities.

    .venv/bin/python bench/routing.py [--set sealed|dev|tuning] [--capabilities 10000]

Quality: the router (sentence encoder + words, the default) over the catalogue in
``tests/routing/data/eval/`` answers every request of one set — the sealed set unless
``--set`` names another — and the figures are printed: top-1 overall, by language and by
kind (answerable single-step requests; a refusal is a miss), plan accuracy (the exact
ordered plan, multi-step requests), refusals (out-of-scope requests refused), wrongly
refused (answerable requests refused), and per-request latency. The sealed set's
requests are never printed; ``--confusions`` prints the misses of the tuning or dev set.

Speed: a route table of 10,000 agents x 5 instances, each agent offering its own
capability id (texts varied from the catalogue's), then intent decisions through the
router: by words only (``intent_p99_ms``) and with the sentence encoder
(``semantic_p99_ms``, the request embedded once per decision). Also capability-id
routing. Prints figures; asserts nothing.

``--without-examples`` measures the catalogue without its examples, as capabilities
registered from descriptions are (the issue's independent evaluation registers them so).

Last line: ``routing sealed_top1=<x> sealed_zh=<x> sealed_en=<x> sealed_mixed=<x> plans=<x>
refusals=<x> wrongly_refused=<x> intent_p99_ms=<x> semantic_p99_ms=<x>`` (with another
``--set``, its name replaces ``sealed``).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this folder comes first on sys.path, and bench/routing.py
# would shadow the routing package: put the project first, bench/ nowhere.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from routing.embedders import configured_embedder  # noqa: E402
from routing.evaluation import (  # noqa: E402
    evaluate,
    fitted_calibration,
    load_catalogue,
    load_requests,
)
from routing.matcher import IntentIndex  # noqa: E402
from routing.router import IntentIndexHolder, Router, RouteRequest  # noqa: E402
from routing.table import AgentEntry, CapabilityEntry, InstanceEntry, RouteTable  # noqa: E402

EVAL = ROOT / "tests" / "routing" / "data" / "eval"
FILLER = ("fast", "reliable", "enterprise", "batch", "streaming", "secure", "regional",
          "v2", "beta", "premium", "低延迟", "高精度", "批量", "实时", "私有化")


def build_table(agents: int, instances: int, capabilities: int, seed: int = 7) -> RouteTable:
    rng = random.Random(seed)
    base = load_catalogue(EVAL / "catalogue.json")
    pk = 0
    rows = {}
    for a in range(agents):
        cap_index = a % capabilities
        text = base[cap_index % len(base)]
        extra = " ".join(rng.sample(FILLER, 3))
        pk += 1
        cap = CapabilityEntry(
            pk=pk, capability_id=f"{text.capability_id}.{cap_index:05d}",
            display_name=text.display_name, description=f"{text.description} {extra}",
            keywords=text.keywords, examples=text.examples, not_for=text.not_for,
            input_schema={"type": "object"}, timeout_ms=30_000,
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


def timed_intents(table: RouteTable, embedder, intents: list[str], calls: int) -> list[float]:
    started = time.perf_counter()
    holder = IntentIndexHolder(embedder=embedder)
    holder.update(table)
    print(f"  index over {len(table.agents_by_capability)} capability texts built in "
          f"{time.perf_counter() - started:.1f} s")
    router = Router(index=holder)
    out = []
    for i in range(calls):
        request = RouteRequest(tenant_pk=1, intent=intents[i % len(intents)])
        t0 = time.perf_counter_ns()
        router.route(table, request)
        out.append((time.perf_counter_ns() - t0) / 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", default="sealed", choices=("sealed", "dev", "tuning"))
    parser.add_argument("--confusions", action="store_true",
                        help="print the misses (tuning and dev sets only)")
    parser.add_argument("--capabilities", type=int, default=10_000)
    parser.add_argument("--instances", type=int, default=5)
    parser.add_argument("--intent-calls", type=int, default=1_000)
    parser.add_argument("--id-calls", type=int, default=20_000)
    parser.add_argument("--calibrate", action="store_true",
                        help="fit matcher.CALIBRATION on the tuning set, print it and stop")
    parser.add_argument("--without-examples", action="store_true",
                        help="the catalogue's capabilities without their examples: as "
                        "capabilities registered from descriptions are")
    args = parser.parse_args()

    encoder = configured_embedder("multilingual")
    if args.calibrate:
        tuning = load_requests(EVAL / "tuning.jsonl")
        for name, embedder in (("semantic", encoder), ("lexical", None)):
            fitted = fitted_calibration(
                IntentIndex(load_catalogue(EVAL / "catalogue.json"), embedder=embedder), tuning)
            print(f"{name}: " + ", ".join(f"{w:.3f}" for w in fitted))
        return
    catalogue = load_catalogue(EVAL / "catalogue.json")
    if args.without_examples:
        catalogue = [dataclasses.replace(c, examples=()) for c in catalogue]
    index = IntentIndex(catalogue, embedder=encoder)
    rows = load_requests(EVAL / f"{args.set}.jsonl")
    report = evaluate(index, rows)
    name = args.set
    print(f"{name} set: {len(rows)} requests over {len(catalogue)} capabilities"
          f"{' without their examples' if args.without_examples else ''}"
          " (router: sentence encoder + words)")
    print(f"  top-1 {report.top1.rate:.3f} ({report.top1.hits}/{report.top1.total})")
    for label, tallies in (("language", report.by_lang), ("kind", report.by_kind)):
        print(f"  by {label}: " + ", ".join(f"{k} {v.rate:.3f} ({v.hits}/{v.total})"
                                          for k, v in sorted(tallies.items())))
    print(f"  plans {report.plans.rate:.3f} ({report.plans.hits}/{report.plans.total}); "
          f"refusals {report.refusals.rate:.3f} ({report.refusals.hits}/{report.refusals.total});"
          f" wrongly refused {report.wrongly_refused.rate:.3f} "
          f"({report.wrongly_refused.hits}/{report.wrongly_refused.total})")
    right = sum(r for _, r in report.sureness) / max(1, len(report.sureness))
    confidence = sum(c for c, _ in report.sureness) / max(1, len(report.sureness))
    print(f"  confidence over {len(report.sureness)} decisions naming one capability: mean "
          f"{confidence:.3f}, right {right:.3f}, calibration error "
          f"{report.calibration_error():.3f}")
    print(f"  decision latency over {len(report.latencies_ms)} requests: p50 "
          f"{statistics.median(report.latencies_ms):.2f} ms, p99 {report.p99_ms():.2f} ms")
    if args.confusions and name != "sealed":
        for request, want, got in report.confusions:
            print(f"  want {want}, got {got}: {request}")

    agents = args.capabilities  # one capability id per agent
    table = build_table(agents, args.instances, args.capabilities)
    intents = [row["request"] for row in load_requests(EVAL / "tuning.jsonl")]
    print(f"route table: {len(table.agents)} agents x {args.instances} instances, "
          f"{len(table.agents_by_capability)} capability ids")
    router = Router(index=IntentIndexHolder())
    ids = list(table.agents_by_capability)
    rng = random.Random(1)
    for cid in ids:  # warm the per-table candidate cache, as a running gateway has it
        router.route(table, RouteRequest(tenant_pk=1, capability=cid))
    id_times = []
    for _ in range(args.id_calls):
        request = RouteRequest(tenant_pk=1, capability=rng.choice(ids))
        t0 = time.perf_counter_ns()
        router.route(table, request)
        id_times.append((time.perf_counter_ns() - t0) / 1000)
    print(f"capability-id routing: p50 {statistics.median(id_times):.1f} us, p99 "
          f"{percentile(id_times, 0.99):.1f} us")
    print("intent decisions by words only:")
    lexical = timed_intents(table, None, intents, args.intent_calls)
    print(f"  p50 {statistics.median(lexical):.2f} ms, p99 {percentile(lexical, 0.99):.2f} ms")
    print("intent decisions with the sentence encoder:")
    semantic = timed_intents(table, encoder, intents, args.intent_calls)
    print(f"  p50 {statistics.median(semantic):.2f} ms, p99 {percentile(semantic, 0.99):.2f} ms")
    lang = {k: v.rate for k, v in report.by_lang.items()}
    print(f"routing {name}_top1={report.top1.rate:.3f} {name}_zh={lang.get('zh', 0):.3f} "
          f"{name}_en={lang.get('en', 0):.3f} {name}_mixed={lang.get('mixed', 0):.3f} "
          f"plans={report.plans.rate:.3f} refusals={report.refusals.rate:.3f} "
          f"wrongly_refused={report.wrongly_refused.rate:.3f} "
          f"intent_p99_ms={percentile(lexical, 0.99):.2f} "
          f"semantic_p99_ms={percentile(semantic, 0.99):.2f}")


if __name__ == "__main__":
    main()
