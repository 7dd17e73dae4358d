"""The upstream caller: one attempt at an agent, and reading its reply.

It opens and reads; policy (which instance, whether to retry, admission,
metering) is the pipeline's (``gateway.pipeline``). Every outcome feeds the
instance's circuit breaker and the router's success and latency feedback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from gateway import tracing
from gateway.breaker import CircuitBreakers
from gateway.config import GatewayConfig
from gateway.credentials import Credentials
from gateway.http_io import wide_integer
from gateway.metrics import BAD_RESPONSES, UPSTREAM_LATENCY
from gateway.protocols import PROTOCOLS, AgentResponse
from gateway.protocols.base import thaw
from gateway.sse import collected
from gateway.tasks import TaskRef
from gateway.tunnel import TunnelHub
from gateway.upstream import (
    UpstreamFailure,
    UpstreamPools,
    read_limited,
    reset_before_sent,
    translate_error,
    upload_tracker,
)
from reach_core.errors import ReachError
from reach_core.schemas import MAX_CHECKS_PER_CALL, checks_per_value, parts_of, validator_for
from routing.router import Candidate, Feedback
from routing.table import CapabilityEntry, RouteTable


@dataclass
class CallContext:
    request_id: str
    tenant_pk: int
    tenant_slug: str
    started: float  # time.monotonic()
    budget_ms: int  # set by bind_budget once the capability is known
    caller_budget_ms: int | None  # the caller's X-Reach-Deadline-Ms
    # The caller's Idempotency-Key: it makes a retry safe, and travels to the agent
    # (the same value on the retry) so the agent can de-duplicate too.
    idempotency_key: str | None
    caller_bound: bool = False  # the caller's budget, not the agent's timeout, binds
    attempts: list[int] = field(default_factory=list)  # instance pks tried
    # Whether another instance could take a retry (the route said so): only then does
    # a keyed call's first attempt leave room for one.
    retry_elsewhere: bool = True
    candidate: Candidate | None = None  # the last one tried
    # An intent that asked for several steps: their capabilities, in order (the call
    # runs the first; the caller runs the rest).
    plan: tuple[str, ...] = ()
    # An intent decision's confidence and margin (and each plan step's confidence).
    sureness: dict | None = None
    admission: Any = None  # the governor's, for the candidate being tried
    # The agent's reported usage (input, output tokens) once it answered; None before.
    reported: tuple[int, int] | None = None
    task: TaskRef | None = None  # a task's attempt: told to the agent
    metered: bool = True  # False: not a call of its own (a task's submission)
    intent: bool = False  # routed by an intent rather than a named capability
    # The call's moments (time.monotonic(), None until they happen): the route decided,
    # the last attempt sent and its answer's status line in, and a stream's first event
    # relayed. ``entered_at`` is the wall clock at ``started``.
    # The capability a call was for when none of its instances could take it.
    capability_id: str | None = None
    routed: float | None = None
    sent: float | None = None
    answered: float | None = None
    first_byte: float | None = None
    entered_at: float = field(default_factory=time.time)
    # Its usage event's id, and its open line in the usage spool once it went to an
    # agent (``gateway.usage_spool``): what it is metered if this process dies first.
    event_id: str | None = None
    spooled: Any = None
    # Its final usage event is written (before its reply went out, or at its end).
    finished: bool = False
    # Tracing (gateway.tracing): the caller's W3C trace headers, and while tracing is on
    # the call's span and its current attempt's.
    traceparent: str | None = None
    tracestate: str | None = None
    span: Any = None
    attempt_span: Any = None

    @property
    def idempotent(self) -> bool:
        return self.idempotency_key is not None

    def bind_budget(self, agent_budget_ms: int) -> None:
        """The call's budget: the agent's timeout, capped by the caller's deadline."""
        caller = self.caller_budget_ms
        self.caller_bound = bool(caller and caller < agent_budget_ms)
        self.budget_ms = min(agent_budget_ms, caller) if caller else agent_budget_ms

    def restart_agent_clock(self) -> None:
        """Time spent before the agent was asked (waiting for an idempotency claim) does
        not count against the agent's own timeout; a caller's deadline keeps running."""
        if not self.caller_budget_ms:
            self.budget_started = time.monotonic()

    def remaining_ms(self) -> float:
        return self.budget_ms - (time.monotonic() - self.budget_started) * 1000

    def __post_init__(self) -> None:
        self.budget_started = self.started

    def timed_out(self) -> ReachError:
        if self.caller_bound:
            return ReachError("deadline_exceeded",
                              f"The caller's budget of {self.budget_ms} ms ran out.")
        return ReachError("upstream_timeout",
                          f"The agent did not answer within {self.budget_ms} ms.")


