"""The gateway's ASGI application (the data plane).

ASGI contract:

- ``lifespan``: ``startup`` starts the background jobs (usage shipping, budget
  flushes); ``shutdown`` stops them and closes every upstream session and the
  clients handed in as ``closers``. A server without the lifespan protocol gets
  the jobs started by the first request.
- ``http``: dispatched by ``ROUTES`` on (method, path); the route's name is the
  metric label, and anything not in the table is one label, ``not_found``, so no
  caller can mint a time series. Every failure is the structured error of
  ``reach_core.errors``.
- ``websocket``: ``/v1/tunnel`` is the reverse tunnel (``gateway.tunnel``); any other
  path is refused with a close before accepting, never a 500.

The app reads only the route table it is given: it never imports Django or the
ORM. ``reach_platform.gateway_factory`` builds it from settings; tests build it
directly around a hand-made table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote

import orjson
from prometheus_client import CONTENT_TYPE_LATEST

from gateway import doors
from gateway.auth import authenticate, presents_key
from gateway.breaker import BreakerState, CircuitBreakers
from gateway.calls import Caller
from gateway.config import GatewayConfig
from gateway.credentials import Credentials
from gateway.governance import Governor
from gateway.http_io import (
    CLIENT_GONE,
    header,
    parse_json,
    query_params,
    read_body,
    require_json,
    send_bytes,
    send_error,
    send_json,
)
from gateway.idempotency import MemoryStore
from gateway.limits import InProcessLimiter
from gateway.mcp import PROTOCOL_VERSIONS as MCP_VERSIONS
from gateway.mcp import McpServer
from gateway.metrics import (
    BREAKERS,
    CALLS,
    LATENCY,
    MULTIPROCESS,
    SHED,
    TABLE_VERSION,
    TENANT_SHED,
    USAGE_BACKLOG,
    exposition,
)
from gateway.pipeline import Pipeline, Request
from gateway.route_feedback import MAX_BODY_BYTES as FEEDBACK_MAX_BODY_BYTES
from gateway.route_feedback import FeedbackRecorder
from gateway.task_runner import TaskRunner
from gateway.tasks import EngineSettings, TaskDoors, TaskEngine, task_path
from gateway.tools import ToolCaller, ToolDoors
from gateway.tools import listing as tool_listing
from gateway.tunnel import TUNNEL_PATH, TunnelHub
from gateway.usage import UsageQueue
from reach_core import requestid
from reach_core.errors import ReachError
from reach_core.kinds import Outcome
from routing.router import Router
from routing.table import RouteTable

logger = logging.getLogger(__name__)

NOT_FOUND = "not_found"
# Close code for a refused WebSocket (4000-4999 are the application's): uvicorn answers
# the upgrade with 403 when the app closes before accepting.
WEBSOCKET_REFUSED = 4404


@dataclass(frozen=True)
class Route:
    name: str  # also the metric label
    handler: str  # a GatewayApp method: (request_id, scope, receive, send) -> outcome


ROUTES: dict[tuple[str, str], Route] = {
    ("POST", "/v1/invoke"): Route("invoke", "_invoke"),
    ("POST", "/v1/chat/completions"): Route("chat_completions", "_chat_completions"),
    ("GET", "/v1/route"): Route("route", "_route"),
    ("HEAD", "/v1/route"): Route("route", "_route"),
    ("POST", "/v1/route/feedback"): Route("route_feedback", "_route_feedback"),
    ("GET", "/metrics"): Route("metrics", "_metrics"),
    ("HEAD", "/metrics"): Route("metrics", "_metrics"),
    ("GET", "/v1/tasks"): Route("tasks", "_task_list"),
    ("GET", "/v1/tools"): Route("tools", "_tool_list"),
    ("GET", "/v1/models"): Route("models", "_models"),
    ("GET", "/v1"): Route("index", "_index"),
    ("POST", "/mcp"): Route("mcp", "_mcp"),
}
TOOL_CALL = Route("tool_call", "_tool_call")  # POST /v1/tools/<name>/call
MODEL = Route("model", "_model")  # GET /v1/models/<id>
_PATHS = {path for _, path in ROUTES}
GATEWAY_DOORS = {
    "POST /v1/invoke": "call a capability, or an intent",
    "POST /v1/chat/completions": "OpenAI-compatible chat (model: an agent or capability:<id>)",
    "GET /v1/models": "what 'model' may name for your key",
    "GET /v1/route": "dry run: where a call would go, and why",
    "POST /v1/route/feedback": "tell the router which capability an intent meant",
    "GET /v1/tasks": "asynchronous tasks (and /v1/tasks/<id>, its events, cancel, messages)",
    "GET /v1/tools": "the tools you may call (?format=openai)",
    "POST /v1/tools/<name>/call": "call a tool through the gateway",
    "POST /mcp": "MCP server: your tools (and ?agents=true, your agents)",
    "GET /metrics": "Prometheus metrics",
}
# ``/v1/tasks/<id>`` and its actions: (method, action) -> route.
TASK_ROUTES: dict[tuple[str, str], Route] = {
    ("GET", ""): Route("task", "_task"),
    ("GET", "events"): Route("task_events", "_task_events"),
    ("POST", "cancel"): Route("task_cancel", "_task_cancel"),
    ("POST", "messages"): Route("task_messages", "_task_messages"),
}


# How long stopping waits for the background jobs it cancelled.
CLOSE_JOBS_S = 5.0


class GatewayApp:
    def __init__(self, *, table: Callable[[], RouteTable], router: Router,
                 config: GatewayConfig, breakers: CircuitBreakers, governor: Governor | None,
                 usage: UsageQueue | None, idempotency=None, idempotency_fail_open=False,
                 background: Sequence[Callable[[], Awaitable[None]]] = (),
                 closers: Sequence[Callable[[], Awaitable[None]]] = (),
                 tasks: TaskDoors | None = None, engine: EngineSettings | None = None,
                 tunnels: TunnelHub | None = None,
                 route_feedback: FeedbackRecorder | None = None,
                 ready: Callable[[], bool] = lambda: True,
                 tool_breakers: CircuitBreakers | None = None,
                 authenticate_agent: Callable[[str], Awaitable[int | None]] | None = None,
                 tool_digest_key: bytes = b"") -> None:
        """``governor`` / ``usage`` None: no admission and no metering (benchmarks only).
        ``background``: coroutine functions run for the process's lifetime; ``closers``:
        coroutine functions awaited at shutdown (Redis clients); ``tasks``: the
        ``/v1/tasks`` doors and asynchronous submissions (None: 503 for them); ``engine``:
        this process also runs tasks (the embedded mode, and the workers'), with
        ``tasks``' store and this pipeline; ``route_feedback``: where route feedback,
        reported or inferred, goes (None: 503 for ``/v1/route/feedback``, no inference);
        ``tool_breakers``: one breaker per tool (``gateway.tools``); ``authenticate_agent``:
        the agent an agent token stands for (asked of the control plane's database), for
        agents calling tools."""
        self._table = table
        self._ready = ready  # False while there is no table at all (see ``readiness``)
        self.tasks = tasks
        self.tunnels = tunnels
        self.config = config
        self.usage = usage  # the run command's scheduler drains it in embedded mode
        self.route_feedback = route_feedback  # so is its queue
        self.breakers = breakers
        self.router = router
        self.caller = Caller(config=config, breakers=breakers, feedback=router.feedback,
                             credentials=Credentials(config.credential_keys,
                                                     config.credential_env,
                                                     config.credential_files),
                             tunnels=tunnels)
        self.pipeline = Pipeline(config=config, router=router, caller=self.caller,
                                 governor=governor, usage=usage,
                                 idempotency_store=idempotency or MemoryStore(),
                                 idempotency_fail_open=idempotency_fail_open, tasks=tasks)
        self.tools = ToolDoors(
            caller=self.caller, usage=usage,
            limiter=governor.limiter if governor is not None else InProcessLimiter(),
            fallback=governor.fallback if governor is not None else None,
            breakers=tool_breakers or CircuitBreakers(), authenticate_agent=authenticate_agent,
            digest_key=tool_digest_key)
        self.mcp = McpServer(tools=self.tools, pipeline=self.pipeline)
        jobs = [*background, self.caller.pools.close_idle_forever]
        if tunnels is not None:
            jobs.append(tunnels.follow)
            router.set_tunnel_presence(tunnels.up)
        if governor is not None:
            jobs.append(governor.flush_forever)
        self.engine: TaskEngine | None = None
        if engine is not None and tasks is not None:
            self.engine = TaskEngine(
                store=tasks.store, attempt=TaskRunner(self.pipeline, table).attempt,
                worker=engine.worker, concurrency=engine.concurrency,
                lease_s=engine.lease_s, wakeups=engine.wakeups)
            jobs.append(self.engine.run_forever)
            tasks.rings.append(self._ring_engine)
        self._jobs = tuple(jobs)
        self._closers = tuple(closers)
        self._tasks: list[asyncio.Task] | None = None
        self.shedder = LoadShedder(max_in_flight=config.max_in_flight,
                                   max_loop_lag_s=config.max_loop_lag_ms / 1000,
                                   tenant_share=config.tenant_share)
        if config.max_loop_lag_ms > 0:
            self._jobs = (*self._jobs, self.shedder.watch)
        self.auth_failures = AuthFailures(config.max_auth_failures_per_minute)
        self._breakers_shown: set[int] = set()
        if MULTIPROCESS:
            self._jobs = (*self._jobs, self._refresh_gauges_forever)
        # The router skips instances whose breaker is open: this gateway's breakers feed it.
        router.set_open_breakers(breakers.open_instances)

    @property
    def in_flight(self) -> int:
        return self.shedder.in_flight

    async def _ring_engine(self) -> None:
        self.engine.ring()

    async def run_background(self) -> None:
        """The background jobs, until cancelled: a process that serves no HTTP (a task
        worker) runs its gateway this way, then ``close``s it."""
        self._start()
        await asyncio.gather(*self._tasks)

    # ---- ASGI -----------------------------------------------------------------------------

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            try:
                await self._http(scope, receive, send)
            except asyncio.CancelledError:
                # The caller went away mid-body (or the server refused the rest of it):
                # metered already; nothing to answer, and no traceback to log.
                if not scope.get(CLIENT_GONE):
                    raise
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "websocket":
            if self.tunnels is not None and scope.get("path") == TUNNEL_PATH:
                await self.tunnels.serve(scope, receive, send)
                return
            await receive()  # websocket.connect
            if "websocket.http.response" not in scope.get("extensions", {}):
                await send({"type": "websocket.close", "code": WEBSOCKET_REFUSED})
                return
            # The server can answer the upgrade with an HTTP reply: the one error shape.
            request_id = requestid.accept_or_new(header(scope, b"x-request-id"))
            error = ReachError("not_found", f"No WebSocket at {scope.get('path', '')[:200]}; "
                               f"the tunnel is at {TUNNEL_PATH}.")
            body = orjson.dumps(error.body(request_id))
            await send({"type": "websocket.http.response.start", "status": 404,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"x-request-id", request_id.encode())]})
            await send({"type": "websocket.http.response.body", "body": body})

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _start(self) -> None:
        if self._tasks is None:
            self._tasks = [asyncio.ensure_future(job()) for job in self._jobs]

    async def close(self) -> None:
        """Stop the background jobs, close every upstream session and the closers."""
        if not await self.pipeline.all_metered(CLOSE_JOBS_S):
            logger.warning("gateway stopping: calls still not metered after %g s; their "
                           "usage may be lost", CLOSE_JOBS_S)
        tasks, self._tasks = self._tasks or [], []
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: a job that does not stop must not keep the process from exiting
            # (a process manager's stop would end in SIGKILL); it is named instead.
            _, stuck = await asyncio.wait(tasks, timeout=CLOSE_JOBS_S)
            for task in stuck:
                logger.warning("gateway stopping: background job %s did not stop within "
                               "%g s", getattr(task.get_coro(), "__qualname__", task),
                               CLOSE_JOBS_S)
        if self.usage is not None:
            self.usage.close()  # after the last shipping: what is left stays on disk
        self.pipeline.close()
        closed = await self.caller.pools.close()
        logger.info("gateway stopped: %d background jobs, %d upstream sessions closed",
                    len(tasks), closed)
        for close in self._closers:
            try:
                await close()
            except Exception:  # closing is best effort: the process is going away
                logger.exception("closing a gateway client failed")

    async def _http(self, scope, receive, send) -> None:
        if self._tasks is None:
            self._start()
        request_id = requestid.accept_or_new(header(scope, b"x-request-id"))
        # Every log line written while this request is handled carries its id (the
        # logging filter reads it); each request runs in a task of its own.
        requestid.current.set(request_id)
        path = scope["path"]
        if len(path) > 1:
            path = path.rstrip("/")
        route = ROUTES.get((scope["method"], path))
        if route is None and path.startswith("/v1/tasks/"):
            route = self._task_route(scope, path)
        elif route is None and path.startswith("/v1/models/") and scope["method"] == "GET":
            route = MODEL
            scope["reach.model"] = unquote(path[len("/v1/models/"):])
        elif route is None and path.startswith("/v1/tools/") and path.endswith("/call") \
                and scope["method"] == "POST":
            route = TOOL_CALL
            scope["reach.tool"] = path[len("/v1/tools/"):-len("/call")]
        started = time.monotonic()
        outcome = Outcome.SUCCESS
        try:
            # As sent: each line's ": " and CRLF count (2,000 one-letter headers are 20 KB).
            if sum(len(k) + len(v) + 4 for k, v in scope.get("headers", [])) \
                    > self.config.max_header_bytes:
                raise ReachError("headers_too_large", "Request headers exceed "
                                 f"{self.config.max_header_bytes} bytes.")
            if route is None:
                if path in _PATHS or scope.get("reach.task_id"):
                    allowed = sorted(m for m, p in ROUTES if p == path) or sorted(
                        m for m, a in TASK_ROUTES if a == scope["reach.task_action"])
                    raise ReachError("method_not_allowed", f"Use {' or '.join(allowed)}.")
                raise ReachError("not_found", f"No gateway route for {scope['method']} "
                                 f"{scope['path'][:200]}")
            outcome = await getattr(self, route.handler)(request_id, scope, receive, send)
        except ReachError as error:
            outcome = error.code
            await send_error(send, error, request_id)
        except asyncio.CancelledError:
            if scope.get(CLIENT_GONE):
                outcome = Outcome.CLIENT_CANCELLED
                raise
            # Not its caller: this gateway is stopping past its drain time (uvicorn
            # cancels what still runs). A caller still waiting gets the one error shape,
            # 503, instead of uvicorn's plain-text 500 (a stream has had its error event).
            outcome = Outcome.SERVICE_UNAVAILABLE
            with contextlib.suppress(Exception):
                await send_error(send, ReachError(
                    "service_unavailable", "This gateway is stopping; send the call again."),
                    request_id)
        except Exception:
            outcome = "internal_error"
            logger.exception("gateway failure (request %s)", request_id)
            await send_error(send, ReachError(
                "internal_error", "The gateway failed; it has been logged."), request_id)
        finally:
            label = route.name if route is not None else NOT_FOUND
            if label != "metrics":
                count_call(label, outcome, time.monotonic() - started)

    async def _request(self, request_id: str, scope, receive, send) -> Request:
        """The authenticated request; its body is read later, by the pipeline (a
        stranger's body is never read). An address that keeps failing authentication
        is refused for the rest of the minute, whatever it sends."""
        address = (scope.get("client") or ("?",))[0]
        self.auth_failures.check(address)
        table = self._table()
        try:
            key = authenticate(table, header(scope, b"authorization"))
        except ReachError as error:
            if error.code == "unauthorized" and not self._ready():
                # No table yet (started with the database away and no snapshot): the key
                # is not known because nothing is; say so, and blame nobody for it.
                raise ReachError("service_unavailable", "This gateway has no route table "
                                 "yet (its database is unreachable); retry shortly.",
                                 retry_after=2) from None
            if error.code == "unauthorized" and presents_key(header(scope, b"authorization")):
                # Only a key that was tried counts: a request without one guesses
                # nothing (a probe, a health check) and must not lock the address out.
                self.auth_failures.record(address)
            raise
        return Request(scope=scope, receive=receive, send=send, request_id=request_id,
                       table=table, key=key)

    async def _call(self, request_id, scope, receive, send, door) -> str:
        """A call through the pipeline, unless this process is already at its limit of
        calls in flight (``LoadShedder``): then 503 overloaded at once, before anything
        else is spent on it."""
        with self.shedder:
            request = await self._request(request_id, scope, receive, send)
            with self.shedder.tenant(request.table, request.key.tenant_pk):
                return await self._through_pipeline(request, door)

    async def _through_pipeline(self, request: Request, door) -> str:
        internal = self._internal(request.scope)
        if self.route_feedback is None:
            return await self.pipeline.run(request, lambda r: door(r, internal=internal))
        calls = []

        def parse(r: Request):
            calls.append(door(r, internal=internal))
            return calls[-1]

        try:
            outcome = await self.pipeline.run(request, parse)
        except ReachError as error:
            self._after_call(request, calls, error.code)
            raise
        self._after_call(request, calls, outcome)
        return outcome

    def _after_call(self, request: Request, calls: list, outcome: str) -> None:
        """Feed the route-feedback inference (see ``gateway.route_feedback``)."""
        if not calls:
            return  # refused before it was parsed: nothing was asked for
        candidate = request.ctx.candidate if request.ctx is not None else None
        self.route_feedback.after_call(
            request.key, calls[0].route, outcome,
            candidate.capability.capability_id if candidate is not None else None,
            request.request_id)

    def _internal(self, scope) -> bool:
        return self.config.is_internal(_client_address(scope))

    # ---- routes -----------------------------------------------------------------------------

    async def _invoke(self, request_id, scope, receive, send) -> str:
        return await self._call(request_id, scope, receive, send, doors.invoke)

    async def _chat_completions(self, request_id, scope, receive, send) -> str:
        return await self._call(request_id, scope, receive, send, doors.chat_completions)

    async def _route(self, request_id, scope, receive, send) -> str:
        # A dry run's intent matching is CPU like a call's: it holds a slot too.
        with self.shedder:
            request = await self._request(request_id, scope, receive, send)
            with self.shedder.tenant(request.table, request.key.tenant_pk):
                return await self._dry_run(request, scope, send)

    async def _dry_run(self, request: Request, scope, send) -> str:
        request_id = request.request_id
        feedback, query = self.route_feedback, scope.get("query_string", b"")
        try:
            body = await doors.dry_run(self.pipeline.decide, request,
                                 internal=self._internal(scope))
        except ReachError as error:
            if feedback is not None:
                feedback.after_dry_run(request.key, query, error.explain)
            raise
        if feedback is not None:
            feedback.after_dry_run(request.key, query, body)
        await send_json(send, 200, body, request_id)
        return Outcome.SUCCESS

    async def _route_feedback(self, request_id, scope, receive, send) -> str:
        """``POST /v1/route/feedback``: 202 once the event is queued (learned later)."""
        request = await self._request(request_id, scope, receive, send)
        if self.route_feedback is None:
            raise ReachError("service_unavailable", "This gateway takes no route feedback.")
        content_type = (header(scope, b"content-type") or "").split(";")[0].strip()
        if content_type.lower() != "application/json":
            raise ReachError("unsupported_media_type",
                             "Send the request body as Content-Type: application/json.")
        raw = await read_body(scope, receive, FEEDBACK_MAX_BODY_BYTES, self.config.body_timeout_s)
        await self.route_feedback.reported(request.table, request.key, raw, request_id)
        await send_json(send, 202, {"accepted": True}, request_id)
        return Outcome.SUCCESS

    # ---- asynchronous tasks ---------------------------------------------------------------

    @staticmethod
    def _task_route(scope, path: str) -> Route | None:
        parsed = task_path(path)
        if parsed is None:
            return None
        scope["reach.task_id"], scope["reach.task_action"] = parsed
        return TASK_ROUTES.get((scope["method"], parsed[1]))

    async def _index(self, request_id, scope, receive, send) -> str:
        """What the gateway serves (no key needed to read it)."""
        await send_json(send, 200, {"service": "Agent-Reach gateway", "doors": GATEWAY_DOORS,
                                    "docs": "/api/docs/", "schema": "/api/schema/"},
                        request_id)
        return Outcome.SUCCESS

    # ---- models (the OpenAI SDK's models.list() and .retrieve()) ---------------------------

    async def _models(self, request_id, scope, receive, send) -> str:
        request = await self._request(request_id, scope, receive, send)
        listed = doors.models(request.table, request.key.tenant_pk,
                              internal=self._internal(scope))
        await send_json(send, 200, {"object": "list", "data": listed}, request_id)
        return Outcome.SUCCESS

    async def _model(self, request_id, scope, receive, send) -> str:
        request = await self._request(request_id, scope, receive, send)
        wanted = scope["reach.model"]
        found = next((m for m in doors.models(request.table, request.key.tenant_pk,
                                              internal=self._internal(scope))
                      if m["id"] == wanted), None)
        if found is None:
            raise ReachError("not_found", f"No model {wanted[:200]!r} this key may use.")
        await send_json(send, 200, found, request_id)
        return Outcome.SUCCESS

    # ---- tools ---------------------------------------------------------------------------

    async def _tool_caller(self, scope) -> tuple[RouteTable, ToolCaller]:
        address = (scope.get("client") or ("?",))[0]
        self.auth_failures.check(address)
        table = self._table()
        try:
            return table, await self.tools.caller_of(table, header(scope, b"authorization"))
        except ReachError as error:
            if error.code == "unauthorized" and presents_key(header(scope, b"authorization")):
                self.auth_failures.record(address)
            raise

    async def _tool_list(self, request_id, scope, receive, send) -> str:
        table, who = await self._tool_caller(scope)
        fmt = query_params(scope).get("format")
        if fmt not in (None, "openai"):
            raise ReachError("bad_request", "'format' is 'openai' or absent.")
        await send_json(send, 200, tool_listing(self.tools.permitted(table, who), fmt),
                        request_id)
        return Outcome.SUCCESS

    async def _tool_call(self, request_id, scope, receive, send) -> str:
        with self.shedder:
            table, who = await self._tool_caller(scope)
            with self.shedder.tenant(table, who.tenant_pk):
                reply = await self._call_tool(request_id, scope, receive, table, who)
        await send_json(send, 200, reply, request_id)
        return Outcome.SUCCESS

    async def _call_tool(self, request_id, scope, receive, table, who) -> dict:
        tool = self.tools.tool(table, who, scope["reach.tool"])
        deadline = header(scope, b"x-reach-deadline-ms")

        async def arguments() -> dict:
            # Read inside the call: a body refused here is audited as the tool's call.
            require_json(scope)
            if deadline is not None and (not deadline.isdigit() or int(deadline) < 1):
                raise ReachError("bad_request", "X-Reach-Deadline-Ms must be a positive "
                                 "integer (milliseconds).")
            body = parse_json(await read_body(scope, receive,
                                              self.config.max_body_bytes,
                                              self.config.body_timeout_s))
            unknown = sorted(set(body) - {"arguments"})
            if unknown:
                raise ReachError("invalid_input", f"Unknown field(s): "
                                 f"{', '.join(unknown)}; send {{\"arguments\": {{...}}}}.",
                                 details={name: ["unknown field"] for name in unknown})
            return body.get("arguments", {})

        return await self.tools.call(
            table, who, tool, arguments, request_id=request_id,
            deadline_ms=int(deadline) if deadline and deadline.isdigit() else None)

    async def _mcp(self, request_id, scope, receive, send) -> str:
        """The MCP server (``gateway.mcp``): one JSON-RPC message per POST. A message may
        call an agent or a tool, so it holds a call slot like any call."""
        with self.shedder:
            table, who = await self._tool_caller(scope)
            with self.shedder.tenant(table, who.tenant_pk):
                status, body = await self._answer_mcp(request_id, scope, receive, table, who)
        await send_bytes(send, status, body or b"", request_id)
        return Outcome.SUCCESS

    async def _answer_mcp(self, request_id, scope, receive, table, who) -> tuple[int, bytes]:
        version = header(scope, b"mcp-protocol-version")
        if version is not None and version not in MCP_VERSIONS:
            raise ReachError("bad_request", f"MCP-Protocol-Version {version[:40]!r} is not "
                             f"served; this server speaks {', '.join(MCP_VERSIONS)}.")
        require_json(scope, "the JSON-RPC message")
        raw = await read_body(scope, receive, self.config.max_body_bytes,
                              self.config.body_timeout_s)
        agents = query_params(scope).get("agents", "false").lower()
        if agents not in ("1", "true", "yes", "0", "false", "no"):
            raise ReachError("bad_request", "'agents' is true or false.")
        with_agents = agents in ("1", "true", "yes")
        # The agents listed and called are those reachable in the namespace named, as on
        # every other door (a capability of another namespace was listed, then its call
        # routed in "default" and found nothing).
        namespace = doors.namespace_of(header(scope, b"x-reach-namespace"),
                                       query_params(scope).get("namespace"))
        return await self.mcp.answer(table, who, raw, with_agents=with_agents,
                                     request_id=request_id, scope=scope, namespace=namespace)

    async def _task_doors(self, request_id, scope, receive, send) -> tuple[TaskDoors, int]:
        request = await self._request(request_id, scope, receive, send)
        if self.tasks is None:
            raise ReachError("service_unavailable", "This gateway serves no asynchronous "
                             "tasks (no task store is configured).")
        return self.tasks, request.key.tenant_pk

    async def _task_list(self, request_id, scope, receive, send) -> str:
        doors_, tenant = await self._task_doors(request_id, scope, receive, send)
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"),
                         keep_blank_values=True)
        await send_json(send, 200, await doors_.list(tenant, query), request_id)
        return Outcome.SUCCESS

    async def _task(self, request_id, scope, receive, send) -> str:
        doors_, tenant = await self._task_doors(request_id, scope, receive, send)
        await send_json(send, 200, await doors_.get(tenant, scope["reach.task_id"]),
                        request_id)
        return Outcome.SUCCESS

    async def _task_events(self, request_id, scope, receive, send) -> str:
        doors_, tenant = await self._task_doors(request_id, scope, receive, send)
        await doors_.events(tenant, scope["reach.task_id"], request_id, receive, send)
        return Outcome.SUCCESS

    async def _task_cancel(self, request_id, scope, receive, send) -> str:
        doors_, tenant = await self._task_doors(request_id, scope, receive, send)
        await read_body(scope, receive, self.config.max_body_bytes,
                        self.config.body_timeout_s)
        await send_json(send, 200, await doors_.cancel(tenant, scope["reach.task_id"]),
                        request_id)
        return Outcome.SUCCESS

    async def _task_messages(self, request_id, scope, receive, send) -> str:
        doors_, tenant = await self._task_doors(request_id, scope, receive, send)
        content_type = (header(scope, b"content-type") or "").split(";")[0].strip()
        if content_type.lower() != "application/json":
            raise ReachError("unsupported_media_type",
                             "Send the request body as Content-Type: application/json.")
        raw = await read_body(scope, receive, self.config.max_body_bytes,
                              self.config.body_timeout_s)
        await send_json(send, 200, await doors_.message(tenant, scope["reach.task_id"], raw),
                        request_id)
        return Outcome.SUCCESS

    async def readiness(self, scope, send) -> None:
        """``/readyz`` of a gateway process: 200 while it has a route table to serve from
        (the database may be away: it serves from the table), 503 before it has one."""
        request_id = requestid.accept_or_new(header(scope, b"x-request-id"))
        table = self._table()
        if self._ready():
            await send_json(send, 200, {"status": "ready", "table_version": table.version},
                            request_id)
        else:
            await send_json(send, 503, {"status": "not_ready", "table_version": None,
                                        "reason": "no route table yet"}, request_id,
                            [(b"retry-after", b"2")])

    async def _metrics(self, request_id, scope, receive, send) -> str:
        # Every tenant's names and volumes: not for whoever can reach the gateway's port
        # (a break test read them with no key where tenants call the same port).
        if not self.config.may_read_metrics(_client_address(scope),
                                            header(scope, b"authorization")):
            raise ReachError("forbidden", "Metrics are served to REACH_METRICS_NETWORKS, or "
                             "with the bearer token REACH_METRICS_TOKEN.")
        self.refresh_gauges()
        await send_bytes(send, 200, exposition(), request_id,
                         content_type=CONTENT_TYPE_LATEST.encode())
        return Outcome.SUCCESS

    def refresh_gauges(self) -> None:
        """This process's table version, open breakers and usage backlog, as gauges: at a
        scrape, and (several workers sharing their figures) every few seconds, since a
        scrape reaches one worker only."""
        TABLE_VERSION.set(self._table().version)
        states = self.breakers.states()
        if MULTIPROCESS:
            # A worker's figures outlive a clear(): closed ones are set back to 0.
            for pk in self._breakers_shown - states.keys():
                BREAKERS.labels(str(pk)).set(0.0)
            self._breakers_shown = set(states)
            if self.usage is not None:
                USAGE_BACKLOG.set(len(self.usage))
        else:
            BREAKERS.clear()
        for pk, state in states.items():
            BREAKERS.labels(str(pk)).set(1.0 if state == BreakerState.OPEN else 0.5)

    async def _refresh_gauges_forever(self, every_s: float = 2.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.refresh_gauges()


class LoadShedder:
    """How many calls this process takes at once: ``limit``, which ``GatewayApp._call``
    compares with ``in_flight`` before it spends anything else on a call.

    Two bounds. ``max_in_flight`` is a count, for memory and sockets; a healthy slow
    agent legitimately keeps many calls open, so it sits well above a normal load's
    concurrency. The CPU is guarded by the event loop's lag: ``watch`` wakes every
    ``TICK_S`` and measures how late it woke. A loop that is late on
    ``CUT_AFTER_TICKS`` ticks in a row by more than ``max_loop_lag_s`` has more ready
    work than CPU, and every call in it waits that long at each step (reading the
    body, connecting, relaying the reply): then ``limit`` drops to half the calls in
    flight (at most once per ``SETTLE_S``, so a cut is seen before the next), and once
    the loop is on time it grows back by one per tick (AIMD: growing by a share per
    tick outran the cuts and kept the loop saturated at 5x). Calls past it get 503
    overloaded at once instead of joining a queue that ends in everyone's time-out.
    ``max_loop_lag_s`` 0 turns the lag bound off. The limit never drops below
    ``FLOOR``: a process whose CPU goes entirely to refusing calls still serves some,
    and a short burst (a few dozen calls at once into a cold process) is never shed
    for the lag it causes itself.

    Tenants: ``with shedder:`` refuses past ``max_in_flight`` before authentication;
    ``limit`` is applied once the tenant is known (``tenant``). No tenant holds more
    than ``tenant_share`` of ``limit``, and a tenant holding less than the rest of it
    (the quarter kept for the others) is let in even past ``limit``: when one tenant's
    load makes the loop lag and cuts the limit below what it already holds, it is that
    tenant whose calls are refused, not every other tenant's.
    """

    TICK_S = 0.01
    CUT_AFTER_TICKS = 3
    SETTLE_S = 0.1
    FLOOR = 32

    def __enter__(self) -> None:
        """``with shedder:`` holds one call in flight for as long as the block runs; 503
        overloaded at once when the process is at its limit (``reach_shed_total``). A
        plain class rather than a generator: it runs on every call."""
        if self.in_flight >= self.max_in_flight:
            SHED.inc()
            raise ReachError("overloaded", "This gateway is at its limit of calls in flight "
                             f"({self.max_in_flight}); retry shortly.")
        self.in_flight += 1

    def __exit__(self, *exc) -> None:
        self.in_flight -= 1

    def __init__(self, *, max_in_flight: int, max_loop_lag_s: float,
                 tenant_share: float = 1.0) -> None:
        self.max_in_flight = max_in_flight
        self.max_loop_lag_s = max_loop_lag_s
        self.tenant_share = tenant_share
        self.limit = max_in_flight
        self.in_flight = 0
        self.held: dict[int, int] = {}  # calls in flight by tenant pk (authenticated)
        self.loop_lag_s = 0.0  # the last tick's
        self._late_ticks = 0
        self._settled_at = 0.0

    def observe(self, lag_s: float, now: float) -> None:
        """One tick of the watch: the loop woke ``lag_s`` late at ``now``."""
        self.loop_lag_s = lag_s
        if self.max_loop_lag_s <= 0:
            return
        if lag_s <= self.max_loop_lag_s:
            self._late_ticks = 0
            if self.limit < self.max_in_flight:
                self.limit += 1
            return
        self._late_ticks += 1
        if self._late_ticks >= self.CUT_AFTER_TICKS and now >= self._settled_at:
            floor = min(self.FLOOR, self.max_in_flight)
            self.limit = max(floor, min(self.limit, self.in_flight) // 2)
            self._settled_at = now + self.SETTLE_S

    def tenant(self, table: RouteTable, tenant_pk: int) -> TenantSlot:
        """``with shedder.tenant(table, pk):`` holds one call of that tenant, inside the
        process's own ``with shedder:``. No tenant holds more than ``tenant_share`` of
        ``limit`` (rounded up): past it 429 too_many_requests, so one tenant's calls
        (slow agents, bodies trickled in) cannot take every slot and shut the others
        out; the rest stay free for them. Past ``limit`` itself, 503 overloaded unless
        the tenant holds less than that rest. Both follow ``limit``, shrunk by lag."""
        held = self.held.get(tenant_pk, 0)
        limit = self.limit
        most = math.ceil(limit * self.tenant_share)
        if held >= most:
            entry = table.tenants.get(tenant_pk)
            TENANT_SHED.labels(entry.slug if entry is not None else str(tenant_pk)).inc()
            raise ReachError("too_many_requests", f"This tenant has {held} calls in flight "
                             "in this gateway process, its most; retry shortly.")
        # Past the limit (``in_flight`` counts this call), only a tenant still inside
        # the part kept for the others gets in.
        if self.in_flight > limit and held >= limit - most:
            SHED.inc()
            raise ReachError("overloaded", "This gateway is at its limit of calls in flight "
                             f"({limit} now); retry shortly.")
        self.held[tenant_pk] = held + 1
        return TenantSlot(self.held, tenant_pk)

    async def watch(self) -> None:
        """Measure the loop's lag for the process's lifetime (a background job)."""
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.TICK_S)
            now = loop.time()
            self.observe(max(0.0, now - before - self.TICK_S), now)


class TenantSlot:
    """One call of a tenant in flight (``LoadShedder.tenant``); given back on exit."""

    __slots__ = ("held", "tenant_pk")

    def __init__(self, held: dict[int, int], tenant_pk: int) -> None:
        self.held, self.tenant_pk = held, tenant_pk

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        left = self.held[self.tenant_pk] - 1
        if left:
            self.held[self.tenant_pk] = left
        else:
            del self.held[self.tenant_pk]


class AuthFailures:
    """Failed authentications per client address in the current minute (this process).

    Bounded: at most ``MAX_ADDRESSES`` addresses are tracked; past that the window
    restarts, which can only forgive, never refuse a stranger."""

    MAX_ADDRESSES = 100_000

    def __init__(self, per_minute: int, clock=time.monotonic) -> None:
        self._per_minute = per_minute
        self._clock = clock
        self._window = -1
        self._counts: dict[str, int] = {}

    def _roll(self) -> float:
        now = self._clock()
        window = int(now // 60)
        if window != self._window or len(self._counts) > self.MAX_ADDRESSES:
            self._window, self._counts = window, {}
        return now

    def check(self, address: str) -> None:
        if self._per_minute <= 0:  # off
            return
        now = self._roll()
        if self._counts.get(address, 0) >= self._per_minute:
            raise ReachError("too_many_requests", "Too many failed authentications from "
                             "this address; wait for the next minute.",
                             retry_after=max(1, int(60 - now % 60)))

    def record(self, address: str) -> None:
        self._roll()
        self._counts[address] = self._counts.get(address, 0) + 1


_CHILDREN: dict[tuple[str, str], tuple] = {}


def count_call(route: str, outcome: str, seconds: float) -> None:
    """Count a call; the labelled children are looked up once, not on every call. Both
    labels come from closed sets (the route table, the error catalogue)."""
    children = _CHILDREN.get((route, outcome))
    if children is None:
        children = _CHILDREN[(route, outcome)] = (CALLS.labels(route, str(outcome)),
                                                  LATENCY.labels(str(outcome)))
    children[0].inc()
    children[1].observe(seconds)


def _client_address(scope) -> str | None:
    """The caller's address as the server saw it (no proxy headers believed)."""
    return (scope.get("client") or (None,))[0]
