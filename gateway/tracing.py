"""OpenTelemetry traces of calls, named and attributed per the GenAI semantic conventions.

Off unless ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``: OTLP over HTTP, set up
by the standard ``OTEL_EXPORTER_OTLP_*`` variables; ``console``); ``OTEL_SERVICE_NAME``
and ``OTEL_RESOURCE_ATTRIBUTES`` describe the process. Off, a call costs one attribute
test here, and the caller's W3C ``traceparent``/``tracestate`` still travel to the agent
unchanged, so a trace the caller started goes on at the agent.

On, each call is a SERVER span (the caller's ``traceparent`` its parent) and each
upstream attempt a CLIENT span ``invoke_agent <agent>`` under it, whose context is what
the agent receives. Retries and breaker refusals are events on the call's span.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gateway.http_io import header
from reach_core.kinds import reason_of

if TYPE_CHECKING:
    from gateway.calls import CallContext

_tracer: Any = None  # an opentelemetry Tracer while tracing is on
_propagator: Any = None

SERVICE_NAME = "agent-reach-gateway"


class TracingMisconfigured(ValueError):
    pass


def configure_from_environment(environ=os.environ) -> bool:
    """Turn tracing on if ``OTEL_TRACES_EXPORTER`` asks for it; returns whether it did."""
    wanted = [name.strip().lower() for name in
              environ.get("OTEL_TRACES_EXPORTER", "none").split(",") if name.strip()]
    wanted = [name for name in wanted if name != "none"]
    if not wanted:
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME}
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in wanted:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            raise TracingMisconfigured(
                f"OTEL_TRACES_EXPORTER={name!r}: this gateway exports 'otlp' (over HTTP), "
                "'console' or 'none'.")
    use(provider)
    return True


def use(provider) -> None:
    """Trace with ``provider`` (a ``TracerProvider``), or stop tracing with None."""
    global _tracer, _propagator
    if provider is None:
        _tracer = _propagator = None
        return
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _tracer = provider.get_tracer("agent-reach.gateway")
    _propagator = TraceContextTextMapPropagator()


def call_started(ctx: CallContext, scope: dict) -> None:
    """The call's span, child of the caller's ``traceparent`` when it sent one (read on
    every call, traced or not: it travels to the agent either way)."""
    traceparent = header(scope, b"traceparent")
    if traceparent is not None:
        ctx.traceparent, ctx.tracestate = traceparent, header(scope, b"tracestate")
    if _tracer is None:
        return
    from opentelemetry.trace import SpanKind

    carrier = {"traceparent": traceparent or "", "tracestate": ctx.tracestate or ""}
    ctx.span = _tracer.start_span(
        f"{scope['method']} {scope['path']}", context=_propagator.extract(carrier),
        kind=SpanKind.SERVER,
        attributes={"reach.tenant": ctx.tenant_slug, "reach.request_id": ctx.request_id})


def attempt_started(ctx: CallContext, candidate, deadline_ms: int, headers: dict) -> None:
    """An upstream attempt begins: its span, and the trace headers the agent receives."""
    if _tracer is None or ctx.span is None:
        if ctx.traceparent:
            headers["traceparent"] = ctx.traceparent
            if ctx.tracestate:
                headers["tracestate"] = ctx.tracestate
        return
    from opentelemetry.trace import SpanKind, set_span_in_context

    agent = candidate.agent
    span = _tracer.start_span(
        f"invoke_agent {agent.name}", context=set_span_in_context(ctx.span),
        kind=SpanKind.CLIENT, attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent.name,
            "gen_ai.agent.id": str(agent.pk), "gen_ai.agent.version": agent.version,
            "reach.capability_id": candidate.capability.capability_id,
            "reach.route.score": float(candidate.score), "reach.deadline_ms": deadline_ms,
            "reach.tenant": ctx.tenant_slug, "reach.instance": candidate.instance.pk,
            "reach.attempt": len(ctx.attempts), "reach.protocol": str(agent.protocol),
        })
    ctx.attempt_span = span
    _propagator.inject(headers, context=set_span_in_context(span))


def attempt_failed(ctx: CallContext, code: str, message: str, *, retried: bool) -> None:
    if ctx.span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span = ctx.attempt_span
    if span is not None:
        span.set_attribute("error.type", code)
        span.set_status(Status(StatusCode.ERROR, message[:200]))
        span.end()
        ctx.attempt_span = None
    if ctx.attempts:
        if code == "circuit_open":
            ctx.span.add_event("breaker_open", {"reach.instance": ctx.attempts[-1]})
        if retried:
            ctx.span.add_event("retry", {"reach.instance": ctx.attempts[-1],
                                         "error.type": code})


def call_finished(ctx: CallContext, outcome: str) -> None:
    span = ctx.span
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    input_tokens, output_tokens = ctx.reported or (0, 0)
    failed = outcome != "success"
    attempt = ctx.attempt_span
    if attempt is not None:
        if ctx.reported is not None:
            attempt.set_attribute("gen_ai.usage.input_tokens", input_tokens)
            attempt.set_attribute("gen_ai.usage.output_tokens", output_tokens)
        if failed:
            attempt.set_attribute("error.type", outcome)
            attempt.set_status(Status(StatusCode.ERROR))
        attempt.end()
        ctx.attempt_span = None
    candidate = ctx.candidate
    if candidate is not None:
        span.set_attribute("gen_ai.agent.name", candidate.agent.name)
        span.set_attribute("reach.capability_id", candidate.capability.capability_id)
        span.set_attribute("reach.route.score", float(candidate.score))
    if ctx.budget_ms:
        span.set_attribute("reach.deadline_ms", ctx.budget_ms)
    span.set_attribute("reach.outcome", outcome)
    span.set_attribute("reach.reason", str(reason_of(outcome)))
    if ctx.reported is not None:
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
    if failed:
        span.set_attribute("error.type", outcome)
        span.set_status(Status(StatusCode.ERROR))
    span.end()
    ctx.span = None
