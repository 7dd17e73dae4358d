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

import numpy as np

from routing.matcher import CALIBRATION_LEAD_CAP, CapabilityText, IntentIndex, Match

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
    # Per decision naming one capability (out-of-scope requests included): its
    # confidence, and whether it was right.
    sureness: list[tuple[float, bool]] = field(default_factory=list)

    def calibration_error(self, bins: int = 10) -> float:
        """Expected calibration error: the mean gap between confidence and the share
        right, over ten equal-width confidence bins weighted by their decisions."""
        if not self.sureness:
            return 0.0
        confidence = np.array([c for c, _ in self.sureness])
        right = np.array([r for _, r in self.sureness], dtype=float)
        which = np.minimum((confidence * bins).astype(int), bins - 1)
        return float(sum(abs(confidence[which == b].mean() - right[which == b].mean())
                         * (which == b).sum() for b in range(bins) if (which == b).any())
                     / len(confidence))

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
    return decided(index.match(text))


def decided(match: Match) -> tuple[str, ...]:
    if match.plan:
        return match.plan
    return (match.best.capability_id,) if match.best else ()


def evaluate(index: IntentIndex, rows: list[dict]) -> Report:
    report = Report()
    for row in rows:
        started = time.perf_counter()
        match = index.match(row["request"])
        got = decided(match)
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
        if len(got) == 1 and len(want) <= 1:
            report.sureness.append((match.confidence, got == want))
        if got != want:
            report.confusions.append((row["request"], " -> ".join(want) or "(refuse)",
                                      " -> ".join(got) or "(refused)"))
    return report


def fitted_calibration(index: IntentIndex, rows: list[dict]) -> tuple[float, float, float]:
    """``matcher.CALIBRATION``'s coefficients for ``index``'s matcher, fitted on ``rows``
    (the tuning set): a logistic regression of "the decision was right" on the best
    score (against the default threshold) and its capped lead, over every decision that
    names one capability, out-of-scope requests included. Newton's method, lightly
    regularised."""
    features, right = [], []
    for row in rows:
        match = index.match(row["request"])
        if match.plan or not match.ranked or row.get("expected_plan"):
            continue
        features.append((1.0, match.ranked[0].score - index.default_threshold,
                         min(match.margin, CALIBRATION_LEAD_CAP)))
        right.append(match.ranked[0].capability_id == row.get("expected"))
    x, y = np.array(features), np.array(right, dtype=float)
    w = np.zeros(3)
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-x @ w))
        gradient = x.T @ (p - y) + 1e-3 * w
        hessian = x.T @ (x * (p * (1 - p))[:, None]) + 1e-3 * np.eye(3)
        w -= np.linalg.solve(hessian, gradient)
    return float(w[0]), float(w[1]), float(w[2])

