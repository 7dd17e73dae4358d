"""Traces: a call made with a W3C ``traceparent`` is a span tree under the caller's span
(the gateway's call span, an ``invoke_agent`` span per upstream attempt, attributed per
the GenAI conventions), and the agent receives the trace id. In-memory exporter."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from gateway import tracing
from tests.support.inprocess import in_process, route_table, scripted_agents, with_instances
from tests.support.loopback import LoopbackService
from tests.support.servers import free_port

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    yield exporter
    tracing.use(None)


def call(table, key, body, **headers):
    async def scenario():
        async with in_process(table, key) as gw:
            return await gw.post("/v1/invoke", body, **headers)

    return asyncio.run(scenario())


def test_a_retried_call_is_a_span_tree_under_the_callers_and_the_agent_gets_the_trace(
        scripted, spans):
    agents = scripted_agents(scripted.endpoint)
    # The first instance refuses connections: one failed attempt, then the retry.
    agents[0] = with_instances(agents[0], f"http://127.0.0.1:{free_port()}/",
                               scripted.endpoint)
    table, key = route_table(agents)
    reply = call(table, key, {"capability": "echo.all", "input": {"text": "hi"}},
                 traceparent=TRACEPARENT, tracestate="vendor=1",
                 x_reach_deadline_ms="4000")
    assert reply.status_code == 200, reply.text

    finished = spans.get_finished_spans()
    server = [s for s in finished if s.kind == SpanKind.SERVER]
    attempts = [s for s in finished if s.kind == SpanKind.CLIENT]
    assert len(server) == 1 and len(attempts) == 2
    root = server[0]
    assert f"{root.context.trace_id:032x}" == TRACE_ID
    assert f"{root.parent.span_id:016x}" == CALLER_SPAN
    assert root.attributes["reach.outcome"] == "success"
    assert root.attributes["reach.capability_id"] == "echo.all"
    assert [e.name for e in root.events] == ["retry"]
    for attempt in attempts:
        assert attempt.parent.span_id == root.context.span_id
        assert attempt.context.trace_id == root.context.trace_id
        assert attempt.name == "invoke_agent scripted"
        assert attempt.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert attempt.attributes["gen_ai.agent.name"] == "scripted"
        assert attempt.attributes["gen_ai.agent.id"] == str(agents[0].pk)
        assert attempt.attributes["reach.capability_id"] == "echo.all"
        assert attempt.attributes["reach.tenant"] == "acme"
        assert 0 < attempt.attributes["reach.deadline_ms"] <= 4000
        assert "reach.route.score" in attempt.attributes
    failed, served = sorted(attempts, key=lambda s: s.attributes["reach.attempt"])
    assert failed.attributes["error.type"] == "upstream_error"
    assert "error.type" not in served.attributes
    # What the agent received: the trace, with the served attempt's span as parent.
    received = reply.json()["output"]["headers"]
    assert received["traceparent"] == (
        f"00-{TRACE_ID}-{served.context.span_id:016x}-01")
    assert received["tracestate"] == "vendor=1"


def test_usage_tokens_are_on_the_attempt_span(scripted, spans):
    table, key = route_table(scripted_agents(scripted.endpoint))
    reply = call(table, key, {"capability": "a2a.scripted", "input": {"text": "one two"}})
    assert reply.status_code == 200, reply.text
    attempt = next(s for s in spans.get_finished_spans() if s.kind == SpanKind.CLIENT)
    usage = reply.json()["usage"]
    assert attempt.attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"]
    assert attempt.attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]


def test_tracing_off_still_hands_the_callers_trace_to_the_agent(scripted):
    table, key = route_table(scripted_agents(scripted.endpoint))
    reply = call(table, key, {"capability": "echo.all", "input": {}}, traceparent=TRACEPARENT)
    assert reply.json()["output"]["headers"]["traceparent"] == TRACEPARENT


def test_an_unknown_exporter_is_refused_by_name():
    with pytest.raises(tracing.TracingMisconfigured, match="zipkin"):
        tracing.configure_from_environment({"OTEL_TRACES_EXPORTER": "zipkin"})
    assert tracing.configure_from_environment({}) is False


class Collector(LoopbackService):
    """An OTLP/HTTP trace receiver on loopback: keeps each export it is sent."""

    def __init__(self) -> None:
        self.requests: list = []
        super().__init__(self._answer)

    def _answer(self, request, body: bytes) -> tuple[int, str, bytes]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        self.requests.append((request.path, export))
        return 200, "application/x-protobuf", b""

    def spans(self) -> list:
        return [span for _, export in self.requests for resource in export.resource_spans
                for scope in resource.scope_spans for span in scope.spans]


def test_a_gateway_process_exports_its_spans_over_otlp(gateway, tmp_path):
    """OTEL_TRACES_EXPORTER=otlp and the standard endpoint variable: the spans of a call
    reach a real OTLP/HTTP receiver, in the caller's trace."""
    import httpx

    from tests.gateway.conftest import gateway_env
    from tests.support.servers import running, uvicorn_args
    from tests.support.waiting import wait_for

    collector = Collector()
    try:
        env = gateway_env(tmp_path, OTEL_TRACES_EXPORTER="otlp",
                          OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.port}",
                          OTEL_BSP_SCHEDULE_DELAY="50", OTEL_SERVICE_NAME="reach-under-test")
        port = free_port()
        with running(uvicorn_args(port), env=env, port=port, log=tmp_path / "otel.log") as base:
            reply = httpx.post(f"{base}/v1/invoke", timeout=10, json={
                "capability": "echo.all", "input": {"text": "hi"}}, headers={
                "Authorization": f"Bearer {gateway.key}", "traceparent": TRACEPARENT})
            assert reply.status_code == 200, reply.text
            spans = wait_for(lambda: len(collector.spans()) >= 2 and collector.spans(),
                             timeout=20, interval=0.05, message="the call's spans")
        assert {path for path, _ in collector.requests} == {"/v1/traces"}
        assert {span.trace_id.hex() for span in spans} == {TRACE_ID}
        names = sorted(span.name for span in spans)
        assert names == ["POST /v1/invoke", "invoke_agent scripted"]
        attempt = next(s for s in spans if s.name.startswith("invoke_agent"))
        attributes = {a.key: a.value for a in attempt.attributes}
        assert attributes["gen_ai.operation.name"].string_value == "invoke_agent"
        assert attributes["reach.capability_id"].string_value == "echo.all"
        resource = collector.requests[0][1].resource_spans[0].resource
        assert {a.key: a.value.string_value for a in resource.attributes}[
            "service.name"] == "reach-under-test"
    finally:
        collector.close()
