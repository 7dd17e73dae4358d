"""Prometheus metrics of the data plane, served at ``/metrics``.

Several worker processes behind one port (``uvicorn --workers N``) share their figures
through ``PROMETHEUS_MULTIPROC_DIR`` (an empty directory per start of the server, set
before it starts): a scrape that reaches any worker then sums them all. Without it each
process answers its own.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry()
MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def exposition() -> bytes:
    """The text a scrape gets: this process's figures, or every worker's."""
    if not MULTIPROCESS:
        return generate_latest(REGISTRY)
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry)

CALLS = Counter(
    "reach_calls", "Calls through the gateway, by outcome.", ["endpoint", "outcome"],
    registry=REGISTRY,
)
LATENCY = Histogram(
    "reach_call_duration_seconds", "Gateway call latency, by outcome.", ["outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
UPSTREAM_LATENCY = Histogram(
    "reach_upstream_duration_seconds", "Time spent waiting for agents.", ["protocol"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
RETRIES = Counter("reach_retries", "Calls retried on another instance.", registry=REGISTRY)
BAD_RESPONSES = Counter(
    "reach_upstream_bad_responses",
    "Agent replies refused for breaking their protocol or output schema.", ["capability"],
    registry=REGISTRY,
)
BREAKERS = Gauge(
    "reach_breaker_open", "Instances whose circuit breaker is not closed (1 open, 0.5 half "
    "open).", ["instance"], registry=REGISTRY, multiprocess_mode="max",
)
TABLE_VERSION = Gauge("reach_route_table_version", "Route table version served (the "
                      "lowest of the workers').", registry=REGISTRY, multiprocess_mode="min")
USAGE_DROPPED = Counter("reach_usage_events_dropped",
                        "Usage events dropped because the hand-off queue was full.",
                        registry=REGISTRY)
ROUTE_FEEDBACK_DROPPED = Counter(
    "reach_route_feedback_dropped",
    "Route feedback events dropped because the hand-off queue was full.", registry=REGISTRY)
TOKENS = Counter("reach_tokens", "Tokens metered, by direction (input, output).",
                 ["direction"], registry=REGISTRY)
IDEMPOTENT_REPLAYS = Counter("reach_idempotent_replays",
                             "Calls answered from a stored first response.", registry=REGISTRY)
IDEMPOTENCY_DEGRADED = Counter(
    "reach_idempotency_degraded",
    "Idempotency records that could not be read or written because Redis was unreachable.",
    registry=REGISTRY,
)
LIMITS_DEGRADED = Counter(
    "reach_limits_degraded",
    "Rate-limit or budget checks decided by the fail-open/closed policy because Redis was "
    "unreachable.", registry=REGISTRY,
)

# ---- per call, labelled from the route table (never from the request) ------------------
# ``tenant`` is the tenant's slug, ``agent`` the agent's "namespace/name", ``capability``
# its id; a call that reached no capability has them empty. ``reason`` follows from
# ``outcome`` (reach_core.kinds.reason_of): the split of the reach success rate,
#   sum(rate(reach_agent_calls_total{reason="success"}))
#     / sum(rate(reach_agent_calls_total{reason!~"caller|cancelled"}))
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
AGENT_CALLS = Counter(
    "reach_agent_calls", "Metered calls (one per usage event), by tenant, agent, capability, "
    "outcome and its reason.", ["tenant", "agent", "capability", "outcome", "reason"],
    registry=REGISTRY,
)
AGENT_CALL_DURATION = Histogram(
    "reach_agent_call_duration_seconds", "Whole-call latency as the caller saw it.",
    ["agent", "capability"], buckets=_SECONDS, registry=REGISTRY,
)
AGENT_UPSTREAM_DURATION = Histogram(
    "reach_agent_upstream_duration_seconds",
    "From sending to the agent until its answer (headers) arrived.",
    ["agent", "capability"], buckets=_SECONDS, registry=REGISTRY,
)
STREAM_FIRST_BYTE = Histogram(
    "reach_stream_first_byte_seconds",
    "Streamed calls: from the call's arrival to its first event relayed to the caller.",
    ["agent", "capability"], buckets=_SECONDS, registry=REGISTRY,
)
INTENT_CALLS = Counter(
    "reach_intent_calls", "Calls that named an intent rather than a capability: served "
    "(hit) or not, and why (the route hit rate).", ["result"], registry=REGISTRY,
)
SHED = Counter("reach_shed", "Calls refused at once because the gateway was at its limit "
               "(503 overloaded, before authentication).", registry=REGISTRY)
TENANT_SHED = Counter("reach_tenant_shed", "Calls refused (429 too_many_requests) because "
                     "their tenant already held its share of the gateway's calls in flight "
                     "(REACH_GATEWAY_TENANT_SHARE).", ["tenant"], registry=REGISTRY)
BREAKER_TRIPS = Counter("reach_breaker_trips", "Circuit breakers that opened, by instance.",
                        ["instance"], registry=REGISTRY)
ROUTE_PROPAGATION = Histogram(
    "reach_route_propagation_seconds", "From a route-table change's commit to this gateway "
    "applying it (registration to routable).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=REGISTRY,
)
USAGE_BACKLOG = Gauge("reach_usage_backlog", "Usage events waiting in this gateway to be "
                      "shipped to the metering pipeline.", registry=REGISTRY,
                      multiprocess_mode="livesum")
INSTANCE_TRANSITIONS = Counter(
    "reach_instance_transitions", "Instance state changes this gateway applied (every "
    "gateway sees each one: aggregate with max, not sum). unknown -> healthy is a "
    "heartbeat false positive: an instance judged lapsed that was alive.",
    ["from_state", "to_state"], registry=REGISTRY,
)
TOOL_CALLS = Counter("reach_tool_calls", "Tool calls through the gateway, by tool and outcome.",
                     ["tool", "outcome"], registry=REGISTRY)
TOOL_CALL_DURATION = Histogram("reach_tool_call_duration_seconds", "Tool call latency.",
                               ["tool"], buckets=_SECONDS, registry=REGISTRY)
