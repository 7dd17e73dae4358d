"""Building an agent: handlers for capabilities, served, registered and kept alive.

    from agent_reach import Agent

    agent = Agent("doc-summary-agent", version="2.3.1")      # or Agent.from_yaml("capability.yaml")

    @agent.capability("summarize_document", description="Summarise a document")
    def summarize(input, ctx):
        return {"summary": input["text"][:100]}

    @agent.capability("chat.stream", stream=True)
    def chat(input, ctx):                                      # a generator streams (SSE)
        yield from ("Hello", ", ", "world")

    agent.serve(platform="http://127.0.0.1:8000", key=REGISTRATION_KEY)   # until SIGTERM

``serve`` listens on a local port (or holds a reverse tunnel, ``reach="tunnel"``),
registers with the platform and heartbeats **on its own thread**, reporting calls in
flight, the backlog, and the calls finished and failed since the last beat (a handler that
stalls turns the instance sub-healthy at the next beat); re-registers when the platform
has forgotten the instance (404/410); and on SIGTERM deregisters (no new calls), lets the
calls in flight finish within ``grace_s`` and returns.

A handler gets the input (canonical parameter names) and a ``Context``: the caller's
deadline, request id, idempotency key and, for an asynchronous task, its id. It returns a
JSON object (the output), yields chunks to stream, or returns ``ctx.ask(...)`` to ask the
caller for input. ``background=True`` answers 202 at once and runs the handler after,
reporting progress (``ctx.progress``) and the outcome through the platform.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from aiohttp import web

from agent_reach.client import Deadline, ReachClient
from agent_reach.control import ControlPlane, ReachError, Registration, register_patiently
from agent_reach.tunnel import TunnelClient

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ask:
    """A handler's question to the caller: the task waits (``input-required``)."""

    message: str
    state: str = "input-required"


@dataclass
class Context:
    """What a handler knows about the call it serves."""

    request_id: str | None
    idempotency_key: str | None
    task_id: str | None
    deadline: Deadline | None
    headers: dict
    capability: str
    _agent: Agent | None = field(default=None, repr=False)

    def ask(self, message: str) -> Ask:
        """Return this to ask the caller for more input; the task goes on (with the
        answer's keys over the original input) when the caller answers."""
        return Ask(message)

    def progress(self, fraction: float | None = None, message: str = "") -> None:
        """Report how far the task has come (an asynchronous task held by this agent)."""
        self._report({"state": "working", "progress": fraction, "message": message})

    def _report(self, body: dict) -> None:
        if self.task_id is None or self._agent is None:
            raise RuntimeError("only an asynchronous task's handler reports on it")
        self._agent._report(self.task_id, body)

    def tool(self, name: str, arguments: dict | None = None, *,
             timeout: float | None = None) -> dict:
        """Call a tool through the gateway as this agent (its agent token): the gateway
        holds the tool's secret, applies its quotas and records the call. Returns the
        gateway's answer, ``{"ok", "status", "result", ...}``."""
        agent = self._agent
        running = getattr(agent, "_running", None) if agent is not None else None
        registration = running.registration if running is not None else None
        if registration is None or not registration.agent_token:
            raise RuntimeError("only a registered agent's handler calls tools as itself")
        left = self.deadline.left_ms() / 1000 if self.deadline is not None else None
        with ReachClient(agent.gateway_url or agent.platform,
                         registration.agent_token) as client:
            return client.call_tool(name, arguments or {},
                                    timeout=min(filter(None, (timeout, left)), default=None))

    def client(self, api_key: str | None = None, *, hops: int = 2) -> ReachClient:
        """A gateway client for calling other agents from this handler, on the budget this
        call has left, shared over ``hops`` (the callee and this handler's own work)."""
        agent = self._agent
        key = api_key or (agent.invoke_key if agent else None)
        if agent is None or agent.platform is None or not key:
            raise RuntimeError("give serve(invoke_key=...) or api_key= to call other agents")
        deadline = None
        if self.deadline is not None:
            deadline = Deadline(self.deadline.left_ms(), hops=hops)
        return ReachClient(agent.gateway_url or agent.platform, key, deadline=deadline)


@dataclass
class Capability:
    capability_id: str
    handler: Callable
    path: str
    stream: bool
    background: bool
    spec: dict  # what the descriptor says of it


