"""Scoring the matcher against labelled sets: shared by the tests and ``bench/routing.py``.

The protocol (``bench/README.md``): a catalogue of capabilities written as agent teams
write descriptors, and three request files — ``tuning`` (rules, weights and thresholds
are chosen on it), ``dev`` (checked while working, never tuned on row by row) and
``sealed`` (written by someone who had read neither the router nor the other files,
before any router change was tried on it; only its figures are ever printed).

A request row: ``{"request", "expected": id | null, "expected_plan"?: [ids], "lang":
"zh" | "en" | "mixed", "kind": "plain" | "colloquial" | "typo" | "params" | "indirect" |
"multi_step" | "out_of_scope"}``.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from routing.matcher import CapabilityText, IntentIndex

OUT_OF_SCOPE = "out_of_scope"
MULTI_STEP = "multi_step"


def load_catalogue(path: Path) -> list[CapabilityText]:
    """A catalogue file: descriptor-shaped capabilities (``tags`` count as keywords)."""
    return [
        CapabilityText(
            c["capability_id"], c.get("display_name", ""), c.get("description", ""),
            tuple(c.get("keywords", ())) + tuple(c.get("tags", ())), bool(c.get("directions")),
            examples=tuple(c.get("examples", ())), not_for=tuple(c.get("not_for", ())),
        )
        for c in json.loads(path.read_text())
    ]


def load_requests(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass
class Tally:
    hits: int = 0
    total: int = 0

    @property
    def rate(self) -> float:
        return self.hits / self.total if self.total else 0.0

    def add(self, hit: bool) -> None:
        self.total += 1
        self.hits += hit


@dataclass
class Report:
    """Figures over one set. ``top1`` is over answerable single-step requests; a refusal
    counts as a miss. ``plans`` is over multi-step requests (the exact ordered plan);
    ``refusals`` over out-of-scope ones; ``wrongly_refused`` over every answerable one."""

    top1: Tally = field(default_factory=Tally)
    by_lang: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    by_kind: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    plans: Tally = field(default_factory=Tally)
    refusals: Tally = field(default_factory=Tally)
    wrongly_refused: Tally = field(default_factory=Tally)
    confusions: list[tuple[str, str, str]] = field(default_factory=list)  # request, want, got
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        """Every row counted once: hit, right plan or right refusal."""
        total = self.top1.total + self.plans.total + self.refusals.total
        hits = self.top1.hits + self.plans.hits + self.refusals.hits
        return hits / total if total else 0.0

    def p99_ms(self) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


def answer(index: IntentIndex, text: str) -> tuple[str, ...]:
    """What the matcher decided, as ids: the plan, the best capability, or () refused."""
    match = index.match(text)
    if match.plan:
        return match.plan
    return (match.best.capability_id,) if match.best else ()


def evaluate(index: IntentIndex, rows: list[dict]) -> Report:
    report = Report()
    for row in rows:
        started = time.perf_counter()
        got = answer(index, row["request"])
        report.latencies_ms.append((time.perf_counter() - started) * 1000)
        kind = row.get("kind", "plain")
        if kind == OUT_OF_SCOPE or (row.get("expected") is None and not row.get("expected_plan")):
            want: tuple[str, ...] = ()
            report.refusals.add(got == ())
        else:
            want = tuple(row["expected_plan"]) if row.get("expected_plan") else (row["expected"],)
            report.wrongly_refused.add(got == ())
            if len(want) > 1:
                report.plans.add(got == want)
            else:
                hit = got[:1] == want and len(got) == 1
                report.top1.add(hit)
                report.by_lang[row.get("lang", "?")].add(hit)
                report.by_kind[kind].add(hit)
        if got != want:
            report.confusions.append((row["request"], " -> ".join(want) or "(refuse)",
                                      " -> ".join(got) or "(refused)"))
    return report
