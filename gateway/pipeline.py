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
import functools
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
import orjson

from gateway import idempotency, observe, tracing
from gateway.budgets import Amount
from gateway.calls import CallContext, Caller, Upstream, to_agent_names
from gateway.config import GatewayConfig
from gateway.governance import Governor
from gateway.http_io import (
    CANCEL_ON_GONE,
    CLIENT_GONE,
    dumps_reply,
    header,
    read_body,
    require_json,
    retry_headers,
    send_bytes,
    send_json,
    sse_headers,
)
from gateway.inputs import Defaults, canonical_input
from gateway.intent_cpu import IntentCpu, OffLoopMatching
from gateway.metrics import IDEMPOTENCY_DEGRADED, IDEMPOTENT_REPLAYS, RETRIES, TOKENS
from gateway.protocols import PROTOCOLS, AgentProtocol, AgentResponse, StreamMeter
from gateway.sse import (
    EVENTS_PER_TURN,
    AgentReportedError,
    EventFramer,
    EventNotUnderstood,
    EventTooLarge,
    data_of,
    is_error_event,
)
from gateway.tasks import Submission as TaskSubmission
from gateway.tasks import TaskDoors
from gateway.upstream import UpstreamFailure
from gateway.usage import UsageQueue
from reach_core import requestid
from reach_core.endpoints import EndpointRefused, resolve_and_check_target
from reach_core.errors import ReachError, kind_of
from reach_core.kinds import CapabilityKind, Outcome
from reach_core.numbers import rounded
from routing.router import Candidate, Router, RouteRequest, capability_visible
from routing.table import ApiKeyEntry, RouteTable

logger = logging.getLogger(__name__)
TOKENS_IN, TOKENS_OUT = TOKENS.labels("input"), TOKENS.labels("output")
MAX_IDEMPOTENCY_KEY = 255
DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"