@dataclass
class _Counters:
    in_flight: int = 0
    waiting: int = 0  # calls accepted but not started (all workers busy)
    processed: int = 0
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def window(self) -> dict:
        with self.lock:
            load = {"in_flight": self.in_flight, "queue_depth": self.waiting,
                    "processed_recent": self.processed, "errors_recent": self.errors}
            self.processed = self.errors = 0
        return load


class Agent:
    def __init__(self, name: str, *, version: str = "1.0.0", description: str = "",
                 namespace: str = "default", protocol: str = "http",
                 document: dict | None = None, workers: int = 16) -> None:
        self.name = name
        self.version = version
        self.description = description
        self.namespace = namespace
        self.protocol = protocol
        self.capabilities: dict[str, Capability] = {}
        self._document = document  # a capability.yaml, registered as written
        self._workers = workers
        self.counters = _Counters()
        self.platform: str | None = None
        self.gateway_url: str | None = None
        self.invoke_key: str | None = None
        self._plane: ControlPlane | None = None

    # ---- declaring -----------------------------------------------------------------------

    @classmethod
    def from_yaml(cls, source: str | Path) -> Agent:
        """An agent from a ``capability.yaml`` (the field report's format): handlers are
        then attached to its capability ids with ``@agent.capability(id)``, and serve at
        the paths its ``endpoints`` name."""
        text = Path(source).read_text() if isinstance(source, Path) or (
            isinstance(source, str) and "\n" not in source and source.endswith(
                (".yaml", ".yml"))) else source
        document = yaml.safe_load(text)
        if not isinstance(document, dict) or not document.get("name"):
            raise ValueError("a capability.yaml names the agent (name:) and its capabilities")
        return cls(str(document["name"]), version=str(document.get("version", "1.0.0")),
                   description=str(document.get("description", "")),
                   namespace=str(document.get("namespace", "default")), document=document)

    def capability(self, capability_id: str, *, description: str = "", path: str | None = None,
                   stream: bool | None = None, background: bool = False,
                   input_schema: dict | None = None, output_schema: dict | None = None,
                   timeout_ms: int | None = None, examples: Sequence[str] = (),
                   not_for: Sequence[str] = (), **extra) -> Callable:
        """Attach the decorated function as the handler of ``capability_id``.

        ``examples`` are requests the capability expects and ``not_for`` what it is not
        for ("parcel tracking (use logistics.track)"); the platform's intent router reads
        both (at most 20 of each, each at most 300 characters)."""
        if self.protocol == "openai":
            raise ValueError(_ONE_PROTOCOL)
        hints = _hints(examples=examples, not_for=not_for)

        def attach(handler: Callable) -> Callable:
            streams = stream if stream is not None else (
                inspect.isgeneratorfunction(handler) or inspect.isasyncgenfunction(handler))
            declared = self._declared(capability_id)
            spec = {"id": capability_id, **hints, **extra}
            for key, value in (("description", description), ("input_schema", input_schema),
                               ("output_schema", output_schema), ("timeout_ms", timeout_ms)):
                if value:
                    spec[key] = value
            route = path or _declared_path(declared) or f"/capabilities/{capability_id}"
            spec.setdefault("path", route)
            spec["kind"] = "stream" if streams else ("async" if background else "sync")
            self.capabilities[capability_id] = Capability(
                capability_id, handler, route, streams, background, spec)
            return handler
        return attach

    def chat(self, capability_id: str, *, description: str = "", examples: Sequence[str] = (),
             not_for: Sequence[str] = (), **extra) -> Callable:
        """Attach the decorated function as an OpenAI-compatible chat endpoint
        (``POST /v1/chat/completions``; the agent's protocol becomes ``openai``). It gets
        the request's ``messages`` and the context, and returns the reply's text, or yields
        it in pieces to stream (``"stream": true`` callers get chat-completion chunks)."""
        if self.capabilities:
            raise ValueError(_ONE_PROTOCOL)
        hints = _hints(examples=examples, not_for=not_for)

        def attach(handler: Callable) -> Callable:
            self.protocol = "openai"
            spec = {"id": capability_id, "path": "/v1/chat/completions", "kind": "stream",
                    **({"description": description} if description else {}), **hints,
                    **extra}
            self.capabilities[capability_id] = Capability(
                capability_id, handler, "/v1/chat/completions", True, False, spec)
            self._chat = capability_id
            return handler
        return attach

    def _declared(self, capability_id: str) -> dict | None:
        for entry in (self._document or {}).get("capabilities") or []:
            if isinstance(entry, dict) and entry.get("id") == capability_id:
                return entry
        return None

    def descriptor(self, endpoint: str | None, *, reach_mode: str = "direct",
                   instance_key: str = "") -> dict | str:
        """What ``serve`` registers: the capability.yaml as written (its endpoint set), or
        a JSON descriptor built from the handlers."""
        if self._document is not None:
            document = dict(self._document)
            document.pop("endpoint", None)
            # A capability the file gives no endpoint is served at its default path:
            # register that path, or the gateway would call one nobody serves.
            document["capabilities"] = [
                {**entry, "endpoints": [{"path": self.capabilities[entry["id"]].path}]}
                if isinstance(entry, dict) and entry.get("id") in self.capabilities
                and not _declared_path(entry) else entry
                for entry in document.get("capabilities") or []]
            # examples / not_for given to the decorator, where the file states none.
            document["capabilities"] = [
                {**{k: v for k, v in self.capabilities[entry["id"]].spec.items()
                    if k in _HINT_KEYS}, **entry}
                if isinstance(entry, dict) and entry.get("id") in self.capabilities else entry
                for entry in document["capabilities"]]
            if reach_mode == "tunnel":
                document["reach"] = {"mode": "tunnel", "instance": instance_key}
            else:
                document["endpoint"] = endpoint
            return yaml.safe_dump(document, allow_unicode=True, sort_keys=False)
        reach: dict[str, Any] = {"protocol": self.protocol}
        if reach_mode == "tunnel":
            reach.update(mode="tunnel", instance=instance_key)
        else:
            reach["endpoint"] = endpoint
        return {"agent_id": self.name, "version": self.version, "namespace": self.namespace,
                "description": self.description, "reach": reach,
                "capabilities": [c.spec for c in self.capabilities.values()]}

    # ---- serving -------------------------------------------------------------------------

    def start(self, *, platform: str, key: str, host: str = "127.0.0.1", port: int = 0,
              reach: str = "direct", gateway_url: str | None = None,
              invoke_key: str | None = None, heartbeat_s: float | None = None,
              grace_s: float = 10.0, register_wait_s: float | None = 30.0) -> RunningAgent:
        """Serve, register and heartbeat in the background; returns once registered.
        ``stop()`` the result to leave (deregister, drain, close). ``reach="tunnel"``:
        listen on no port; hold a tunnel to the gateway (``gateway_url``, default
        ``platform``). A platform that cannot be reached yet is tried again for
        ``register_wait_s`` (None: until it answers); ``invoke_key`` lets handlers call
        other agents (``ctx.client()``)."""
        if reach not in ("direct", "tunnel"):
            raise ValueError("reach is 'direct' or 'tunnel'")
        self.platform, self.gateway_url, self.invoke_key = platform.rstrip("/"), \
            gateway_url, invoke_key
        running = RunningAgent(self, key=key, host=host, port=port, reach=reach,
                               heartbeat_s=heartbeat_s, grace_s=grace_s,
                               register_wait_s=register_wait_s)
        self._running = running
        running.start()
        return running

    def serve(self, **kwargs) -> None:
        """``start`` (waiting for the platform as long as it takes), then wait for SIGTERM
        or SIGINT and leave gracefully: calls in flight get ``grace_s``, then it exits."""
        kwargs.setdefault("register_wait_s", None)
        running = self.start(**kwargs)
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        stop.wait()
        running.leave()

    def _report(self, task_id: str, body: dict, *, patience_s: float = 10.0) -> None:
        """Tell the platform about a task this agent holds. A report may overtake the
        platform's record of the hand-over (the call that gave the agent the task is still
        being recorded): the task is then not yet this agent's, and the report is sent
        again for up to ``patience_s``."""
        if self._plane is None:
            raise RuntimeError("the agent is not registered")
        body = {k: v for k, v in body.items() if v is not None}
        end = time.monotonic() + patience_s
        while True:
            try:
                self._plane.report(task_id, body)
                return
            except ReachError as error:
                if error.status != 404 or time.monotonic() >= end:
                    raise
            time.sleep(0.2)


