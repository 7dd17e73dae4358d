"""Scoring the matcher against a labelled set: shared by the test and the bench."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from routing.matcher import CapabilityText, IntentIndex


@dataclass
class Evaluation:
    total: int = 0
    hits: int = 0
    confusions: list[tuple[str, str, str]] = field(default_factory=list)  # request, want, got

    @property
    def hit_rate(self) -> float:
        return self.hits / self.total if self.total else 0.0


def load_catalogue(path: Path) -> list[CapabilityText]:
    return [
        CapabilityText(c["capability_id"], c.get("display_name", ""), c.get("description", ""),
                       tuple(c.get("keywords", ())), bool(c.get("directions")))
        for c in json.loads(path.read_text())
    ]


def load_requests(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def evaluate(index: IntentIndex, requests: list[dict]) -> Evaluation:
    """A hit is the expected capability ranked first, or the expected plan exactly."""
    result = Evaluation()
    for row in requests:
        match = index.match(row["request"])
        if "expected_plan" in row:
            want = " -> ".join(row["expected_plan"])
            got = " -> ".join(match.plan) if match.plan else (
                match.best.capability_id if match.best else "(none)")
        else:
            want = row["expected"]
            got = " -> ".join(match.plan) if match.plan else (
                match.best.capability_id if match.best else "(none)")
        result.total += 1
        if want == got:
            result.hits += 1
        else:
            result.confusions.append((row["request"], want, got))
    return result
