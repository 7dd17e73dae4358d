"""The gateway's ASGI application (the data plane).

ASGI contract: serves ``http`` scopes for ``/v1/…`` and ``/metrics``; reads
``http.request`` messages itself (no buffering framework, so a body over the
limit is refused as it arrives) and watches ``http.disconnect`` while it
streams, cancelling the upstream call at once. Every failure is the
structured error of ``reach_core.errors``. The app reads only the route table
it is given: it never imports Django or the ORM.

Routes: ``POST /v1/invoke``, ``POST /v1/chat/completions``, ``GET /v1/route``,
``GET /metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from urllib.parse import parse_qs

import aiohttp
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway import chat, idempotency
from gateway.adapters import AgentResponse
from gateway.auth import authenticate
from gateway.breaker import BreakerState, CircuitBreakers
from gateway.calls import CallContext, Caller, Upstream, to_agent_names
from gateway.config import GatewayConfig
from gateway.credentials import Credentials
from gateway.governance import Governor, MemoryUsageCounters
from gateway.limits import InProcessLimiter
from gateway.metrics import (
    BREAKERS,
    CALLS,
    IDEMPOTENT_REPLAYS,
    LATENCY,
    LIMITS_DEGRADED,
    REGISTRY,
    TABLE_VERSION,
    TOKENS,
)
from gateway.sse import EventFramer, StreamUsage, data_of, error_event
from gateway.usage import UsageQueue
from reach_core import requestid
from reach_core.errors import ReachError
from routing.router import Candidate, Router, RouteRequest
from routing.table import RouteTable

logger = logging.getLogger(__name__)
TOKENS_IN, TOKENS_OUT = TOKENS.labels("input"), TOKENS.labels("output")


def header(scope, name: bytes) -> str | None:
    """A request header by lower-case name (the last one wins), parsed once per request."""
    headers = scope.get("reach.headers")
    if headers is None:
        headers = scope["reach.headers"] = {
            key.lower(): value for key, value in scope.get("headers", [])}
    value = headers.get(name)
    return value.decode("latin-1") if value is not None else None


async def send_json(send, status: int, body: dict, request_id: str) -> None:
    await send_bytes(send, status, orjson.dumps(body), request_id)


class GatewayApp:
    def __init__(self, *, table: Callable[[], RouteTable], router: Router,
                 config: GatewayConfig, breakers: CircuitBreakers | None = None,
                 usage: UsageQueue | None = None, idempotency_store=None,
                 governor: Governor | None = None, governed: bool = True) -> None:
        self._table = table
        # Off only to measure what limits and metering cost (bench/metering.py).
        self.governed = governed
        self.governor = governor or Governor(
            limiter=InProcessLimiter(), counters=MemoryUsageCounters(),
            on_degraded=LIMITS_DEGRADED.inc)
        self.idempotency = idempotency_store or idempotency.MemoryStore()
        # Coroutines to run for the process's lifetime (usage shipping), started with
        # the first request: uvicorn may run without the lifespan protocol.
        self.background: list = []
        self._tasks: list[asyncio.Task] | None = None
        self.router = router
        self.config = config
        self.breakers = breakers or CircuitBreakers()
        self.feedback = router.feedback
        self.usage = usage or UsageQueue()
        self.caller = Caller(config=config, router=router, breakers=self.breakers,
                             feedback=self.feedback,
                             credentials=Credentials(config.credential_keys))

    # ---- ASGI -------------------------------------------------------------------------

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if self._tasks is None:
            self._tasks = [asyncio.ensure_future(job()) for job in
                           (*self.background, self.governor.flush_forever)]
        request_id = requestid.accept_or_new(header(scope, b"x-request-id"))
        path, method = scope["path"].rstrip("/"), scope["method"]
        started = time.monotonic()
        endpoint = path.rsplit("/", 1)[-1] or "root"
        outcome = "success"
        try:
            if sum(len(k) + len(v) for k, v in scope.get("headers", [])) \
                    > self.config.max_header_bytes:
                raise ReachError("headers_too_large",
                                   f"Request headers exceed {self.config.max_header_bytes} bytes.")
            if path == "/metrics" and method == "GET":
                await self._metrics(send)
                return
            if path == "/v1/route":
                self._only(method, "GET", "HEAD")
                await send_json(send, 200, {"request_id": request_id,
                                            **self.dry_run(scope)}, request_id)
            elif path == "/v1/invoke":
                self._only(method, "POST")
                await self.invoke(scope, receive, send, request_id)
            elif path == "/v1/chat/completions":
                self._only(method, "POST")
                await chat.completions(self, scope, receive, send, request_id)
            else:
                raise ReachError("not_found", f"No gateway route for {method} {scope['path']}")
        except ReachError as error:
            outcome = error.kind.code
            body = error.body(request_id)
            if error.explain is not None:
                body["route"] = error.explain
            retry_after = getattr(error, "retry_after", None)
            await send_bytes(send, error.kind.status, orjson.dumps(body), request_id,
                             extra=[(b"retry-after", str(retry_after).encode())]
                             if retry_after else None)
        except asyncio.CancelledError:
            outcome = "client_cancelled"
            raise
        except Exception:
            outcome = "internal_error"
            logger.exception("gateway failure (request %s)", request_id)
            error = ReachError("internal_error", "The gateway failed; it has been logged.")
            await send_json(send, 500, error.body(request_id), request_id)
        finally:
            if endpoint != "metrics":
                count_call(endpoint, outcome, time.monotonic() - started)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.caller.pools.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    @staticmethod
    def _only(method: str, *allowed: str) -> None:
        if method not in allowed:
            raise ReachError("method_not_allowed", f"Use {' or '.join(allowed)}.")

    async def read_body(self, scope, receive) -> bytes:
        """The request body, refused with 413 as soon as it passes the limit."""
        limit = self.config.max_body_bytes
        declared = header(scope, b"content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ReachError("payload_too_large", f"Request body exceeds {limit} bytes.")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise asyncio.CancelledError
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                raise ReachError("payload_too_large", f"Request body exceeds {limit} bytes.")
            chunks.append(body)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def read_json(self, scope, receive) -> dict:
        return parse_json(await self.read_body(scope, receive))

    async def idempotently(self, send, request_id: str, tenant_pk: int, idempotency_key: str,
                           raw: bytes, run) -> None:
        """Run ``run()`` (returning the reply dict) at most once per (tenant, key); replay
        its stored response to duplicates. See ``gateway.idempotency``."""
        if len(idempotency_key) > 255:
            raise ReachError("invalid_input", "Idempotency-Key is longer than 255 characters.")
        store = self.idempotency
        key, body_hash = idempotency.record_key(tenant_pk, idempotency_key), \
            idempotency.fingerprint(raw)
        outcome, stored = await store.claim(key, body_hash)
        if outcome == idempotency.Outcome.BUSY:
            outcome, stored = await idempotency.wait_for_first(store, key, body_hash, 30.0)
        if outcome == idempotency.Outcome.MISMATCH:
            raise ReachError("idempotency_key_reused",
                               "This Idempotency-Key was used with a different request body.")
        if outcome == idempotency.Outcome.BUSY:
            raise ReachError("idempotency_in_progress",
                               "A call with this Idempotency-Key is still running.")
        if outcome == idempotency.Outcome.REPLAY:
            IDEMPOTENT_REPLAYS.inc()
            await send_bytes(send, stored.status, stored.body, request_id,
                             extra=[(b"idempotent-replayed", b"true")])
            return
        try:
            reply = await run()
        except ReachError as error:
            if error.kind.status >= 500:
                await store.forget(key)  # nothing definite happened: let a retry run
            else:
                await store.finish(key, idempotency.Stored(
                    error.kind.status, orjson.dumps(error.body(request_id))))
            raise
        except BaseException:
            await store.forget(key)
            raise
        payload = orjson.dumps(reply)
        await store.finish(key, idempotency.Stored(200, payload))
        await send_bytes(send, 200, payload, request_id)


    async def _metrics(self, send) -> None:
        TABLE_VERSION.set(self._table().version)
        BREAKERS.clear()
        for pk, state in self.breakers.states().items():
            BREAKERS.labels(str(pk)).set(1.0 if state == BreakerState.OPEN else 0.5)
        payload = generate_latest(REGISTRY)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode())]})
        await send({"type": "http.response.body", "body": payload})

    # ---- dry run ------------------------------------------------------------------------

    def dry_run(self, scope) -> dict:
        """``GET /v1/route?capability=…|intent=…``: ranked candidates, scores, drop reasons."""
        table = self._table()
        key = authenticate(table, header(scope, b"authorization"))
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        request = route_request(key.tenant_pk, query,
                                namespace=header(scope, b"x-reach-namespace"),
                                internal=self.config.is_internal((scope.get("client") or
                                                                  (None,))[0]))
        decision = self.router.route(table, request, pick=False)
        explained = {"table_version": table.version, **decision.explain()}
        if decision.error:
            raise ReachError(decision.error, route_message(decision), explain=explained)
        return explained

    # ---- invoke -------------------------------------------------------------------------

    def begin(self, scope, table: RouteTable, route: RouteRequest, payload,
              request_id: str, tenant_pk: int) -> tuple[Candidate, dict, CallContext]:
        """Route, validate and map the input; returns the first candidate, the payload in
        the agent's names, and the call's context (deadline, retry policy).

        ``payload`` is the input, or a function of the chosen candidate returning it
        (the chat door shapes it by the agent's protocol)."""
        decision = self.router.route(table, route)
        if decision.error:
            raise ReachError(decision.error, route_message(decision))
        candidate = decision.chosen
        if callable(payload):
            payload = payload(candidate)
        capability = candidate.capability
        problems = self.caller.validators.errors(capability.input_schema, payload)
        if problems:
            message = "; ".join(f"{p}: {' '.join(m)}" for p, m in problems.items())
            error = ReachError("invalid_input", f"input does not match the capability's "
                                 f"input_schema: {message}")
            error.details = problems
            raise error
        budget = min(capability.timeout_ms, self.config.max_timeout_ms)
        caller_budget = deadline_header(scope)
        ctx = CallContext(
            request_id=request_id, tenant_pk=tenant_pk,
            tenant_slug=table.tenants[tenant_pk].slug, started=time.monotonic(),
            budget_ms=min(budget, caller_budget) if caller_budget else budget,
            caller_bound=bool(caller_budget and caller_budget < budget),
            idempotent=bool(header(scope, b"idempotency-key")),
        )
        return candidate, to_agent_names(capability, payload), ctx

    async def invoke(self, scope, receive, send, request_id: str) -> None:
        table = self._table()
        key = authenticate(table, header(scope, b"authorization"))
        raw = await self.read_body(scope, receive)
        body = parse_json(raw)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ReachError("invalid_input", "'stream' must be true or false.")
        if body.get("mode", "sync") != "sync":
            raise ReachError("invalid_input", "Only mode 'sync' is available; async tasks "
                               "and callbacks are not served by this gateway yet.")
        payload = body.get("input", {})
        params = body.get("params", {})
        if not isinstance(payload, dict) or not isinstance(params, dict):
            raise ReachError("invalid_input", "'input' and 'params' must be JSON objects.")
        payload = {**params, **payload}
        route = route_request(
            key.tenant_pk,
            {k: body.get(k) for k in ("capability", "intent", "min_version", "namespace",
                                       "cost")} | {
                "src_lang": payload.get("src_lang"), "dest_lang": payload.get("dest_lang"),
                "input_chars": str(len(orjson.dumps(payload))),
            },
            namespace=header(scope, b"x-reach-namespace"),
            internal=self.config.is_internal((scope.get("client") or (None,))[0]),
        )
        async def call() -> dict:
            candidate, agent_payload, ctx = self.begin(scope, table, route, payload,
                                                       request_id, key.tenant_pk)
            if self.governed:
                await self.governor.admit(table, key.tenant_pk, candidate)
            route_ms = (time.monotonic() - ctx.started) * 1000
            upstream = await self.caller.open(table, route, candidate, agent_payload, ctx,
                                              stream=False)
            reply = await self.caller.read(upstream, ctx)
            self.emit_usage(ctx, upstream.candidate, "success", reply.input_tokens,
                            reply.output_tokens)
            return self.agent_response(upstream.candidate, reply, ctx, route_ms)

        if stream:
            candidate, agent_payload, ctx = self.begin(scope, table, route, payload,
                                                       request_id, key.tenant_pk)
            if self.governed:
                await self.governor.admit(table, key.tenant_pk, candidate)
            upstream = await self.caller.open(table, route, candidate, agent_payload, ctx,
                                              stream=True)
            await self.relay(scope, receive, send, upstream, ctx, openai_passthrough=True)
            return
        idempotency_key = header(scope, b"idempotency-key")
        if idempotency_key:
            await self.idempotently(send, request_id, key.tenant_pk, idempotency_key, raw,
                                    call)
            return
        await send_json(send, 200, await call(), request_id)

    def agent_response(self, candidate: Candidate, reply: AgentResponse, ctx: CallContext,
                       route_ms: float) -> dict:
        total_ms = (time.monotonic() - ctx.started) * 1000
        return {
            "request_id": ctx.request_id,
            "agent": candidate.agent.name,
            "instance": candidate.instance.pk,
            "capability": candidate.capability.capability_id,
            "reply_content": reply.reply_content,
            "tool_calls": reply.tool_calls,
            "output": reply.output,
            "raw_meta": reply.raw_meta,
            "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
                      "cost": cost(candidate, reply.input_tokens, reply.output_tokens)},
            "timings": {"route_ms": round(route_ms, 3),
                        "upstream_ms": round(total_ms - route_ms, 3),
                        "total_ms": round(total_ms, 3)},
        }

    def emit_usage(self, ctx: CallContext, candidate: Candidate | None, outcome: str,
                   input_tokens: int = 0, output_tokens: int = 0) -> None:
        if not self.governed:
            return
        TOKENS_IN.inc(input_tokens)
        TOKENS_OUT.inc(output_tokens)
        if candidate is not None:
            self.governor.record(ctx.tenant_pk, candidate, tokens=input_tokens + output_tokens,
                                 cost=cost(candidate, input_tokens, output_tokens))
        self.usage.emit({
            "request_id": ctx.request_id, "tenant": ctx.tenant_pk,
            "agent": candidate.agent.pk if candidate else None,
            "capability": candidate.capability.pk if candidate else None,
            "instance": candidate.instance.pk if candidate else None,
            "outcome": outcome, "input_tokens": input_tokens, "output_tokens": output_tokens,
            "cost": cost(candidate, input_tokens, output_tokens) if candidate else 0.0,
            "latency_ms": int((time.monotonic() - ctx.started) * 1000),
            "occurred_at": time.time(),
        })

    # ---- streaming ----------------------------------------------------------------------

    async def relay(self, scope, receive, send, upstream: Upstream, ctx: CallContext,
                    *, openai_passthrough: bool, keep_usage_chunk: bool = True,
                    transform=None) -> None:
        """Relay the agent's SSE stream event by event. An upstream break or an idle
        stream ends with an SSE ``error`` event (never a fake ``[DONE]``); the client
        going away cancels the upstream call at once. No retry once bytes are sent."""
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
            (b"x-request-id", ctx.request_id.encode()),
        ]})
        usage = StreamUsage()
        framer = EventFramer()
        outcome, error = "success", None
        instance = upstream.candidate.instance

        async def pump() -> None:
            nonlocal error, outcome
            try:
                async for chunk in upstream.response.content.iter_any():
                    out = []
                    for event in framer.feed(chunk):
                        data = data_of(event)
                        if data is not None and openai_passthrough and usage.observe(data) \
                                and not keep_usage_chunk:
                            continue
                        if transform is not None:
                            event = transform(event)
                            if event is None:
                                continue
                        out.append(event)
                    if out:
                        await send({"type": "http.response.body", "body": b"".join(out),
                                    "more_body": True})
                if framer.pending.strip():
                    raise aiohttp.ClientPayloadError("stream ended inside an event")
            except (TimeoutError, aiohttp.ServerTimeoutError):
                outcome = "upstream_timeout"
                error = ReachError("upstream_timeout", "the agent's stream went idle for "
                                     f"{self.config.stream_idle_timeout_s:g} s")
            except (aiohttp.ClientError, OSError) as exc:
                outcome = "upstream_error"
                error = ReachError("upstream_error", "the agent's stream broke off "
                                     f"({type(exc).__name__})")

        async def watch_disconnect() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return

        pumping = asyncio.ensure_future(pump())
        watching = asyncio.ensure_future(watch_disconnect())
        try:
            done, _ = await asyncio.wait({pumping, watching},
                                         return_when=asyncio.FIRST_COMPLETED)
            if watching in done and pumping not in done:
                outcome = "client_cancelled"
                pumping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pumping
            else:
                if error is not None:
                    await send({"type": "http.response.body",
                                "body": error_event(error.body(ctx.request_id)),
                                "more_body": True})
                await send({"type": "http.response.body", "body": b""})
        finally:
            watching.cancel()
            upstream.response.close()  # drops the connection: cancels the agent's work
            self.caller.record_stream(instance.pk, ok=outcome in ("success", "client_cancelled"),
                                      started=upstream.started)
            tokens_in, tokens_out = usage.totals()
            self.emit_usage(ctx, upstream.candidate, outcome, tokens_in, tokens_out)
            CALLS.labels("stream", outcome).inc()


