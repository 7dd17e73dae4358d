"""What a call leaves behind for the people who run the platform, once, when it ends:
its Prometheus figures (by tenant, agent, capability and outcome, with the outcome's
reason) and one structured log line (``reach.calls``) with its four moments.

Called by the pipeline's metering step, so it covers exactly the calls that have a
usage event: the metrics' counts by outcome and the usage rows by outcome are the same
numbers. Every label comes from the route table, never from the request.
"""

from __future__ import annotations

import logging
import time

from gateway.calls import CallContext
from gateway.metrics import (
    AGENT_CALL_DURATION,
    AGENT_CALLS,
    AGENT_UPSTREAM_DURATION,
    INSTANCE_TRANSITIONS,
    INTENT_CALLS,
    STREAM_FIRST_BYTE,
)
from reach_core.kinds import reason_of
from reach_core.numbers import rounded

logger = logging.getLogger("reach.calls")

# Labelled children by label values: a lookup in prometheus_client costs a lock and a
# tuple each time; the label sets are closed (the route table), so they are kept.
_COUNTERS: dict[tuple, object] = {}
_TIMERS: dict[tuple, tuple] = {}


def agent_label(agent) -> str:
    return f"{agent.namespace}/{agent.name}" if agent is not None else ""


def record(ctx: CallContext, outcome: str) -> None:
    """Count, time and log one finished call. Never raises."""
    try:
        _record(ctx, str(outcome), time.monotonic())
    except Exception:  # observing must never fail a call
        logger.exception("could not record a call's metrics")


def _record(ctx: CallContext, outcome: str, returned: float) -> None:
    candidate = ctx.candidate
    agent = agent_label(candidate.agent) if candidate is not None else ""
    capability = candidate.capability.capability_id if candidate is not None \
        else ctx.capability_id or ""
    reason = reason_of(outcome)
    key = (ctx.tenant_slug, agent, capability, outcome)
    counter = _COUNTERS.get(key)
    if counter is None:
        counter = _COUNTERS[key] = AGENT_CALLS.labels(*key, str(reason))
    counter.inc()
    if ctx.intent:
        INTENT_CALLS.labels("hit" if outcome == "success" else str(reason)).inc()
    if candidate is not None:
        timers = _TIMERS.get((agent, capability))
        if timers is None:
            timers = _TIMERS[(agent, capability)] = (
                AGENT_CALL_DURATION.labels(agent, capability),
                AGENT_UPSTREAM_DURATION.labels(agent, capability),
                STREAM_FIRST_BYTE.labels(agent, capability))
        timers[0].observe(returned - ctx.started)
        if ctx.answered is not None and ctx.sent is not None:
            timers[1].observe(ctx.answered - ctx.sent)
        if ctx.first_byte is not None:
            timers[2].observe(ctx.first_byte - ctx.started)
    if logger.isEnabledFor(logging.INFO):
        _log(ctx, outcome, str(reason), agent, capability, returned)


def _log(ctx: CallContext, outcome: str, reason: str, agent: str, capability: str,
         returned: float) -> None:
    candidate = ctx.candidate

    def moment(at: float | None) -> float | None:
        # Epoch seconds to the microsecond: formatting four ISO dates cost more than the
        # rest of the line (the line's own "time" is ISO).
        return None if at is None else rounded(ctx.entered_at + (at - ctx.started), 6)

    call = {
        "event": "call", "request_id": ctx.request_id, "tenant": ctx.tenant_slug,
        "agent": agent or None, "capability": capability or None,
        "instance": candidate.instance.pk if candidate is not None else None,
        "outcome": outcome, "reason": reason,
        "entered_at": moment(ctx.started), "routed_at": moment(ctx.routed),
        "answered_at": moment(ctx.answered), "returned_at": moment(returned),
        "duration_ms": rounded((returned - ctx.started) * 1000, 3),
        "attempts": list(ctx.attempts), "retried": len(ctx.attempts) > 1,
        "route_score": rounded(candidate.score, 4) if candidate is not None else None,
        "intent": ctx.intent, "budget_ms": ctx.budget_ms or None,
    }
    where = f" {capability} via {agent} #{call['instance']}" if capability else ""
    logger.info("call %s%s in %.1f ms", outcome, where, call["duration_ms"],
                extra={"call": call})


class TransitionCounter:
    """Counts the instance state changes between consecutive route tables (a listener of
    the route-table subscriber): only the changed agents' instances are compared."""

    def __init__(self) -> None:
        self._previous = None

    def __call__(self, table) -> None:
        previous, self._previous = self._previous, table
        changed = table.changed_agents
        if previous is None or changed is None:
            return  # a whole table (the first, or a reload): no change to attribute
        for agent_pk in changed:
            before = previous.agents.get(agent_pk)
            after = table.agents.get(agent_pk)
            if before is None or after is None:
                continue
            was = {i.pk: i.state for i in before.instances}
            for instance in after.instances:
                old = was.get(instance.pk)
                if old is not None and old != instance.state:
                    INSTANCE_TRANSITIONS.labels(str(old), str(instance.state)).inc()
