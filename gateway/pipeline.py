"""The one call pipeline every door goes through.

    authenticate → parse → route → validate → admit → idempotency → open
    → read | relay → meter → reply

A door (``gateway.doors``) only parses its request into a ``Call`` (where to go,
with what input, how the answer is shaped); everything that guards a call is
here, once, so a guarantee added to the pipeline holds on every door:

- **route / validate**: the router picks a candidate; the input, shaped for the
  candidate's protocol, is checked against the capability's ``input_schema`` and
  mapped to the agent's own parameter names;
- **admit**: rate limits and budgets (``gateway.governance``);
- **idempotency**: with an ``Idempotency-Key`` a non-streamed call runs at most
  once per (tenant, key); duplicates get the stored reply (``gateway.idempotency``);
- **open**: the deadline (the agent's ``timeout_ms`` capped by the caller's
  ``X-Reach-Deadline-Ms``) and at most one retry on a different instance, only
  while the budget lasts and only when the first attempt never reached the agent
  or the call is keyed;
- **read | relay**: a JSON reply read and parsed by the protocol, or an SSE stream
  relayed event by event (an upstream break or idle stream ends with an ``error``
  event, never a fake ``[DONE]``; a client that goes away cancels the agent's call);
- **meter**: one usage event per call and the budget counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import orjson

from gateway import idempotency
from gateway.calls import CallContext, Caller, Upstream, to_agent_names
from gateway.config import GatewayConfig
from gateway.governance import Governor
from gateway.http_io import header, send_bytes, send_json, sse_headers
from gateway.metrics import IDEMPOTENT_REPLAYS, RETRIES, TOKENS
from gateway.protocols import PROTOCOLS, AgentProtocol, AgentResponse, StreamMeter
from gateway.sse import EventFramer, data_of
from gateway.upstream import UpstreamFailure
from gateway.usage import UsageQueue
from reach_core.errors import ReachError
from reach_core.kinds import Outcome
from routing.router import Candidate, Router, RouteRequest
from routing.table import ApiKeyEntry, RouteTable

TOKENS_IN, TOKENS_OUT = TOKENS.labels("input"), TOKENS.labels("output")
MAX_IDEMPOTENCY_KEY = 255


@dataclass
class Request:
    """One authenticated HTTP request, as a door sees it."""

    scope: dict
    receive: Callable
    send: Callable
    request_id: str
    table: RouteTable
    key: ApiKeyEntry
    raw: bytes

    def header(self, name: bytes) -> str | None:
        return header(self.scope, name)


@dataclass
class Result:
    """A finished non-streamed call, for a door to shape its reply from."""

    candidate: Candidate
    reply: AgentResponse
    ctx: CallContext
    route_ms: float

    def cost(self) -> float:
        return cost(self.candidate, self.reply.input_tokens, self.reply.output_tokens)


@dataclass
class Call:
    """What a door asks of the pipeline.

    ``payload(protocol)`` is the input in canonical parameter names, shaped for the
    chosen agent's protocol (recomputed if a retry lands on another agent).
    ``reply(result)`` is the JSON body of a non-streamed answer. With ``stream``,
    ``relays(protocol)`` says whether the agent's own stream is relayed; when not,
    the agent is called without streaming and ``events(result)`` is sent as the
    stream. ``keep_usage_events``: relay usage-only events (else they are metered
    and dropped).
    """

    route: RouteRequest
    payload: Callable[[AgentProtocol], dict]
    reply: Callable[[Result], dict]
    stream: bool = False
    relays: Callable[[AgentProtocol], bool] = lambda protocol: True
    events: Callable[[Result], bytes] | None = None
    keep_usage_events: bool = True


class Pipeline:
    def __init__(self, *, config: GatewayConfig, router: Router, caller: Caller,
                 governor: Governor | None, usage: UsageQueue | None,
                 idempotency_store) -> None:
        self.config = config
        self.router = router
        self.caller = caller
        # None only to measure what admission and metering cost (bench/metering.py).
        self.governor = governor
        self.usage = usage
        self.idempotency = idempotency_store

    # ---- the stages ---------------------------------------------------------------------

    async def serve(self, request: Request, call: Call) -> str:
        """Run ``call`` and send its reply; returns the outcome (for metrics). Raises
        ``ReachError`` for a failure before any byte of the reply was sent."""
        ctx = self._context(request)
        candidate, payload = self._route(request.table, call, ctx)
        if self.governor is not None:
            await self.governor.admit(request.table, ctx.tenant_pk, candidate)
        route_ms = (time.monotonic() - ctx.started) * 1000
        relay = call.stream and call.relays(PROTOCOLS[candidate.agent.protocol])
        if relay:
            upstream = await self._open(request.table, call, candidate, payload, ctx,
                                        stream=True)
            return await self._relay(request, call, upstream, ctx)

        async def forward() -> dict | bytes:
            upstream = await self._open(request.table, call, candidate, payload, ctx,
                                        stream=False)
            reply = await self.caller.read(upstream, ctx)
            self._meter(ctx, upstream.candidate, Outcome.SUCCESS, reply.input_tokens,
                        reply.output_tokens)
            result = Result(upstream.candidate, reply, ctx, route_ms)
            if call.stream:  # a stream was asked of an agent that does not stream it
                return call.events(result)
            return call.reply(result)

        key = request.header(b"idempotency-key")
        if key and not call.stream:
            await self._idempotently(request, key, forward)
            return Outcome.SUCCESS
        answer = await forward()
        if isinstance(answer, bytes):
            await request.send({"type": "http.response.start", "status": 200,
                                "headers": sse_headers(request.request_id)})
            await request.send({"type": "http.response.body", "body": answer})
        else:
            await send_json(request.send, 200, answer, request.request_id)
        return Outcome.SUCCESS

    def _context(self, request: Request) -> CallContext:
        caller_budget = deadline_header(request)
        return CallContext(
            request_id=request.request_id, tenant_pk=request.key.tenant_pk,
            tenant_slug=request.table.tenants[request.key.tenant_pk].slug,
            started=time.monotonic(), budget_ms=0, caller_budget_ms=caller_budget,
            idempotent=bool(request.header(b"idempotency-key")),
        )

    def _route(self, table: RouteTable, call: Call, ctx: CallContext,
               exclude: frozenset[int] = frozenset()) -> tuple[Candidate, dict]:
        """Route and validate: the candidate and the input in the agent's own names."""
        decision = self.router.route(table, call.route, exclude=exclude)
        if decision.error:
            raise ReachError(decision.error, route_message(decision))
        candidate = decision.chosen
        capability = candidate.capability
        payload = call.payload(PROTOCOLS[candidate.agent.protocol])
        problems = self.caller.validators.errors(capability.input_schema, payload)
        if problems:
            message = "; ".join(f"{p}: {' '.join(m)}" for p, m in problems.items())
            raise ReachError("invalid_input", "input does not match the capability's "
                             f"input_schema: {message}", details=problems)
        if not ctx.attempts:
            ctx.bind_budget(min(capability.timeout_ms, self.config.max_timeout_ms))
        return candidate, to_agent_names(capability, payload)

    async def _open(self, table: RouteTable, call: Call, candidate: Candidate, payload: dict,
                    ctx: CallContext, *, stream: bool) -> Upstream:
        """The first attempt, and at most one retry on another instance when it is safe."""
        while True:
            ctx.attempts.append(candidate.instance.pk)
            try:
                return await self.caller.attempt(table, candidate, payload, ctx,
                                                 stream=stream)
            except UpstreamFailure as failure:
                if not self._may_retry(ctx, failure):
                    raise ReachError(failure.code, failure.message) from failure
                try:
                    candidate, payload = self._route(table, call, ctx,
                                                     exclude=frozenset(ctx.attempts))
                except ReachError:  # nowhere else to go: the first failure is the answer
                    raise ReachError(failure.code, failure.message) from failure
                RETRIES.inc()
                low, high = self.config.retry_backoff_ms
                await asyncio.sleep(random.uniform(low, high) / 1000)

    def _may_retry(self, ctx: CallContext, failure: UpstreamFailure) -> bool:
        if len(ctx.attempts) >= 2 or (failure.delivered and not ctx.idempotent):
            return False
        return ctx.remaining_ms() >= 2 * self.config.retry_backoff_ms[1]

    async def _idempotently(self, request: Request, key: str, forward) -> None:
        """Run ``forward()`` at most once per (tenant, key); replay its stored reply to
        duplicates. A failure that decided nothing (5xx, a crash) is forgotten, so a
        retry runs again; a definite one (4xx) is stored like a success."""
        if len(key) > MAX_IDEMPOTENCY_KEY:
            raise ReachError("invalid_input", "Idempotency-Key is longer than "
                             f"{MAX_IDEMPOTENCY_KEY} characters.")
        store = self.idempotency
        record, body_hash = (idempotency.record_key(request.key.tenant_pk, key),
                             idempotency.fingerprint(request.raw))
        outcome, stored = await store.claim(record, body_hash)
        if outcome == idempotency.Outcome.BUSY:
            outcome, stored = await idempotency.wait_for_first(store, record, body_hash, 30.0)
        if outcome == idempotency.Outcome.MISMATCH:
            raise ReachError("idempotency_key_reused",
                             "This Idempotency-Key was used with a different request body.")
        if outcome == idempotency.Outcome.BUSY:
            raise ReachError("idempotency_in_progress",
                             "A call with this Idempotency-Key is still running.")
        if outcome == idempotency.Outcome.REPLAY:
            IDEMPOTENT_REPLAYS.inc()
            await send_bytes(request.send, stored.status, stored.body, request.request_id,
                             extra=[(b"idempotent-replayed", b"true")])
            return
        try:
            reply = await forward()
        except ReachError as error:
            if error.kind.status >= 500:
                await store.forget(record)
            else:
                await store.finish(record, idempotency.Stored(
                    error.kind.status, orjson.dumps(error.body(request.request_id))))
            raise
        except BaseException:
            await store.forget(record)
            raise
        payload = orjson.dumps(reply)
        await store.finish(record, idempotency.Stored(200, payload))
        await send_bytes(request.send, 200, payload, request.request_id)

    async def _relay(self, request: Request, call: Call, upstream: Upstream,
                     ctx: CallContext) -> str:
        """Relay the agent's SSE stream event by event; returns the stream's outcome.
        No retry once bytes are sent."""
        send = request.send
        await send({"type": "http.response.start", "status": 200,
                    "headers": sse_headers(ctx.request_id)})
        meter: StreamMeter = PROTOCOLS[upstream.candidate.agent.protocol].stream_meter()
        framer = EventFramer()
        outcome: str = Outcome.SUCCESS
        error: ReachError | None = None

        async def pump() -> None:
            nonlocal error, outcome
            try:
                async for chunk in upstream.response.content.iter_any():
                    out = []
                    for event in framer.feed(chunk):
                        data = data_of(event)
                        if data is not None and meter.observe(data) \
                                and not call.keep_usage_events:
                            continue
                        out.append(event)
                    if out:
                        await send({"type": "http.response.body", "body": b"".join(out),
                                    "more_body": True})
                if framer.pending.strip():
                    raise aiohttp.ClientPayloadError("stream ended inside an event")
            except (TimeoutError, aiohttp.ServerTimeoutError):
                outcome = Outcome.UPSTREAM_TIMEOUT
                error = ReachError("upstream_timeout", "the agent's stream went idle for "
                                   f"{self.config.stream_idle_timeout_s:g} s")
            except (aiohttp.ClientError, OSError) as exc:
                outcome = Outcome.UPSTREAM_ERROR
                error = ReachError("upstream_error", "the agent's stream broke off "
                                   f"({type(exc).__name__})")

        async def watch_disconnect() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        pumping = asyncio.ensure_future(pump())
        watching = asyncio.ensure_future(watch_disconnect())
        try:
            done, _ = await asyncio.wait({pumping, watching},
                                         return_when=asyncio.FIRST_COMPLETED)
            if watching in done and pumping not in done:
                outcome = Outcome.CLIENT_CANCELLED
                pumping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pumping
            else:
                if error is not None:
                    await send({"type": "http.response.body",
                                "body": error.sse_event(ctx.request_id), "more_body": True})
                await send({"type": "http.response.body", "body": b""})
        finally:
            watching.cancel()
            upstream.response.close()  # drops the connection: cancels the agent's work
            self.caller.record_stream(upstream, ok=outcome in (Outcome.SUCCESS,
                                                               Outcome.CLIENT_CANCELLED))
            self._meter(ctx, upstream.candidate, outcome, *meter.totals())
        return outcome

    def _meter(self, ctx: CallContext, candidate: Candidate, outcome: str,
               input_tokens: int = 0, output_tokens: int = 0) -> None:
        """One usage event and the budget counters; never blocks, never raises."""
        if self.governor is None or self.usage is None:
            return
        TOKENS_IN.inc(input_tokens)
        TOKENS_OUT.inc(output_tokens)
        spent = cost(candidate, input_tokens, output_tokens)
        self.governor.record(ctx.tenant_pk, candidate, tokens=input_tokens + output_tokens,
                             cost=spent)
        self.usage.emit({
            "request_id": ctx.request_id, "tenant": ctx.tenant_pk,
            "agent": candidate.agent.pk, "capability": candidate.capability.pk,
            "instance": candidate.instance.pk, "outcome": str(outcome),
            "input_tokens": input_tokens, "output_tokens": output_tokens, "cost": spent,
            "latency_ms": int((time.monotonic() - ctx.started) * 1000),
            "occurred_at": time.time(),
        })


def cost(candidate: Candidate, input_tokens: int, output_tokens: int) -> float:
    agent = candidate.agent
    return round(agent.price_per_call + input_tokens / 1000 * agent.price_input_per_1k
                 + output_tokens / 1000 * agent.price_output_per_1k, 6)


def deadline_header(request: Request) -> int | None:
    raw = request.header(b"x-reach-deadline-ms")
    if raw is None:
        return None
    if not raw.strip().isdigit() or int(raw) <= 0:
        raise ReachError("invalid_input", "X-Reach-Deadline-Ms must be a positive integer.")
    return int(raw)


def route_message(decision) -> str:
    if decision.error == "no_capability":
        if decision.capability:
            return f"No agent offers {decision.capability!r} to this tenant."
        return "No capability matches this request."
    return f"No healthy instance can serve {decision.capability!r} now."
