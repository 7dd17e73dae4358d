"""The Grafana dashboard in the repository reads only metrics the gateway exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gateway.metrics import REGISTRY

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "agent-reach.json"


def exported_names() -> set[str]:
    names = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        for suffix in ("_total", "_bucket", "_sum", "_count", "_created"):
            names.add(family.name + suffix)
    return names


def test_every_panel_queries_metrics_the_gateway_exports():
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(expressions) >= 10
    used = {name for expr in expressions for name in re.findall(r"\breach_[a-z_]+", expr)}
    assert used and used <= exported_names(), used - exported_names()
    assert {"reach_agent_calls_total", "reach_agent_call_duration_seconds_bucket",
            "reach_route_propagation_seconds_bucket", "reach_breaker_trips_total",
            "reach_shed_total", "reach_usage_backlog"} <= used
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