_CHILDREN: dict[tuple[str, str], tuple] = {}


def count_call(endpoint: str, outcome: str, seconds: float) -> None:
    """Count a call; the labelled children are looked up once, not on every call."""
    children = _CHILDREN.get((endpoint, outcome))
    if children is None:
        children = _CHILDREN[(endpoint, outcome)] = (CALLS.labels(endpoint, outcome),
                                                     LATENCY.labels(outcome))
    children[0].inc()
    children[1].observe(seconds)


def parse_json(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ReachError("malformed_json", f"Request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ReachError("invalid_input", "Request body must be a JSON object.")
    return body


async def send_bytes(send, status: int, payload: bytes, request_id: str,
                     extra: list | None = None) -> None:
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"x-request-id", request_id.encode()), *(extra or [])],
    })
    await send({"type": "http.response.body", "body": payload})


def cost(candidate: Candidate | None, input_tokens: int, output_tokens: int) -> float:
    if candidate is None:
        return 0.0
    agent = candidate.agent
    return round(agent.price_per_call + input_tokens / 1000 * agent.price_input_per_1k
                 + output_tokens / 1000 * agent.price_output_per_1k, 6)


def deadline_header(scope) -> int | None:
    raw = header(scope, b"x-reach-deadline-ms")
    if raw is None:
        return None
    if not raw.strip().isdigit() or int(raw) <= 0:
        raise ReachError("invalid_input", "X-Reach-Deadline-Ms must be a positive integer.")
    return int(raw)