# The platform speaks one protocol to an agent (its descriptor's reach.protocol).
_ONE_PROTOCOL = ("an agent with a chat endpoint speaks the OpenAI protocol only: give it no "
                 "other capability (build a second Agent for those)")


_HINT_KEYS = ("examples", "not_for")


def _hints(**given: Sequence[str]) -> dict[str, list[str]]:
    """The non-empty ``examples`` / ``not_for`` as descriptor lists. One string is refused
    here: iterated it would register one example per character."""
    hints = {}
    for key, values in given.items():
        if isinstance(values, str | bytes):
            raise TypeError(f"{key} is a list of strings, not one string")
        if values:
            hints[key] = list(values)
    return hints


def _declared_path(declared: dict | None) -> str | None:
    if not declared:
        return None
    if declared.get("path"):
        return str(declared["path"])
    endpoints = declared.get("endpoints") or []
    if endpoints and isinstance(endpoints[0], dict) and endpoints[0].get("path"):
        return str(endpoints[0]["path"])
    return None


class RunningAgent:
    """A served agent: its HTTP server (own thread and loop), registration and heartbeats."""

    def __init__(self, agent: Agent, *, key: str, host: str, port: int, reach: str,
                 heartbeat_s: float | None, grace_s: float,
                 register_wait_s: float | None = 30.0) -> None:
        self.agent = agent
        self._register_wait_s = register_wait_s
        self._key, self._host, self._port = key, host, port
        self.reach = reach
        self.instance_key = uuid.uuid4().hex
        self._socket_dir: tempfile.TemporaryDirectory | None = None
        self.tunnel: TunnelClient | None = None
        self._heartbeat_s = heartbeat_s
        self._grace_s = grace_s
        self._pool = ThreadPoolExecutor(max_workers=agent._workers,
                                        thread_name_prefix=f"agent-{agent.name}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._server_thread = threading.Thread(target=self._serve, name="agent-http",
                                               daemon=True)
        self._beat_thread = threading.Thread(target=self._beat, name="agent-heartbeat",
                                             daemon=True)
        self.registration: Registration | None = None
        self.port: int | None = None
        self.registrations = 0  # how many times it registered (re-registrations included)
        self.beats = 0

    @property
    def endpoint(self) -> str | None:
        return None if self.reach == "tunnel" else f"http://{self._host}:{self.port}/"

    def start(self) -> None:
        self._server_thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the agent's server did not start")
        self.agent._plane = ControlPlane(self.agent.platform, token=self._key)
        self._register(give_up_after_s=self._register_wait_s)
        if self.reach == "tunnel":
            self.tunnel = TunnelClient(
                self.agent.gateway_url or self.agent.platform,
                token=self.registration.agent_token,
                instance_id=self.registration.instance_id, target="http://agent",
                unix_socket=self._unix_path)
            asyncio.run_coroutine_threadsafe(self.tunnel.run(), self._loop)
        self._beat_thread.start()

    def _register(self, *, give_up_after_s: float | None = 0) -> None:
        self.registration = register_patiently(
            self.agent._plane, self.agent.descriptor(
                self.endpoint, reach_mode=self.reach, instance_key=self.instance_key),
            give_up_after_s=give_up_after_s, stopped=self._stopping.is_set)
        self.registrations += 1

    def _retunnel(self) -> None:
        """After registering again: the tunnel goes on with the new token and instance."""
        old = self.tunnel
        if old is None or (old.token, old.instance_id) == (
                self.registration.agent_token, self.registration.instance_id):
            return
        self._loop.call_soon_threadsafe(old.stop)
        self.tunnel = TunnelClient(
            self.agent.gateway_url or self.agent.platform, token=self.registration.agent_token,
            instance_id=self.registration.instance_id, target="http://agent",
            unix_socket=self._unix_path)
        asyncio.run_coroutine_threadsafe(self.tunnel.run(), self._loop)

    def stop(self) -> None:
        """Leave: deregister (the platform stops sending calls), let calls in flight
        finish within the grace period, then close."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        with contextlib.suppress(ReachError, httpx.HTTPError):
            if self.registration is not None:
                self.agent._plane.deregister(self.registration)
        end = time.monotonic() + self._grace_s
        while self.agent.counters.in_flight and time.monotonic() < end:
            time.sleep(0.05)
        self._beat_thread.join(timeout=2)
        if self.tunnel is not None:
            self._loop.call_soon_threadsafe(self.tunnel.stop)
            time.sleep(0.1)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._server_thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.agent._plane.close()
        if self._socket_dir is not None:
            self._socket_dir.cleanup()

    def leave(self) -> None:
        """``stop``, for a process that serves only this agent: if handlers are still
        running after the grace period (a sync one cannot be interrupted, and its thread
        would hold the interpreter open), exit the process anyway."""
        self.stop()
        if self.agent.counters.in_flight:
            logger.warning("%d calls still running after the grace period; exiting",
                           self.agent.counters.in_flight)
            logging.shutdown()
            os._exit(0)

    # ---- heartbeats ----------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._stopping.wait(self._interval()):
            load = self.agent.counters.window()
            try:
                self.agent._plane.heartbeat(self.registration.instance_id, **load)
                self.beats += 1
            except ReachError as exc:
                if exc.status in (401, 404, 410) and not self._stopping.is_set():
                    # The platform forgot this instance (removed after a lapse, or
                    # deleted) or the whole agent (its token is unknown now): register
                    # again with the key it started with, as at start.
                    logger.warning("the platform forgot this %s; registering again",
                                   "agent" if exc.status == 401 else "instance")
                    with contextlib.suppress(ReachError, httpx.HTTPError):
                        self._register()
                        self._retunnel()
                else:
                    logger.warning("heartbeat refused: %s", exc)
            except httpx.HTTPError as exc:
                logger.warning("heartbeat failed: %s", exc)

    def _interval(self) -> float:
        if self._heartbeat_s is not None:
            return self._heartbeat_s
        return float(self.registration.heartbeat_interval_seconds) if self.registration else 10

    # ---- HTTP ----------------------------------------------------------------------------

    def _serve(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        app = web.Application(client_max_size=32 * 1024 * 1024)
        for capability in self.agent.capabilities.values():
            handler = self._chat_handler(capability) if \
                capability.path == "/v1/chat/completions" and self.agent.protocol == "openai" \
                else self._handler(capability)
            app.router.add_post(capability.path, handler)
        app.router.add_get("/healthz", _healthz)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        loop.run_until_complete(runner.setup())
        if self.reach == "tunnel":
            # Calls come through the tunnel only: the server listens on a Unix socket
            # of this process's own, no network port.
            self._socket_dir = tempfile.TemporaryDirectory(prefix="reach-agent-")
            self._unix_path = str(Path(self._socket_dir.name) / "agent.sock")
            site = web.UnixSite(runner, self._unix_path)
        else:
            sock = socket.socket()
            sock.bind((self._host, self._port))
            self.port = sock.getsockname()[1]
            site = web.SockSite(runner, sock)
        loop.run_until_complete(site.start())
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    def _handler(self, capability: Capability):
        agent = self.agent

        async def handle(request: web.Request) -> web.StreamResponse:
            if self._stopping.is_set():
                return web.json_response({"error": "leaving"}, status=503)
            try:
                body = await request.json() if request.can_read_body else {}
            except ValueError:
                return web.json_response({"error": "the body is not JSON"}, status=400)
            ctx = _context(request, capability.capability_id, agent)
            if capability.background and ctx.task_id:
                self._background(capability, body, ctx)
                return web.Response(status=202)
            if capability.stream:
                return await self._stream(request, capability, body, ctx)
            try:
                result = await self._call(capability.handler, body, ctx)
            except Exception as exc:
                logger.exception("handler %s failed", capability.capability_id)
                return web.json_response({"error": str(exc)[:500]}, status=500)
            if isinstance(result, Ask):
                return web.json_response({"status": {"state": result.state,
                                                     "message": result.message}})
            return web.json_response(result, dumps=lambda v: orjson.dumps(v).decode())

        return handle

    async def _call(self, handler: Callable, body: dict, ctx: Context):
        counters = self.agent.counters
        with counters.lock:
            counters.waiting += 1
        started = False
        try:
            if inspect.iscoroutinefunction(handler):
                with counters.lock:
                    counters.waiting -= 1
                    counters.in_flight += 1
                started = True
                result = await _invoke(handler, body, ctx)
            else:
                def run():
                    nonlocal started
                    with counters.lock:
                        counters.waiting -= 1
                        counters.in_flight += 1
                    started = True
                    return _invoke(handler, body, ctx)
                result = await asyncio.get_running_loop().run_in_executor(self._pool, run)
        except BaseException:
            with counters.lock:
                counters.errors += 1
                counters.processed += 1
            raise
        finally:
            with counters.lock:
                if started:
                    counters.in_flight -= 1
                else:
                    counters.waiting -= 1
        with counters.lock:
            counters.processed += 1
        return result

    async def _stream(self, request: web.Request, capability: Capability, body: dict,
                      ctx: Context) -> web.StreamResponse:
        counters = self.agent.counters
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        with counters.lock:
            counters.in_flight += 1
        ok = True
        try:
            async for chunk in _chunks(capability.handler, body, ctx, self._pool):
                data = chunk if isinstance(chunk, dict) else {"text": str(chunk)}
                await response.write(b"data: " + orjson.dumps(data) + b"\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            ok = False
            raise
        except Exception as exc:
            ok = False
            logger.exception("streaming handler %s failed", capability.capability_id)
            await response.write(b"event: error\ndata: " + orjson.dumps(
                {"error": {"code": "upstream_error", "message": str(exc)[:300]}}) + b"\n\n")
        finally:
            with counters.lock:
                counters.in_flight -= 1
                counters.processed += 1
                counters.errors += 0 if ok else 1
        await response.write_eof()
        return response

    def _chat_handler(self, capability: Capability):
        """OpenAI chat completions around a handler of ``messages``: the whole reply as one
        completion, or (``stream``) a chunk per piece and ``[DONE]``."""
        agent = self.agent

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                body = await request.json()
            except ValueError:
                return web.json_response({"error": {"message": "the body is not JSON"}},
                                         status=400)
            messages = body.get("messages") if isinstance(body, dict) else None
            if not isinstance(messages, list):
                return web.json_response({"error": {"message": "messages is required"}},
                                         status=400)
            ctx = _context(request, capability.capability_id, agent)
            model, created = agent.name, int(time.time())
            chunk_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
            if not body.get("stream"):
                pieces = [str(p) async for p in _chunks(capability.handler, messages, ctx,
                                                        self._pool)]
                text = "".join(pieces)
                return web.json_response({
                    "id": chunk_id, "object": "chat.completion", "created": created,
                    "model": model, "choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": {"role": "assistant",
                                                             "content": text}}],
                    "usage": {"prompt_tokens": sum(len(str(m.get("content", "")).split())
                                                   for m in messages if isinstance(m, dict)),
                              "completion_tokens": len(text.split()),
                              "total_tokens": 0}})
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)

            def chunk(delta: dict, finish: str | None) -> bytes:
                return b"data: " + orjson.dumps({
                    "id": chunk_id, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [{"index": 0, "delta": delta,
                                                 "finish_reason": finish}]}) + b"\n\n"

            await response.write(chunk({"role": "assistant"}, None))
            async for piece in _chunks(capability.handler, messages, ctx, self._pool):
                await response.write(chunk({"content": str(piece)}, None))
            await response.write(chunk({}, "stop") + b"data: [DONE]\n\n")
            await response.write_eof()
            return response

        return handle

    def _background(self, capability: Capability, body: dict, ctx: Context) -> None:
        """Run the handler after answering 202, and report its outcome to the platform."""
        async def run() -> None:
            try:
                result = await self._call(capability.handler, body, ctx)
            except Exception as exc:
                report = {"state": "failed", "error": str(exc)[:4000]}
            else:
                report = ({"state": result.state, "message": result.message}
                          if isinstance(result, Ask) else {"state": "completed",
                                                            "output": result})
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, self.agent._report, ctx.task_id, report)
            except Exception:
                logger.exception("reporting task %s failed", ctx.task_id)

        self._loop.create_task(run())


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def _context(request: web.Request, capability_id: str, agent: Agent) -> Context:
    raw = request.headers.get("X-Reach-Deadline-Ms")
    deadline = Deadline(float(raw)) if raw and raw.isdigit() else None
    return Context(request_id=request.headers.get("X-Request-ID"),
                   idempotency_key=request.headers.get("Idempotency-Key"),
                   task_id=request.headers.get("X-Reach-Task-Id"), deadline=deadline,
                   headers=dict(request.headers), capability=capability_id, _agent=agent)


def _invoke(handler: Callable, body: dict, ctx: Context):
    """Call ``handler`` with the input, and the context if it takes one."""
    takes = len(inspect.signature(handler).parameters)
    return handler(body, ctx) if takes >= 2 else handler(body)


async def _chunks(handler: Callable, body, ctx: Context, pool: ThreadPoolExecutor):
    """The pieces a handler produces: its generator's (sync or async) or its one answer."""
    produced = _invoke(handler, body, ctx)
    if inspect.isawaitable(produced):
        produced = await produced
    if isinstance(produced, str | bytes | dict):
        yield produced
        return
    if inspect.isasyncgen(produced):
        async for chunk in produced:
            yield chunk
        return
    loop = asyncio.get_running_loop()
    iterator = iter(produced)
    done = object()
    while True:
        chunk = await loop.run_in_executor(pool, next, iterator, done)
        if chunk is done:
            return
        yield chunk


def instance_key() -> str:
    return uuid.uuid4().hex