@dataclass
class Request:
    """One authenticated HTTP request, as a door sees it."""

    scope: dict
    receive: Callable
    send: Callable
    request_id: str
    table: RouteTable
    key: ApiKeyEntry
    raw: bytes = b""  # read by the pipeline
    ctx: CallContext | None = None  # the pipeline's, once it runs (what was routed to)

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
    ``reply(result)`` is the JSON body of a non-streamed answer. With ``stream``, an
    agent whose capability streams (``kind: stream``, or a protocol that streams chat) is
    asked for a stream, relayed event by event; any other agent is called without
    streaming and ``events(result)`` is sent as the stream. ``reframe(protocol, agent name)``, when
    it returns a function, rewrites each relayed event's streamed text into this door's
    own events (``finish`` ends them); else events pass as they are.
    ``keep_usage_events``: relay usage-only events (else they are metered and dropped).
    ``usage_event(input, output)``: the caller asked for usage; when the agent streamed
    none (or its events are reframed), this event (what is metered: the agent's figures,
    else the gateway's count) goes out before ``[DONE]``.
    """

    route: RouteRequest
    payload: Callable[[AgentProtocol], dict]
    reply: Callable[[Result], dict]
    stream: bool = False
    events: Callable[[Result], bytes] | None = None
    reframe: Callable[[AgentProtocol, str], Callable[[str], bytes] | None] = \
        lambda protocol, agent_name: None
    finish: bytes = b""
    keep_usage_events: bool = True
    usage_event: Callable[[int, int], bytes] | None = None
    # ``"ask"``: an intent whose best two matches nearly tie is answered 300 with the
    # candidates instead of calling the first (``"guess"``, the default).
    on_ambiguity: str = "guess"
    # ``mode: async``: checked like a call (routing, input), then stored as a task for the
    # workers and answered 202 (``Pipeline._submit``).
    asynchronous: AsyncRequest | None = None


@dataclass(frozen=True)
class AsyncRequest:
    """An asynchronous submission's own fields, besides the call."""

    request: dict  # what the task's attempts will run: the body, the namespace, internal
    callback_url: str = ""
    signing_secret: str = "default"  # noqa: S105  (the name of one, not a secret)


@dataclass
class _Metering:
    outcome: str = Outcome.SUCCESS


class Pipeline:
    def __init__(self, *, config: GatewayConfig, router: Router, caller: Caller,
                 governor: Governor | None, usage: UsageQueue | None,
                 idempotency_store, idempotency_fail_open: bool = False,
                 tasks: TaskDoors | None = None) -> None:
        self.config = config
        self.tasks = tasks
        self.router = router
        self.intent_cpu = IntentCpu(ms_per_s=config.intent_cpu_ms_per_s,
                                    burst_ms=config.intent_cpu_burst_ms)
        self.matching = OffLoopMatching(self.intent_cpu)
        self.caller = caller
        self.defaults = Defaults()
        # None only to measure what admission and metering cost (bench/metering.py).
        self.governor = governor
        self.usage = usage
        self.idempotency = idempotency_store
        self.idempotency_fail_open = idempotency_fail_open
        # Calls not metered yet, and an event set whenever there are none: a stopping
        # gateway waits for them before it stops shipping usage (uvicorn cancels calls
        # past its drain time and goes on to shut down while they still clean up).
        self._unmetered = 0
        self._all_metered = asyncio.Event()
        self._all_metered.set()
        # Keyed replies Redis did not take when their calls ended (away, or hung): by
        # record key, (owner, body hash, reply, give up at), stored again until it does.
        self._unstored: dict[str, tuple] = {}
        self._storing: asyncio.Task | None = None

    def close(self) -> None:
        """Stop what this pipeline runs beside the calls (the gateway is stopping)."""
        self.matching.close()
        if self._storing is not None:
            self._storing.cancel()

    async def all_metered(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until every call begun has been metered."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._all_metered.wait()
            return True
        except TimeoutError:
            return False

    # ---- the stages ---------------------------------------------------------------------

    async def run(self, request: Request, parse: Callable[[Request], Call]) -> str:
        """Parse, run the call and send its reply; returns the outcome (for metrics).
        Raises ``ReachError`` for a failure before any byte of the reply was sent.

        Whatever happens after authentication, the call is metered exactly once with its
        final outcome, and its budget reservation is settled."""
        ctx = CallContext(
            request_id=request.request_id, tenant_pk=request.key.tenant_pk,
            tenant_slug=request.table.tenants[request.key.tenant_pk].slug,
            started=time.monotonic(), budget_ms=0, caller_budget_ms=None,
            idempotency_key=None)
        request.ctx = ctx
        tracing.call_started(ctx, request.scope)
        async with self._metered(ctx, request.scope) as metering:
            # Inside the metering: a wrong body is an authenticated call that failed.
            require_json(request.scope)
            request.raw = await read_body(request.scope, request.receive,
                                          self.config.max_body_bytes,
                                          self.config.body_timeout_s)
            self._read_headers(request, ctx)
            # The agent's timeout runs from when the request is in, not while a slow
            # caller uploads it (that has its own limit); a caller's deadline keeps running.
            ctx.restart_agent_clock()
            call = parse(request)
            ctx.intent = call.route.intent is not None and call.route.capability is None
            candidate, payload = await self._route(request.table, call, ctx)
            if call.asynchronous is not None:
                if ctx.idempotency_key is None:
                    return await self._submit(request, call, ctx, candidate)
                # Storing a task, not running it: a short lease, and duplicates wait.
                lease_s = self.config.lease_margin_s + 10.0
                return await self._under_key(request, ctx, lease_s, lease_s, lambda: (
                    self._submit(request, call, ctx, candidate)))
            try:
                await self._admit(request.table, call, ctx, candidate, payload)
            except ReachError as refused:
                if refused.code != "quota_exceeded" or ctx.idempotency_key is None \
                        or call.stream:
                    raise
                # A retry of a keyed call that ran (its reply lost) must get that reply,
                # not a refusal for the budget the call itself spent (a break test: a
                # budget of one request, the retry got 429 "not retryable"). A key
                # never run, or not finished in time, gets the refusal.
                metering.outcome = await self._idempotently(
                    request, ctx, functools.partial(_raise, refused))
                return metering.outcome
            serve = functools.partial(self._serve, request, call, ctx, candidate, payload)
            if ctx.idempotency_key is not None and not call.stream:
                metering.outcome = await serve()  # stored and replayed (``_idempotently``)
                return metering.outcome
            if ctx.idempotency_key is not None:
                # A stream runs again for a duplicate (nothing is stored to replay): a
                # duplicate while it runs is refused at once rather than kept waiting.
                # Its claim is a lease refreshed while it runs, as a call's: a gateway
                # that dies mid-stream holds the key seconds, not a stream's longest.
                serve = functools.partial(self._under_key, request, ctx,
                                          ctx.budget_ms / 1000 + self.config.lease_margin_s,
                                          0.0, serve, refresh=True)
            # While the agent works, a caller gone before its reply began cancels the call
            # (the server protocol does): the agent's work stops, metered
            # client_cancelled. Not past here: metering and settling always finish. A
            # keyed call runs on, its result stored for the retry sure to come.
            request.scope[CANCEL_ON_GONE] = asyncio.current_task()
            try:
                metering.outcome = await serve()
            except asyncio.CancelledError:
                if request.scope.get(CLIENT_GONE):
                    # Taken: the metering's own time-outs (Redis) must work as usual.
                    asyncio.current_task().uncancel()
                raise
            finally:
                del request.scope[CANCEL_ON_GONE]
            return metering.outcome

    async def perform(self, table: RouteTable, call: Call, ctx: CallContext, *,
                      scope: dict | None = None) -> Result:
        """One non-streamed call whose door writes its own answer (a task's attempt, an
        MCP tool call: ``scope``, its HTTP caller's): route, admit, open (the deadline,
        the one retry), read, meter. Raises ``ReachError``."""
        async with self._metered(ctx, scope):
            candidate, payload = await self._route(table, call, ctx)
            await self._admit(table, call, ctx, candidate, payload)
            route_ms = (time.monotonic() - ctx.started) * 1000
            upstream = await self._open(table, call, candidate, payload, ctx, stream=False)
            reply = await self.caller.read(upstream, ctx)
            return Result(upstream.candidate, reply, ctx, route_ms)

    @contextlib.asynccontextmanager
    async def _metered(self, ctx: CallContext, scope: dict | None = None):
        """Whatever happens after authentication, the call is metered exactly once with its
        final outcome (the body sets ``outcome`` when it ends otherwise than in success or
        an exception), and its budget reservation is settled. A call of an HTTP caller
        (``scope``) cancelled while its caller is still there was cut by this gateway
        (stopping past its drain time): ``service_unavailable``, not the caller's doing."""
        metering = _Metering()
        self._unmetered += 1
        self._all_metered.clear()
        try:
            yield metering
        except ReachError as error:
            metering.outcome = error.code
            raise
        except asyncio.CancelledError:
            metering.outcome = (Outcome.CLIENT_CANCELLED
                                if scope is None or scope.get(CLIENT_GONE)
                                else Outcome.SERVICE_UNAVAILABLE)
            raise
        except Exception:
            metering.outcome = Outcome.INTERNAL_ERROR
            raise
        finally:
            try:
                await self._meter(ctx, ctx.admission, metering.outcome)
            finally:
                self._unmetered -= 1
                if not self._unmetered:
                    self._all_metered.set()

    async def _admit(self, table: RouteTable, call: Call, ctx: CallContext,
                     candidate: Candidate, payload: dict) -> None:
        if self.governor is not None:
            # Open before the reservation: a process killed while Redis takes it leaves
            # a reservation that lapses as one request used, and that call must have its
            # event (helper-54: 23 lapsed reservations, 17 events).
            if self.usage is not None and ctx.metered and ctx.spooled is None:
                ctx.spooled = self.usage.opened(self._usage_event(ctx, Outcome.WORKER_LOST))
            ctx.admission = await within_deadline(ctx, self.governor.admit(
                table, ctx.tenant_pk, candidate, ceiling=ceiling(candidate, payload),
                lease_s=self._lease_s(ctx, call)))

    async def _submit(self, request: Request, call: Call, ctx: CallContext,
                      candidate: Candidate) -> str:
        """An asynchronous call, checked as a call would be (it routes, its input is
        valid), stored as a task, answered 202. Its attempts are metered, not this."""
        if self.tasks is None:
            raise ReachError("service_unavailable", "This gateway takes no asynchronous "
                             "tasks (no task store is configured).")
        spec = call.asynchronous
        if spec.callback_url:
            await check_callback_url(spec.callback_url, self.config.policy)
        task, created = await self.tasks.submitted(TaskSubmission(
            tenant_pk=ctx.tenant_pk, request_id=ctx.request_id, request=spec.request,
            capability=candidate.capability.capability_id,
            fingerprint=_fingerprint(request),
            idempotency_key=ctx.idempotency_key, callback_url=spec.callback_url,
            signing_secret=spec.signing_secret))
        ctx.metered = False
        extra = [(b"location", f"/v1/tasks/{task['id']}".encode())]
        if not created:
            IDEMPOTENT_REPLAYS.inc()
            extra.append((b"idempotent-replayed", b"true"))
        await send_json(request.send, 202, {
            "task_id": task["id"], "state": task["state"], "request_id": task["request_id"],
            "idempotency_key": task["idempotency_key"], "capability": task["capability"],
            "links": {"self": f"/v1/tasks/{task['id']}",
                      "events": f"/v1/tasks/{task['id']}/events"}}, request.request_id, extra)
        return Outcome.SUCCESS

    async def _serve(self, request: Request, call: Call, ctx: CallContext,
                     candidate: Candidate, payload: dict) -> str:
        route_ms = (time.monotonic() - ctx.started) * 1000
        protocol = PROTOCOLS[candidate.agent.protocol]
        if call.stream and (candidate.capability.kind == CapabilityKind.STREAM
                            or protocol.speaks_chat):
            upstream = await self._open(request.table, call, candidate, payload, ctx,
                                        stream=True)
            if upstream.response.content_type == "text/event-stream":
                return await self._relay(request, call, upstream, ctx)
            # It answered a stream request with one reply: send that as the stream.
            reply = await self.caller.read(upstream, ctx)
            await self._answer(request, call.events(Result(upstream.candidate, reply, ctx,
                                                           route_ms)), ctx)
            return Outcome.SUCCESS

        async def forward() -> dict | bytes:
            upstream = await self._open(request.table, call, candidate, payload, ctx,
                                        stream=False)
            reply = await self.caller.read(upstream, ctx)
            result = Result(upstream.candidate, reply, ctx, route_ms)
            if call.stream:  # a stream was asked of an agent that does not stream it
                return call.events(result)
            return call.reply(result)

        if ctx.idempotency_key is not None and not call.stream:
            return await self._idempotently(request, ctx, forward)
        await self._answer(request, await forward(), ctx)
        return Outcome.SUCCESS

    @staticmethod
    def _read_headers(request: Request, ctx: CallContext) -> None:
        key = request.header(b"idempotency-key")
        if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY and key.isascii()
                                    and key.isprintable()):
            # Printable ASCII, as the header's draft standard has it: other bytes were read
            # as latin-1 and reached the agent re-encoded, another key than the caller's
            # (helper-39), so the agent's own de-duplication could miss.
            raise ReachError("invalid_input", "Idempotency-Key must be 1 to "
                             f"{MAX_IDEMPOTENCY_KEY} printable ASCII characters.",
                             details={"Idempotency-Key": ["printable ASCII, 1 to "
                                                          f"{MAX_IDEMPOTENCY_KEY}"]})
        ctx.idempotency_key = key
        ctx.caller_budget_ms = deadline_header(request.scope)

    def _lease_s(self, ctx: CallContext, call: Call) -> float:
        """How long a reservation or a claim outlives a call that never settles it (its
        gateway died): the call's deadline, or the longest call for a stream, plus a margin."""
        longest = self.config.max_timeout_ms if call.stream else ctx.budget_ms
        return longest / 1000 + self.config.lease_margin_s

    async def decide(self, table: RouteTable, route: RouteRequest, **options):
        """The router's decision. An intent is matched off the event loop and charged to
        its tenant's share of this process's CPU (``gateway.intent_cpu``), refused once
        that is spent; the balancer's pick stays on the loop."""
        if route.intent is None or route.capability is not None:
            return self.router.route(table, route, **options)
        match = await self.matching.run(route.tenant_pk,
                                        functools.partial(self.router.match, table, route))
        return self.router.route(table, route, match=match, **options)

    async def _route(self, table: RouteTable, call: Call, ctx: CallContext,
                     exclude: frozenset[int] = frozenset()) -> tuple[Candidate, dict]:
        """Route and validate: the candidate and the input in the agent's own names."""
        decision = await self.decide(table, call.route, exclude=exclude)
        if decision.error in ("circuit_open", "no_healthy_instance"):
            # Offered to the caller but unreachable now: its metrics name the capability.
            ctx.capability_id = decision.capability
        if decision.error:
            raise ReachError(decision.error, route_message(decision, table, call.route),
                             details=suggested(decision, table, call.route))
        if decision.needs_confirmation and call.on_ambiguity == "ask" and not exclude:
            candidates = [{"capability": s.capability_id, "score": s.score}
                          for s in decision.choices
                          if capability_visible(table, call.route.tenant_pk, s.capability_id)]
            if len(candidates) > 1:
                details = {"candidates": candidates, "confidence": decision.confidence,
                           "margin": decision.margin}
                what = "The request"
                if decision.plan:
                    # Its first step is what a call runs (a break test: a plan whose
                    # first step nearly tied was run with "ask").
                    what = "The request's first step"
                    details["plan"] = list(decision.plan)
                raise ReachError(
                    "needs_confirmation", f"{what} matches several capabilities nearly "
                    "equally: repeat it with the chosen 'capability'.", details=details)
        candidate = decision.chosen
        ctx.candidate = candidate
        ctx.plan = decision.plan
        if decision.confidence is not None:
            ctx.sureness = {"confidence": decision.confidence, "margin": decision.margin}
            if decision.plan:
                ctx.sureness["step_confidence"] = list(decision.step_confidence)
        if not exclude:
            ctx.retry_elsewhere = decision.others > 0
        if ctx.routed is None:
            ctx.routed = time.monotonic()
        capability = candidate.capability
        payload = canonical_input(capability, call.payload(PROTOCOLS[candidate.agent.protocol]),
                                  self.defaults)
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
            ctx.candidate = candidate
            try:
                return await self.caller.attempt(table, candidate, payload, ctx,
                                                 stream=stream)
            except UpstreamFailure as failure:
                retrying = self._may_retry(ctx, failure)
                tracing.attempt_failed(ctx, failure.code, failure.message, retried=retrying)
                if not retrying:
                    raise ReachError(failure.code, failure.message) from failure
                previous = candidate
                try:
                    candidate, payload = await self._route(table, call, ctx,
                                                     exclude=frozenset(ctx.attempts))
                except ReachError:  # nowhere else to go: the first failure is the answer
                    raise ReachError(failure.code, failure.message) from failure
                if candidate.agent is not previous.agent:
                    await self._readmit(table, call, ctx, candidate, payload)
                RETRIES.inc()
                logger.info("instance %s: %s (%s); retrying on instance %s",
                            previous.instance.pk, failure.code, failure.message,
                            candidate.instance.pk)
                low, high = self.config.retry_backoff_ms
                await asyncio.sleep(random.uniform(low, high) / 1000)

    async def _readmit(self, table: RouteTable, call: Call, ctx: CallContext,
                       candidate: Candidate, payload: dict) -> None:
        """A retry on another agent is admitted on its own terms: its prices and its
        limits. The first attempt never reached an agent that answered, so its
        reservation is given back first; if the new one is refused, so is the retry."""
        if self.governor is None:
            return
        first, ctx.admission = ctx.admission, None
        if first is not None:
            await self.governor.settle(first, Amount())
        await self._admit(table, call, ctx, candidate, payload)

    def _may_retry(self, ctx: CallContext, failure: UpstreamFailure) -> bool:
        if len(ctx.attempts) >= 2 or (failure.delivered and not ctx.idempotent):
            return False
        return ctx.remaining_ms() >= 2 * self.config.retry_backoff_ms[1]

    async def _idempotently(self, request: Request, ctx: CallContext, forward) -> str:
        """Run ``forward()`` at most once per (tenant, key); replay its stored reply to
        duplicates (see ``gateway.idempotency``). The claim is a lease refreshed while
        the call runs; only the call's own results are stored."""
        store, owner = self.idempotency, idempotency.new_owner()
        record = idempotency.record_key(request.key.tenant_pk, ctx.idempotency_key)
        body_hash = _fingerprint(request)
        lease_s = ctx.budget_ms / 1000 + self.config.lease_margin_s
        try:
            # A duplicate waits for the first call up to a little before its deadline,
            # then gets its 409 (the key is busy), not the deadline's 504.
            outcome, stored = await within_deadline(ctx, idempotency.claim_or_wait(
                store, record, body_hash, owner, lease_s,
                wait_s=max(0.0, min(lease_s, ctx.remaining_ms() / 1000
                                    - 2 * idempotency.POLL_SECONDS))
                if ctx.caller_budget_ms else lease_s))
        except ReachError:
            raise
        except Exception as exc:  # Redis unreachable: the documented policy, never a 500
            IDEMPOTENCY_DEGRADED.inc()
            if not self.idempotency_fail_open:
                raise ReachError("idempotency_unavailable", "Idempotency keys cannot be "
                                 "checked right now; retry shortly.", retry_after=1) from exc
            await self._answer(request, await forward(), ctx)
            return Outcome.SUCCESS
        _refuse_if_taken(outcome, lease_s)
        if outcome == idempotency.Outcome.REPLAY:
            IDEMPOTENT_REPLAYS.inc()
            code = Outcome.SUCCESS if stored.status < 400 else _code_of(stored.body)
            extra = [(b"idempotent-replayed", b"true")]
            if stored.status >= 400:
                extra += retry_headers(kind_of(code).retryable)
            self.finish(ctx, code)
            await send_bytes(request.send, stored.status, stored.body, request.request_id,
                             [*stored.headers, *extra])
            return code
        ctx.restart_agent_clock()
        refreshing = asyncio.ensure_future(self._keep_claim(record, owner, lease_s))
        try:
            reply = await forward()
        except ReachError as error:
            refreshing.cancel()
            if error.code in idempotency.STORED_ERRORS:
                await self._store_quietly(record, owner, body_hash, idempotency.Stored(
                    error.kind.status, orjson.dumps(error.body(request.request_id))))
            else:
                await self._forget_quietly(record, owner)
            raise
        except BaseException:
            refreshing.cancel()
            await self._forget_quietly(record, owner)
            raise
        refreshing.cancel()
        try:
            payload = dumps_reply(reply)
        except ReachError:
            await self._forget_quietly(record, owner)
            raise
        routed = tuple(routed_headers(ctx))
        await self._store_quietly(record, owner, body_hash,
                                  idempotency.Stored(200, payload, routed))
        self.finish(ctx, Outcome.SUCCESS)
        await send_bytes(request.send, 200, payload, request.request_id, list(routed))
        return Outcome.SUCCESS

    async def _under_key(self, request: Request, ctx: CallContext, lease_s: float,
                         wait_s: float, run: Callable[[], Awaitable[str]], *,
                         refresh: bool = False) -> str:
        """A keyed request that is not replayed from a stored reply (an asynchronous
        submission: the task store answers its duplicates; a stream: it runs again)
        still claims its Idempotency-Key where calls do: one key, one request body,
        whichever way it is sent (else the agent sees two bodies under one key). With
        Redis away only that check is lost (counted): these run as before."""
        owner = idempotency.new_owner()
        record = idempotency.record_key(request.key.tenant_pk, ctx.idempotency_key)
        body_hash = _fingerprint(request)
        try:
            outcome, _ = await within_deadline(ctx, idempotency.claim_or_wait(
                store=self.idempotency, key=record, body_hash=body_hash, owner=owner,
                lease_s=lease_s, wait_s=wait_s))
        except ReachError:
            raise
        except Exception:
            IDEMPOTENCY_DEGRADED.inc()
            return await run()
        _refuse_if_taken(outcome, lease_s)
        if outcome == idempotency.Outcome.REPLAY:
            return await run()
        refreshing = asyncio.ensure_future(self._keep_claim(record, owner, lease_s)) \
            if refresh else None
        try:
            answer = await run()
        except BaseException:
            await self._forget_quietly(record, owner)
            raise
        finally:
            if refreshing is not None:
                refreshing.cancel()
        await self._store_quietly(record, owner, body_hash, idempotency.Stored(202, b"{}"))
        return answer

    async def _keep_claim(self, record: str, owner: str, lease_s: float) -> None:
        while True:
            await asyncio.sleep(lease_s / 3)
            with contextlib.suppress(Exception):  # a missed refresh shortens the lease
                await self.idempotency.refresh(record, owner, lease_s)

    async def _store_quietly(self, record: str, owner: str, body_hash: str,
                             stored: idempotency.Stored) -> None:
        # The reply goes out even when it cannot be stored, and is stored again until
        # Redis takes it; a duplicate that claims the lapsed key first runs again (the
        # agent sees the same Idempotency-Key and can tell).
        try:
            await self.idempotency.finish(record, owner, stored, body_hash)
        except Exception:
            IDEMPOTENCY_DEGRADED.inc()
            self._store_later(record, owner, body_hash, stored)

    def _store_later(self, record: str, owner: str, body_hash: str,
                     stored: idempotency.Stored) -> None:
        """Keep storing a reply Redis did not take, until it does: a retry that comes
        once Redis is back then gets the reply instead of running the call again when
        the claim lapses (a break test: Redis hung for 7 s at the end of a keyed call,
        and its retry ran the agent a second time). Bounded in count and in time; a
        claim taken meanwhile by a retry is left to it (the store refuses the write)."""
        self._unstored.pop(record, None)
        self._unstored[record] = (owner, body_hash, stored, time.monotonic() + UNSTORED_FOR_S)
        while len(self._unstored) > UNSTORED_MAX:
            del self._unstored[next(iter(self._unstored))]  # the oldest goes
        if self._storing is None or self._storing.done():
            self._storing = asyncio.ensure_future(self._store_unstored())

    async def _store_unstored(self) -> None:
        while self._unstored:
            await asyncio.sleep(STORE_AGAIN_EVERY_S)
            for record, (owner, body_hash, stored, until) in list(self._unstored.items()):
                if time.monotonic() < until:
                    try:
                        await self.idempotency.finish(record, owner, stored, body_hash)
                    except Exception:
                        break  # still away: the rest waits for the next round
                self._unstored.pop(record, None)

    async def _forget_quietly(self, record: str, owner: str) -> None:
        try:
            await self.idempotency.forget(record, owner)
        except Exception:  # the claim lapses on its own
            IDEMPOTENCY_DEGRADED.inc()

    async def _answer(self, request: Request, answer: dict | bytes, ctx: CallContext) -> None:
        payload = answer if isinstance(answer, bytes) else dumps_reply(answer)
        self.finish(ctx, Outcome.SUCCESS)
        if isinstance(answer, bytes):
            await request.send({"type": "http.response.start", "status": 200,
                                "headers": sse_headers(request.request_id)
                                + routed_headers(ctx)})
            await request.send({"type": "http.response.body", "body": payload})
        else:
            await send_bytes(request.send, 200, payload, request.request_id,
                             routed_headers(ctx))

    async def _relay(self, request: Request, call: Call, upstream: Upstream,
                     ctx: CallContext) -> str:
        """Relay the agent's SSE stream event by event; returns the stream's outcome.
        No retry once bytes are sent."""
        send = request.send
        await send({"type": "http.response.start", "status": 200,
                    "headers": sse_headers(ctx.request_id) + routed_headers(ctx)})
        protocol = PROTOCOLS[upstream.candidate.agent.protocol]
        meter: StreamMeter = protocol.stream_meter()
        reframe = call.reframe(protocol, upstream.candidate.agent.name)
        framer = EventFramer(max_event_bytes=self.config.max_upstream_bytes)
        outcome: str = Outcome.SUCCESS
        error: ReachError | None = None

        # The caller's deadline (X-Reach-Deadline-Ms) bounds the whole stream, not only its
        # first byte: an agent that keeps dripping events must not outlive its caller.
        # Without one, a stream's clock is its idle time between events.
        until = ctx.budget_started + ctx.caller_budget_ms / 1000 \
            if ctx.caller_budget_ms else None

        async def relay_events() -> None:
            async for chunk in upstream.response.content.iter_any():
                out = []
                for n, event in enumerate(framer.feed(chunk), 1):
                    if n % EVENTS_PER_TURN == 0:
                        # Many events in one piece: the loop is given back between
                        # turns, what is framed so far relayed first.
                        if out:
                            await send({"type": "http.response.body",
                                        "body": b"".join(out), "more_body": True})
                            out = []
                            if ctx.first_byte is None:
                                ctx.first_byte = time.monotonic()
                        await asyncio.sleep(0)
                    if is_error_event(event):
                        # The agent's own failure: never relayed as it is (its text is
                        # the agent's internals, its shape not ours), nor hidden under a
                        # door's [DONE]: the stream ends with the gateway's error event.
                        if out:
                            await send({"type": "http.response.body", "body": b"".join(out),
                                        "more_body": True})
                        raise AgentReportedError
                    data = data_of(event)
                    try:
                        usage_only = data is not None and meter.observe(data)
                    except EventNotUnderstood:
                        if out:  # the events before it are the caller's
                            await send({"type": "http.response.body", "body": b"".join(out),
                                        "more_body": True})
                        raise
                    if reframe is not None:
                        if meter.last_texts:
                            out.append(reframe("".join(meter.last_texts)))
                        continue
                    if usage_only and not call.keep_usage_events:
                        continue
                    if call.usage_event and data == DONE and not meter.reported:
                        out.append(call.usage_event(*meter.totals()))
                    out.append(event)
                if out:
                    await send({"type": "http.response.body", "body": b"".join(out),
                                "more_body": True})
                    if ctx.first_byte is None:
                        ctx.first_byte = time.monotonic()
            if framer.pending.strip():
                raise aiohttp.ClientPayloadError("the stream ended inside an event")
            if reframe is not None and call.finish:
                finish = call.finish
                # Reframed, the agent's own usage events are not relayed: always the
                # door's usage chunk, with the agent's figures when it reported them.
                if call.usage_event and finish.endswith(DONE_EVENT):
                    finish = (finish[:-len(DONE_EVENT)] + call.usage_event(*meter.totals())
                              + DONE_EVENT)
                await send({"type": "http.response.body", "body": finish,
                            "more_body": True})

        async def pump() -> None:
            nonlocal error, outcome
            deadline = asyncio.timeout(None if until is None
                                       else max(0.0, until - time.monotonic()))
            try:
                async with deadline:
                    await relay_events()
            except (EventTooLarge, EventNotUnderstood) as exc:
                outcome = Outcome.UPSTREAM_BAD_RESPONSE
                error = ReachError("upstream_bad_response", str(exc))
            except AgentReportedError:
                outcome = Outcome.UPSTREAM_ERROR
                error = ReachError("upstream_error", "the agent's stream ended with an error "
                                   "event")
            except (TimeoutError, aiohttp.ServerTimeoutError):
                if deadline.expired():  # (the loop's timer may fire a hair early)
                    outcome = Outcome.DEADLINE_EXCEEDED
                    error = ReachError("deadline_exceeded", "The caller's budget of "
                                       f"{ctx.caller_budget_ms} ms ran out mid-stream.")
                else:
                    outcome = Outcome.UPSTREAM_TIMEOUT
                    error = ReachError("upstream_timeout", "the agent's stream went idle "
                                       "(nothing within its idle time-out)")
            except (aiohttp.ClientError, OSError) as exc:
                outcome = Outcome.UPSTREAM_ERROR
                # A fixed text by kind: an exception's own text can name the agent's address.
                error = ReachError("upstream_error", "the agent's stream was cut short or "
                                   "malformed" if isinstance(exc, aiohttp.ClientPayloadError)
                                   else "the agent's connection closed mid-stream")

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
        except asyncio.CancelledError:
            pumping.cancel()
            if not request.scope.get(CLIENT_GONE):
                # Not its caller: this gateway is stopping, past its drain time. The caller
                # still reads, so it is told (and may send the call again elsewhere).
                outcome = Outcome.SERVICE_UNAVAILABLE
                stopping = ReachError("service_unavailable", "This gateway is stopping; "
                                      "send the call again.")
                with contextlib.suppress(Exception):
                    # Whole, so the caller's client reads the event and a complete reply.
                    await send({"type": "http.response.body",
                                "body": stopping.sse_event(ctx.request_id)})
            raise
        finally:
            watching.cancel()
            if outcome == Outcome.SUCCESS:
                # Read to its end: the connection serves the next call (a new connection
                # per stream cost more CPU than the rest of the call).
                upstream.response.release()
            else:
                upstream.response.close()  # drops the connection: cancels the agent's work
            upstream.done()
            # The caller's own deadline ending its stream is nothing against the agent, nor
            # is this gateway stopping.
            self.caller.record_stream(
                upstream, ok=None if outcome in (Outcome.DEADLINE_EXCEEDED,
                                                 Outcome.SERVICE_UNAVAILABLE)
                else outcome in (Outcome.SUCCESS, Outcome.CLIENT_CANCELLED))
            ctx.reported = meter.totals()  # the agent answered: what it streamed counts
        return outcome

    async def _meter(self, ctx: CallContext, admission, outcome: str) -> None:
        """One usage event per call, whatever its outcome (unless ``finish`` wrote it
        already), and the budget settlement. The agent's reported usage counts whenever
        it answered; a call it never answered costs nothing. Never raises."""
        self.finish(ctx, outcome)
        if not ctx.metered or admission is None or self.governor is None \
                or self.usage is None:
            return
        input_tokens, output_tokens = ctx.reported or (0, 0)
        await self.governor.settle(admission, Amount.of(
            requests=int(ctx.reported is not None), tokens=input_tokens + output_tokens,
            cost=_spent(ctx)))

    def finish(self, ctx: CallContext, outcome: str) -> None:
        """The call's final usage event (and its metrics), once. Written before a reply
        goes out: a process killed after the caller has its answer must leave the call's
        final event, not its open one (helper-54: 30 to 70 of 100 calls answered 200
        before a kill were metered worker_lost, at no cost, their events written after
        the reply and the budget settlement's round trip to Redis)."""
        if ctx.finished:
            return
        ctx.finished = True
        tracing.call_finished(ctx, str(outcome))
        if not ctx.metered:
            return
        observe.record(ctx, outcome)
        if self.governor is None or self.usage is None:
            return
        input_tokens, output_tokens = ctx.reported or (0, 0)
        TOKENS_IN.inc(input_tokens)
        TOKENS_OUT.inc(output_tokens)
        spooled, ctx.spooled = ctx.spooled, None
        self.usage.emit(self._usage_event(ctx, outcome, input_tokens, output_tokens,
                                          _spent(ctx)), spooled)

    @staticmethod
    def _usage_event(ctx: CallContext, outcome: str, input_tokens: int = 0,
                     output_tokens: int = 0, spent: float = 0.0) -> dict:
        if ctx.event_id is None:
            ctx.event_id = requestid.new_request_id()
        candidate = ctx.candidate
        return {
            "event_id": ctx.event_id,
            "request_id": ctx.request_id, "tenant": ctx.tenant_pk,
            "agent": candidate.agent.pk if candidate else None,
            "capability": candidate.capability.pk if candidate else None,
            "instance": candidate.instance.pk if candidate else None,
            "outcome": str(outcome), "input_tokens": input_tokens,
            "output_tokens": output_tokens, "cost": spent,
            "latency_ms": int((time.monotonic() - ctx.started) * 1000),
            "occurred_at": time.time(),
            "retries": max(0, len(ctx.attempts) - 1),
            "route_score": rounded(candidate.score, 4) if candidate is not None else None,
            "route_ms": _ms(ctx.started, ctx.routed),
            "upstream_ms": _ms(ctx.sent, ctx.answered),
            "first_byte_ms": _ms(ctx.started, ctx.first_byte),
        }


def _spent(ctx: CallContext) -> float:
    """What the call cost at its agent's prices: nothing unless the agent answered."""
    if ctx.candidate is None or ctx.reported is None:
        return 0.0
    return cost(ctx.candidate, *ctx.reported)


T = TypeVar("T")
# Storing a keyed reply again after Redis failed to take it (``_store_later``).
STORE_AGAIN_EVERY_S = 0.5
UNSTORED_FOR_S = 3600.0
UNSTORED_MAX = 10_000


async def within_deadline(ctx: CallContext, step: Awaitable[T]) -> T:
    """``step`` (what the gateway does before the agent is asked: admission, the
    idempotency claim) ends with the call's budget when the caller gave a deadline: a
    hung Redis held calls with a 500 ms deadline for 3 to 4 s (a break test), and, its
    re-test, a 3,000 ms deadline on a 3,000 ms capability for 5 s. Cut short, it is the
    caller's 504 ``deadline_exceeded`` (or, when the agent's shorter timeout was the
    budget, the gateway's 503); what it left in Redis (a reservation, a claim) lapses
    with its lease."""
    if not ctx.caller_budget_ms:
        return await step
    deadline = asyncio.timeout(max(0.0, ctx.remaining_ms() / 1000))
    try:
        async with deadline:
            return await step
    except TimeoutError:
        if not deadline.expired():
            raise
        if ctx.caller_budget_ms <= ctx.budget_ms:
            raise ReachError("deadline_exceeded", f"The caller's budget of "
                             f"{ctx.caller_budget_ms} ms ran out.") from None
        raise ReachError("service_unavailable", "The gateway could not forward the call "
                         "within its budget; retry shortly.") from None


def _fingerprint(request: Request) -> str:
    """The request as its Idempotency-Key must stay bound to (``idempotency.fingerprint``)."""
    return idempotency.fingerprint(request.raw, header(request.scope, b"x-reach-intent"))


async def _raise(error: ReachError):
    raise error


def _refuse_if_taken(outcome: idempotency.Outcome, lease_s: float) -> None:
    """422 for a key claimed with another body; 409 while another request holds it."""
    if outcome == idempotency.Outcome.MISMATCH:
        raise ReachError("idempotency_key_reused",
                         "This Idempotency-Key was used with a different request body.")
    if outcome == idempotency.Outcome.BUSY:
        raise ReachError("idempotency_in_progress",
                         "A request with this Idempotency-Key is still running.",
                         retry_after=max(1, round(lease_s)))


def _ms(start: float | None, end: float | None) -> float | None:
    return rounded((end - start) * 1000, 3) if start is not None and end is not None else None


MAX_OUTPUT_CEILING = 10_000_000


def ceiling(candidate: Candidate, payload: dict) -> Callable[[], Amount]:
    """The most a call may use, reserved against budgets: one request, an upper bound on
    its input tokens (its size in bytes: no tokenizer makes a token of less than a byte),
    the output ceiling it asked for (``max_tokens``, any positive number, capped), and
    their cost. Computed only when a budget applies."""
    def compute() -> Amount:
        input_tokens = len(orjson.dumps(payload))
        asked = payload.get("max_tokens") or payload.get("max_completion_tokens")
        output_tokens = 0
        if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0:
            # Capped before ceil: a float infinity has no integer ceiling.
            output_tokens = MAX_OUTPUT_CEILING if asked > MAX_OUTPUT_CEILING \
                else math.ceil(asked)
        return Amount.of(requests=1, tokens=input_tokens + output_tokens,
                         cost=cost(candidate, input_tokens, output_tokens))
    return compute


async def check_callback_url(url: object, policy) -> None:
    """A callback URL as safe as an agent's endpoint, its name resolved now (and again at
    delivery): 400 naming ``callback_url`` otherwise."""
    if not isinstance(url, str) or len(url) > 2048:
        raise ReachError("invalid_input", "'callback_url' must be a URL of at most 2048 "
                         "characters.", details={"callback_url": ["not a URL"]})
    try:
        await asyncio.to_thread(resolve_and_check_target, url, policy)
    except EndpointRefused as exc:
        raise ReachError("invalid_input", f"callback_url is refused: {exc}",
                         details={"callback_url": [str(exc)]}) from None
    except OSError:
        raise ReachError("invalid_input", "callback_url's host does not resolve.",
                         details={"callback_url": ["does not resolve"]}) from None


def _code_of(body: bytes) -> str:
    try:
        return orjson.loads(body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return Outcome.INTERNAL_ERROR


def cost(candidate: Candidate, input_tokens: int, output_tokens: int) -> float:
    agent = candidate.agent
    return rounded(agent.price_per_call + input_tokens / 1000 * agent.price_input_per_1k
                   + output_tokens / 1000 * agent.price_output_per_1k, 6)


def deadline_header(scope: dict) -> int | None:
    """The caller's ``X-Reach-Deadline-Ms``, on every door that calls an agent."""
    raw = header(scope, b"x-reach-deadline-ms")
    if raw is None:
        return None
    if not raw.strip().isdigit() or int(raw) <= 0:
        raise ReachError("invalid_input", "X-Reach-Deadline-Ms must be a positive integer.")
    return int(raw)


def suggested(decision, table: RouteTable, route: RouteRequest) -> dict | None:
    """An intent nothing matched: the closest capabilities the caller may see."""
    shown = [{"capability": s.capability_id, "score": s.score} for s in decision.suggestions
             if capability_visible(table, route.tenant_pk, s.capability_id)]
    return {"suggestions": shown} if shown else None


def route_message(decision, table: RouteTable, route: RouteRequest) -> str:
    """Why routing failed, naming a capability only if the caller named it or may see it."""
    named = decision.capability
    if named and named != route.capability and not capability_visible(
            table, route.tenant_pk, named):
        named = None
    if decision.error == "service_unavailable":
        return ("Routing by intent is starting up: the intent index is still being built. "
                "Retry in a moment, or name a capability.")
    if decision.error == "no_capability":
        if named:
            return f"No agent offers {named!r} to this tenant."
        return "No capability matches this request."
    if named:
        return f"No healthy instance can serve {named!r} now."
    return "No healthy instance can serve this request now."


def routed_headers(ctx: CallContext) -> list[tuple[bytes, bytes]]:
    """An intent call's routing, on any door's reply (an OpenAI-shaped body has no place
    for it): the capability it reached, how sure that was, and a plan's steps."""
    sureness = ctx.sureness
    if sureness is None:
        return []
    out = [(b"x-reach-capability", ctx.candidate.capability.capability_id.encode()),
           (b"x-reach-confidence", str(sureness["confidence"]).encode()),
           (b"x-reach-margin", str(sureness["margin"]).encode())]
    if ctx.plan:
        out.append((b"x-reach-plan", ",".join(ctx.plan).encode()))
    return out