def route_request(tenant_pk: int, params: dict, *, namespace: str | None,
                  internal: bool = False) -> RouteRequest:
    capability, intent = params.get("capability"), params.get("intent")
    if bool(capability) == bool(intent):
        raise ReachError("invalid_input", "Give exactly one of 'capability' or 'intent'.")
    if not isinstance(capability or intent, str):
        raise ReachError("invalid_input", "'capability' and 'intent' must be strings.")
    input_chars = params.get("input_chars")
    if input_chars is not None and not str(input_chars).isdigit():
        raise ReachError("invalid_input", "'input_chars' must be a non-negative integer.")
    cost_preference = params.get("cost") or "best"
    if cost_preference not in ("best", "cheapest"):
        raise ReachError("invalid_input", "'cost' must be 'best' or 'cheapest'.")
    for name in ("min_version", "src_lang", "dest_lang", "format", "namespace"):
        if params.get(name) is not None and not isinstance(params.get(name), str):
            raise ReachError("invalid_input", f"'{name}' must be a string.")
    return RouteRequest(
        tenant_pk=tenant_pk, capability=capability, intent=intent,
        namespace=namespace or params.get("namespace") or "default",
        min_version=params.get("min_version"), src_lang=params.get("src_lang"),
        dest_lang=params.get("dest_lang"), input_format=params.get("format"),
        input_chars=int(input_chars) if input_chars is not None else None,
        cost_preference=cost_preference, internal_network=internal,
    )


def route_message(decision) -> str:
    if decision.error == "no_capability":
        if decision.capability:
            return f"No agent offers {decision.capability!r} to this tenant."
        return "No capability matches this request."
    return f"No healthy instance can serve {decision.capability!r} now."