def refusal(status: int) -> ReachError:
    """An agent's own 4xx, classified for the caller: its input was refused (400, 422:
    sending it again cannot help), the agent is busy (408, 429: later may), or it
    refused the call for a reason of its own (credentials, a missing route)."""
    if status in (400, 422):
        return ReachError("invalid_input", f"the agent refused the input (HTTP {status})")
    if status in (408, 429):
        return ReachError("upstream_error", f"the agent is busy (HTTP {status})")
    return ReachError("upstream_refused", f"the agent refused the call (HTTP {status})")


UNUSABLE = "cannot be checked: the schema is not usable (see its registration)"


class Validators:
    """Compiled JSON Schema validators, one per schema object in the table."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[object, Any]] = {}

    def errors(self, schema, instance) -> dict[str, list[str]]:
        if not schema:
            return {}
        cached = self._cache.get(id(schema))
        if cached is None or cached[0] is not schema:
            plain = thaw(schema)
            cached = (schema, validator_for(plain), checks_per_value(plain) or 1)
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[id(schema)] = cached
        if cached[1] is None:  # its checks would multiply (``validator_for``)
            return {"$": [UNUSABLE]}
        # Checking runs on the event loop: its cost is bounded before it starts.
        most = MAX_CHECKS_PER_CALL // cached[2]
        if parts_of(instance, most) > most:
            return {"$": [f"too large to check against this schema: more than {most} "
                          f"values (this schema checks each against up to {cached[2]} "
                          "subschemas)"]}
        problems: dict[str, list[str]] = {}
        try:
            errors = list(cached[1].iter_errors(instance))
        except Exception:  # a schema registered before it was checked (a remote $ref...)
            return {"$": [UNUSABLE]}
        for error in errors:
            where = list(error.absolute_path)
            if error.validator == "required":
                # At each missing field itself: that is what the caller must add.
                found = [([*where, n], "is required") for n in error.validator_value
                         if n not in error.instance]
            else:
                found = [(where, error.message)]
            for parts, message in found:
                path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                               for p in parts).lstrip(".") or "$"
                if message not in problems.setdefault(path, []):
                    problems[path].append(message)
        return problems


def upstream_url(endpoint: str, path: str) -> str:
    """``endpoint`` + ``path``, written once where they overlap by a version segment.

    OpenAI-compatible endpoints are registered as the SDK's ``base_url``
    (``http://host:8080/v1``) and the protocol's path is ``/v1/chat/completions``: the
    ``/v1`` both carry is said once, not twice."""
    base = endpoint.rstrip("/")
    tail = path.lstrip("/")
    last = base.rsplit("/", 1)[-1]
    if last[:1] == "v" and last[1:].isdigit() and tail.startswith(last + "/"):
        tail = tail[len(last) + 1:]
    return f"{base}/{tail}"


def to_agent_names(capability: CapabilityEntry, payload: dict) -> dict:
    """Canonical parameter names (``dest_lang``) back to the agent's own (``target_lang``)."""
    if not capability.param_map:
        return payload
    out = dict(payload)
    for canonical, own in capability.param_map.items():
        if canonical in out and canonical != own:
            out[own] = out.pop(canonical)
    return out


# The loop's timers may fire a hair early: a budget this close to its end is spent.
TIMER_SLACK_S = 0.005


@dataclass
class Upstream:
    """An open upstream reply: the gateway reads it (JSON) or relays it (stream)."""

    candidate: Candidate
    response: Any  # gateway.h1.H1Response, aiohttp's or a tunnel's: the same reading
    started: float
    slot: Any = None  # the agent's connection slot, given back by ``done``
    budget_s: float = 0.0  # what this attempt had to answer in, whole reply included

    def done(self) -> None:
        """Give the connection slot back (idempotent); the response is released apart."""
        slot, self.slot = self.slot, None
        if slot is not None:
            slot.release()


class Caller:
    def __init__(self, *, config: GatewayConfig, breakers: CircuitBreakers,
                 feedback: Feedback, credentials: Credentials,
                 tunnels: TunnelHub | None = None) -> None:
        self.config = config
        self.tunnels = tunnels  # calls to tunnelled instances go through it
        self.breakers = breakers
        self.feedback = feedback
        self.credentials = credentials
        self.pools = UpstreamPools(config.policy, connect_timeout_s=config.connect_timeout_s)
        self.validators = Validators()
        # capability pk -> how long its answers usually take (ms, a moving average over
        # every instance): what a keyed call's first attempt must be given.
        self._usual_ms: dict[int, float] = {}

    def attempt_budget_ms(self, ctx: CallContext) -> float:
        """What this attempt may spend. A keyed call's first attempt gets
        ``first_attempt_share`` of what is left, so that after a time-out the one retry
        on another instance still fits in the budget — when there is another instance,
        and at least twice the capability's usual latency; any other attempt gets it all
        (an unkeyed call that timed out after delivery is never retried, with one
        instance a keyed call has nowhere to retry, and a task retries on its own)."""
        remaining = ctx.remaining_ms()
        if not self.shares_budget(ctx) or ctx.candidate is None:
            return remaining
        first = remaining * self.config.first_attempt_share
        # A capability that usually needs more than the share would time out on every
        # healthy instance (a break test: a 20 s agent, 30 s timeout, two instances, 504
        # after running twice): it gets twice its usual time, up to all of it. Its own
        # time where known, not its instance's: a fast capability beside it made a slow
        # one's instance look quick (a break test: 2.2 s, keyed, 504 after running on
        # both instances).
        usual = self._usual_ms.get(ctx.candidate.capability.pk)
        if usual is None:
            # Its time not known yet, on an instance known to answer: more likely slow
            # than hung, so it gets all of it.
            return first if self.feedback.latency(ctx.candidate.instance.pk) is None \
                else remaining
        return max(first, min(remaining, 2 * usual))

    def _answered_in(self, capability_pk: int, started: float) -> None:
        took = (time.monotonic() - started) * 1000
        usual = self._usual_ms.get(capability_pk)
        self._usual_ms[capability_pk] = took if usual is None else 0.8 * usual + 0.2 * took

    @staticmethod
    def shares_budget(ctx: CallContext) -> bool:
        """Whether this attempt may get less than all that is left (see
        ``attempt_budget_ms``); otherwise its time running out is the call's. A task's
        attempt has the task's own retries, later and elsewhere."""
        return ctx.idempotent and len(ctx.attempts) == 1 and ctx.retry_elsewhere \
            and ctx.task is None

    def downstream_budget_ms(self, ctx: CallContext, remaining: float) -> int:
        margin = min(self.config.deadline_margin_ms, remaining * self.config.deadline_margin_share)
        return max(1, int(remaining - margin))

    async def attempt(self, table: RouteTable, candidate: Candidate, payload: dict,
                      ctx: CallContext, *, stream: bool) -> Upstream:
        """One attempt: send the call and return once the agent's status line is in.
        Raises ``UpstreamFailure`` (the pipeline may retry it) or ``ReachError``."""
        instance, agent = candidate.instance, candidate.agent
        if not self.breakers.allow(instance.pk):
            raise UpstreamFailure("circuit_open", "the instance's circuit breaker is open",
                                  delivered=False)
        remaining = self.attempt_budget_ms(ctx)
        if remaining <= 0:
            if len(ctx.attempts) == 1 and not ctx.caller_bound:
                # Nothing was sent: the gateway itself (a slow Redis during admission)
                # spent the agent's time. Not the agent's failure, and worth a retry.
                raise ReachError("service_unavailable", "The gateway could not forward the "
                                 "call within its budget; retry shortly.")
            raise ctx.timed_out()
        upstream = PROTOCOLS[agent.protocol].request(agent, candidate.capability, payload,
                                                     stream=stream, request_id=ctx.request_id,
                                                     task=ctx.task)
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if stream else "application/json",
            "x-request-id": ctx.request_id,
            "x-reach-deadline-ms": str(self.downstream_budget_ms(ctx, remaining)),
            "x-reach-tenant": ctx.tenant_slug,
            "x-reach-capability": candidate.capability.capability_id,
        }
        if ctx.idempotency_key is not None:
            headers["idempotency-key"] = ctx.idempotency_key
        if ctx.task is not None:
            headers["x-reach-task-id"] = ctx.task.task_id
        tracing.attempt_started(ctx, candidate, int(headers["x-reach-deadline-ms"]), headers)
        query: dict[str, str] = {}
        ssl_context = self.credentials.apply(table, ctx.tenant_pk, agent.pk, headers, query)
        url = upstream_url(instance.endpoint, upstream.path)
        if instance.reach_mode == "tunnel" and self.tunnels is not None:
            session = self.tunnels.session(instance.pk)
        else:
            session = self.pools.session(agent.pk, agent.pool_max_connections,
                                         agent.pool_idle_seconds)
        try:
            slot = await self.pools.slot(agent.pk, agent.pool_max_connections,
                                         min(self.config.upstream_wait_s, remaining / 1000))
        except TimeoutError:
            raise ReachError("upstream_busy", f"All {agent.pool_max_connections} connections "
                             "to this agent are busy; retry shortly.") from None
        try:
            return await self._send(session, url, upstream, headers,
                                    query, ssl_context, remaining, candidate, ctx, stream,
                                    slot)
        except BaseException:
            slot.release()
            raise

    async def _send(self, session, url: str, upstream, headers: dict, query: dict,
                    ssl_context, remaining: float, candidate: Candidate, ctx: CallContext,
                    stream: bool, slot) -> Upstream:
        instance = candidate.instance
        seconds = remaining / 1000
        timeout = aiohttp.ClientTimeout(
            total=None if stream else seconds,
            sock_connect=min(self.config.connect_timeout_s, seconds),
            # A stream's clock is its idle time between events; the first byte must
            # still come within the budget.
            sock_read=min(self.config.stream_idle_timeout_s, seconds) if stream else None,
        )
        started = ctx.sent = time.monotonic()
        # aiohttp's (TLS) needs a tracker to tell a reset before the body was out;
        # gateway.h1 (plain HTTP) knows it itself.
        tracker = None if url.startswith("http://") else upload_tracker()
        # Until its status line is in, the attempt is unanswered: the router prefers other
        # instances over one that leaves calls unanswered (a hung or stopped process).
        waiting = self.feedback.sent(instance.pk)
        answered = timed_out = False
        try:
            # aiohttp's own total timeout covers sending and reading the body: no
            # extra timer or task per call on the hot path.
            response = await session.post(
                url, data=orjson.dumps(upstream.body), headers=headers,
                params=query or None, allow_redirects=False, timeout=timeout,
                ssl=ssl_context if ssl_context is not None else True,
                **({"upload_tracker": tracker} if tracker is not None else {}))
            answered = True
            ctx.answered = time.monotonic()
        except TimeoutError as exc:
            # The call's own time ran out when this attempt had all of it and it was not
            # a shorter connect time-out. Read from the clock instead, it was misjudged:
            # the loop's timers run in whole milliseconds and fire up to one early.
            shared = self.shares_budget(ctx)
            connecting = isinstance(exc, aiohttp.ConnectionTimeoutError)
            spent = not shared and not connecting
            # Unanswered is the agent's mark only when its own time ran out, as for
            # the breaker: a caller's short deadline must not steer everyone's routing.
            timed_out = self._record_timeout(instance.pk, ctx, started=started,
                                             budget_s=seconds, spent=spent)
            if shared and not connecting and not stream:
                # It takes at least that long: the next keyed call gives it more (a slow
                # agent on instances that never answered in time would fail each call).
                self._answered_in(candidate.capability.pk, started)
            if spent or ctx.remaining_ms() <= 1:
                raise ctx.timed_out() from exc
            raise translate_error(exc) from exc
        except (aiohttp.ClientError, OSError) as exc:
            self._record(instance.pk, ok=False, started=started)
            if await reset_before_sent(exc, tracker):
                raise UpstreamFailure(
                    "upstream_error", "the agent reset the connection before it had the "
                    "whole request", delivered=False) from exc
            raise translate_error(exc) from exc
        finally:
            self.feedback.settled(instance.pk, waiting, answered=answered,
                                  timed_out=timed_out,
                                  lease_expires_at=instance.lease_expires_at)
        if response.status >= 500:
            response.release()
            self._record(instance.pk, ok=False, started=started)
            raise UpstreamFailure("upstream_error",
                                  f"the agent answered HTTP {response.status}", delivered=True)
        if 300 <= response.status < 400:
            response.release()
            self._record(instance.pk, ok=True, started=started)
            raise ReachError("upstream_bad_response",
                               f"the agent answered a redirect (HTTP {response.status}); "
                               "redirects are not followed")
        if response.status >= 400:
            response.release()
            self._record(instance.pk, ok=True, started=started)
            raise refusal(response.status)
        return Upstream(candidate=candidate, response=response, started=started, slot=slot,
                        budget_s=seconds)

    async def read(self, upstream: Upstream, ctx: CallContext) -> AgentResponse:
        """Read and parse a non-streamed reply, within the budget and the size limit."""
        instance = upstream.candidate.instance
        try:
            limit = self.config.max_upstream_bytes
            body = await read_limited(  # within the call's timeout
                upstream.response, limit, f"the agent's reply is larger than {limit} bytes")
        except TimeoutError as exc:
            self._record_timeout(instance.pk, ctx, started=upstream.started,
                                 budget_s=upstream.budget_s,
                                 spent=not self.shares_budget(ctx))
            raise ctx.timed_out() from exc
        except (aiohttp.ClientError, OSError) as exc:
            self._record(instance.pk, ok=False, started=upstream.started)
            failure = translate_error(exc)
            raise ReachError(failure.code, failure.message) from exc
        finally:
            upstream.response.release()
            upstream.done()
        self._record(instance.pk, ok=True, started=upstream.started)
        self._answered_in(upstream.candidate.capability.pk, upstream.started)
        _upstream_timer(upstream.candidate.agent.protocol).observe(
            time.monotonic() - upstream.started)
        if upstream.response.status == 202 and not body.strip():
            ctx.reported = (0, 0)
            return AgentResponse(state="working")  # accepted, nothing more said
        agent = upstream.candidate.agent
        protocol = PROTOCOLS[agent.protocol]
        meter = None
        if agent.protocol == "http" and upstream.response.content_type == "text/event-stream":
            # A plain agent that streams whatever it is asked (an SDK generator) answered
            # a call that did not ask for a stream: its events, read whole, are the reply.
            meter = protocol.stream_meter()
            data = await collected(body, meter)
        else:
            try:
                data = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                BAD_RESPONSES.labels(upstream.candidate.capability.capability_id).inc()
                raise ReachError("upstream_bad_response",
                                 "the agent's reply is not JSON") from exc
            if wide_integer(body):  # it would reach the caller rounded
                BAD_RESPONSES.labels(upstream.candidate.capability.capability_id).inc()
                raise ReachError("upstream_bad_response", "the agent's reply holds an "
                                 "integer outside -2^63 to 2^64-1, which cannot be "
                                 "forwarded exactly")
        try:
            reply = protocol.parse(agent, upstream.candidate.capability, data)
            if meter is not None:  # what its events reported (or said): in the reply too
                reply.input_tokens, reply.output_tokens = meter.totals()
            ctx.reported = (reply.input_tokens, reply.output_tokens)
            if reply.state is None and upstream.response.status == 202:
                reply.state = "working"  # accepted: the agent reports the rest later
        except ReachError as error:
            if error.kind.code == "upstream_bad_response":
                BAD_RESPONSES.labels(upstream.candidate.capability.capability_id).inc()
            raise
        problems = self.validators.errors(upstream.candidate.capability.output_schema,
                                          reply.output)
        if problems:
            BAD_RESPONSES.labels(upstream.candidate.capability.capability_id).inc()
            detail = "; ".join(f"{p}: {' '.join(m)}" for p, m in problems.items())
            raise ReachError("upstream_bad_response",
                               f"the agent's output does not match its output_schema: {detail}")
        return reply

    def _record_timeout(self, instance_pk: int, ctx: CallContext, *, started: float,
                        budget_s: float, spent: bool) -> bool:
        """Whether a time-out counts against the agent's standing in routing (its
        "unanswered" mark, its success rate), and records it. When the budget that ran
        out was one the caller cut short, only if the agent also outwaited its patience
        (4 x its usual latency, at least 100 ms), so a hung agent is still passed over
        when every caller sends a deadline; and never on its breaker, which refuses every
        caller: one caller's deadline, shorter than what its own requests take, opened a
        healthy agent's breaker for all (helper-50: eleven calls cut at 100 ms)."""
        waited = time.monotonic() - started
        if ctx.caller_bound and (spent or waited >= budget_s - TIMER_SLACK_S):
            self.breakers.no_verdict(instance_pk)
            if waited < self.feedback.patience_s(instance_pk):
                return False
            self.feedback.record(instance_pk, ok=False, latency_ms=waited * 1000)
            return True
        self._record(instance_pk, ok=False, started=started)
        return True

    def _record(self, instance_pk: int, *, ok: bool, started: float) -> None:
        self.breakers.record(instance_pk, ok=ok)
        self.feedback.record(instance_pk, ok=ok, latency_ms=(time.monotonic() - started) * 1000)

    def record_stream(self, upstream: Upstream, *, ok: bool | None) -> None:
        """``ok`` None: the stream ended for a reason that says nothing of the agent."""
        if ok is not None:
            self._record(upstream.candidate.instance.pk, ok=ok, started=upstream.started)
        else:
            self.breakers.no_verdict(upstream.candidate.instance.pk)


_UPSTREAM_TIMERS: dict[str, object] = {}


def _upstream_timer(protocol: str):
    """The upstream-latency histogram of one protocol, looked up in prometheus_client once
    (a lookup there takes a lock and builds a tuple on every call)."""
    timer = _UPSTREAM_TIMERS.get(protocol)
    if timer is None:
        timer = _UPSTREAM_TIMERS[protocol] = UPSTREAM_LATENCY.labels(protocol)
    return timer
