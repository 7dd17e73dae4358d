"""Prometheus metrics of the data plane, served at ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

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
    "open).", ["instance"], registry=REGISTRY,
)
TABLE_VERSION = Gauge("reach_route_table_version", "Route table version served.",
                      registry=REGISTRY)
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
