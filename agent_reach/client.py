"""Calling agents through the gateway: ``ReachClient`` and its async twin.

    from agent_reach import ReachClient

    with ReachClient("http://127.0.0.1:8000", api_key) as reach:
        reply = reach.invoke("translate.text", input={"text": "hello", "dest_lang": "fr"})
        for event in reach.stream("chat.general", input={"text": "hi"}):
            ...
        task = reach.submit("report.build", input={...})
        done = reach.wait(task["task_id"])

Every call carries its deadline as ``X-Reach-Deadline-Ms`` (``timeout``). A client made
from a handler's context (``ctx.client()``) inside an agent passes on the budget it has
left, split over the hops still to come (the field report's cascading timeouts): a hop
never waits on a callee longer than its own caller will wait for it. Refusals raise the
typed exceptions of ``agent_reach.errors``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx
import orjson

from agent_reach.errors import GatewayUnreachable, ReachError, error_from

FINAL = frozenset({"completed", "failed", "canceled", "rejected"})
WAITING = frozenset({"input-required", "auth-required"})
DEFAULT_TIMEOUT_S = 30.0
# Beyond the call's own deadline, for the gateway to answer with its error.
TRANSPORT_SLACK_S = 2.0


@dataclass
class Deadline:
    """What is left of a caller's deadline, and over how many hops it is to be shared.

    ``remaining_ms`` is the budget at ``started`` (monotonic seconds); ``hops`` counts the
    calls still to come on this path, this one's own work included: an agent with 6 s left
    that calls one more agent gives it 3 s (``hops=2``) and keeps 3 s for itself."""

    remaining_ms: float
    hops: int = 2
    started: float = field(default_factory=time.monotonic)

    def left_ms(self) -> float:
        return max(0.0, self.remaining_ms - (time.monotonic() - self.started) * 1000)

    def share_s(self) -> float:
        """The budget of the next call: what is left, over the hops to come."""
        return self.left_ms() / max(1, self.hops) / 1000


def _body(capability, intent, input_, params, extra) -> dict:
    if (capability is None) == (intent is None):
        raise ValueError("give exactly one of capability= or intent=")
    body = {"capability": capability} if capability is not None else {"intent": intent}
    body["input"] = input_ or {}
    if params:
        body["params"] = params
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


class _Base:
    def __init__(self, base_url: str, api_key: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                 deadline: Deadline | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.default_timeout = timeout
        self.deadline = deadline
        self._auth = {"Authorization": f"Bearer {api_key}"}

    def _timeout(self, timeout: float | None) -> float:
        chosen = timeout if timeout is not None else self.default_timeout
        if self.deadline is not None:
            chosen = min(chosen, self.deadline.share_s())
        if chosen <= 0:
            raise ReachError(504, {"code": "deadline_exceeded", "message": "no time is left "
                                   "of the caller's deadline for this call"})
        return chosen

    def _headers(self, timeout_s: float, idempotency_key: str | None, extra=None) -> dict:
        headers = {**self._auth, "X-Reach-Deadline-Ms": str(max(1, int(timeout_s * 1000)))}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        if extra:
            headers.update(extra)
        return headers

    @staticmethod
    def _check(response: httpx.Response):
        # 300: the intent needs confirmation (``on_ambiguity="ask"``), an answer to act on.
        if response.status_code >= 400 or response.status_code == 300:
            try:
                body = response.json()
            except ValueError:
                # Not the gateway's error (a proxy's page in between): said as such.
                raise _not_the_gateways(response, "error") from None
            raise error_from(response.status_code, body, response.headers)
        if not response.content:
            return {}
        try:
            body = response.json()
        except ValueError:
            # Not the gateway's answer (a proxy's page in between, a wrong base URL).
            raise _not_the_gateways(response, "JSON") from None
        if not isinstance(body, dict):  # every answer of the gateway's is an object
            raise _not_the_gateways(response, "JSON object")
        return body


# The status a streamed error would have had, had it come before the stream began.
_EVENT_STATUS = {"upstream_timeout": 504, "deadline_exceeded": 504, "service_unavailable": 503,
                 "overloaded": 503, "upstream_busy": 503}


def _event_error(data: bytes) -> ReachError:
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        body = {"error": {"code": "upstream_error", "message": data.decode(errors="replace")}}
    status = _EVENT_STATUS.get((body.get("error") or {}).get("code"), 502)
    return error_from(status, body)


class _EventLines:
    """SSE framing: ``line(text)`` returns ``(event name, data)`` when a line ends an event."""

    def __init__(self) -> None:
        self.name, self.data = "message", []

    def line(self, line: str) -> tuple[str, bytes] | None:
        if not line:
            event = (self.name, "\n".join(self.data).encode()) if self.data else None
            self.name, self.data = "message", []
            return event
        if line.startswith("event:"):
            self.name = line[6:].strip()
        elif line.startswith("data:"):
            self.data.append(line[5:].lstrip(" "))
        return None

    def end(self) -> tuple[str, bytes] | None:
        return self.line("")


def _decoded(name: str, data: bytes):
    if name == "error":
        raise _event_error(data)
    if data == b"[DONE]":
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return {"data": data.decode(errors="replace")}


def _require_events(response: httpx.Response) -> None:
    """A stream's answer is an event stream; anything else is not the gateway's."""
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        raise _not_the_gateways(response, "event stream")


def _not_the_gateways(response: httpx.Response, what: str) -> GatewayUnreachable:
    """An answer that is not the gateway's ``what`` (it may have run: not retryable)."""
    kind = response.headers.get("content-type") or "no content type"
    return GatewayUnreachable(response.status_code, {
        "code": "gateway_unreachable", "retryable": False,
        "message": f"HTTP {response.status_code} that is not the gateway's {what} ({kind})"})


def _a_task(response: httpx.Response, check) -> dict:
    """A task as the gateway describes it: an answer without a ``state`` is not the
    gateway's (``wait`` would fail on it with a ``KeyError``)."""
    task = check(response)
    if not isinstance(task.get("state"), str):
        raise _not_the_gateways(response, "task")
    return task


def _unreachable(exc: httpx.TransportError) -> GatewayUnreachable:
    never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    return GatewayUnreachable(0, {
        "code": "gateway_unreachable", "retryable": never_sent,
        "message": f"the gateway could not be reached ({type(exc).__name__})"})


class _Unreachable(httpx.BaseTransport):
    """The transport's failures as the SDK's own error type (one ``except`` for every
    way a call fails), the rest passed through."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self._inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = self._inner.handle_request(request)
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc
        response.stream = _CutBody(response.stream)
        return response

    def close(self) -> None:
        self._inner.close()


class _CutBody(httpx.SyncByteStream):
    """A body cut after its head arrived (the gateway killed mid-reply): the same error."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __iter__(self):
        try:
            yield from self._inner
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc

    def close(self) -> None:
        self._inner.close()


class _AsyncCutBody(httpx.AsyncByteStream):
    def __init__(self, inner) -> None:
        self._inner = inner

    async def __aiter__(self):
        try:
            async for chunk in self._inner:
                yield chunk
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc

    async def aclose(self) -> None:
        await self._inner.aclose()


class _AsyncUnreachable(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await self._inner.handle_async_request(request)
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc
        response.stream = _AsyncCutBody(response.stream)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class ReachClient(_Base):
    """A synchronous client of the gateway (``/v1/``). Thread-safe for concurrent calls."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                 deadline: Deadline | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(base_url, api_key, timeout=timeout, deadline=deadline)
        self._http = httpx.Client(base_url=self.base_url, trust_env=False,
                                  transport=_Unreachable(transport or httpx.HTTPTransport()),
                                  timeout=httpx.Timeout(timeout + TRANSPORT_SLACK_S,
                                                        connect=5.0))

    def __enter__(self) -> ReachClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def invoke(self, capability: str | None = None, *, intent: str | None = None,
               input: dict | None = None, params: dict | None = None,
               timeout: float | None = None, idempotency_key: str | None = None,
               namespace: str | None = None, **extra) -> dict:
        """Call a capability (or what ``intent`` means) and return the agent's answer:
        ``{"output", "reply_content", "agent", "capability", "usage", "timings", ...}``."""
        timeout_s = self._timeout(timeout)
        response = self._http.post(
            "/v1/invoke", content=orjson.dumps(_body(capability, intent, input, params,
                                                     {"namespace": namespace, **extra})),
            headers=self._headers(timeout_s, idempotency_key,
                                  {"Content-Type": "application/json"}),
            timeout=timeout_s + TRANSPORT_SLACK_S)
        return self._check(response)

    def call_tool(self, name: str, arguments: dict | None = None, *,
                  timeout: float | None = None) -> dict:
        """Call the tool ``name`` through the gateway: ``{"ok", "status", "result", ...}``
        (``ok`` false: the external service answered 4xx). Gateway errors raise."""
        timeout_s = self._timeout(timeout)
        response = self._http.post(
            f"/v1/tools/{quote(name, safe='')}/call",
            content=orjson.dumps({"arguments": arguments or {}}),
            headers=self._headers(timeout_s, None, {"Content-Type": "application/json"}),
            timeout=timeout_s + TRANSPORT_SLACK_S)
        return self._check(response)

    def tools(self, *, format: str | None = None) -> list[dict]:
        """The tools this key may call; ``format="openai"``: as OpenAI ``tools``."""
        response = self._http.get("/v1/tools", params={"format": format} if format else None,
                                  headers=self._headers(self._timeout(None), None, {}))
        return self._check(response)["tools"]

    def stream(self, capability: str | None = None, *, intent: str | None = None,
               input: dict | None = None, params: dict | None = None,
               timeout: float | None = None, namespace: str | None = None,
               **extra) -> Iterator[dict]:
        """The agent's events as they come (decoded JSON of each SSE ``data``). A stream
        that breaks off raises the error event the gateway ends it with."""
        timeout_s = self._timeout(timeout)
        body = _body(capability, intent, input, params,
                     {"namespace": namespace, "stream": True, **extra})
        with self._http.stream("POST", "/v1/invoke", content=orjson.dumps(body),
                               headers=self._headers(timeout_s, None,
                                                     {"Content-Type": "application/json"}),
                               timeout=timeout_s + TRANSPORT_SLACK_S) as response:
            if response.status_code >= 400 or response.status_code == 300:
                response.read()
                self._check(response)
            _require_events(response)
            framing = _EventLines()
            for line in itertools.chain(response.iter_lines(), [None]):
                framed = framing.line(line) if line is not None else framing.end()
                event = _decoded(*framed) if framed else None
                if event is not None:
                    yield event

    def submit(self, capability: str | None = None, *, intent: str | None = None,
               input: dict | None = None, params: dict | None = None,
               callback_url: str | None = None, callback_secret: str | None = None,
               idempotency_key: str | None = None, namespace: str | None = None,
               **extra) -> dict:
        """Submit an asynchronous task; returns ``{"task_id", "state", ...}`` (202). Send
        an ``idempotency_key`` to make a retried submission the same task."""
        body = _body(capability, intent, input, params, {
            "mode": "async", "callback_url": callback_url, "callback_secret": callback_secret,
            "namespace": namespace, **extra})
        response = self._http.post(
            "/v1/invoke", content=orjson.dumps(body),
            headers=self._headers(self.default_timeout, idempotency_key,
                                  {"Content-Type": "application/json"}))
        return self._check(response)

    def task(self, task_id: str) -> dict:
        return _a_task(self._http.get(f"/v1/tasks/{task_id}", headers=self._auth),
                       self._check)

    def tasks(self, *, state: str | None = None, limit: int = 100, offset: int = 0) -> dict:
        params = {"limit": limit, "offset": offset} | ({"state": state} if state else {})
        return self._check(self._http.get("/v1/tasks", params=params, headers=self._auth))

    def wait(self, task_id: str, *, timeout: float | None = None, poll_s: float = 0.25,
             until: frozenset = FINAL | WAITING) -> dict:
        """The task once it is final or waits for the caller (``input-required``); raises
        ``TimeoutError`` after ``timeout`` seconds (default: the client's)."""
        end = time.monotonic() + (timeout if timeout is not None else self.default_timeout)
        while True:
            task = self.task(task_id)
            if task["state"] in until:
                return task
            if time.monotonic() >= end:
                raise TimeoutError(f"task {task_id} is still {task['state']}")
            time.sleep(poll_s)

    def send(self, task_id: str, input: dict) -> dict:
        """Answer a task that is ``input-required``: it goes on with this input."""
        return self._check(self._http.post(
            f"/v1/tasks/{task_id}/messages", content=orjson.dumps({"input": input}),
            headers={**self._auth, "Content-Type": "application/json"}))

    def cancel(self, task_id: str) -> dict:
        return self._check(self._http.post(f"/v1/tasks/{task_id}/cancel", headers=self._auth))


class AsyncReachClient(_Base):
    """``ReachClient`` for asyncio: the same methods, awaited (``stream`` is an async
    iterator)."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                 deadline: Deadline | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(base_url, api_key, timeout=timeout, deadline=deadline)
        self._http = httpx.AsyncClient(base_url=self.base_url, trust_env=False,
                                       transport=_AsyncUnreachable(
                                           transport or httpx.AsyncHTTPTransport()),
                                       timeout=httpx.Timeout(timeout + TRANSPORT_SLACK_S,
                                                             connect=5.0))

    async def __aenter__(self) -> AsyncReachClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def invoke(self, capability: str | None = None, *, intent: str | None = None,
                     input: dict | None = None, params: dict | None = None,
                     timeout: float | None = None, idempotency_key: str | None = None,
                     namespace: str | None = None, **extra) -> dict:
        timeout_s = self._timeout(timeout)
        response = await self._http.post(
            "/v1/invoke", content=orjson.dumps(_body(capability, intent, input, params,
                                                     {"namespace": namespace, **extra})),
            headers=self._headers(timeout_s, idempotency_key,
                                  {"Content-Type": "application/json"}),
            timeout=timeout_s + TRANSPORT_SLACK_S)
        return self._check(response)

    async def stream(self, capability: str | None = None, *, intent: str | None = None,
                     input: dict | None = None, params: dict | None = None,
                     timeout: float | None = None, namespace: str | None = None,
                     **extra) -> AsyncIterator[dict]:
        timeout_s = self._timeout(timeout)
        body = _body(capability, intent, input, params,
                     {"namespace": namespace, "stream": True, **extra})
        async with self._http.stream(
                "POST", "/v1/invoke", content=orjson.dumps(body),
                headers=self._headers(timeout_s, None, {"Content-Type": "application/json"}),
                timeout=timeout_s + TRANSPORT_SLACK_S) as response:
            if response.status_code >= 400 or response.status_code == 300:
                await response.aread()
                self._check(response)
            _require_events(response)
            framing = _EventLines()
            async for line in response.aiter_lines():
                framed = framing.line(line)
                event = _decoded(*framed) if framed else None
                if event is not None:
                    yield event
            framed = framing.end()
            event = _decoded(*framed) if framed else None
            if event is not None:
                yield event

    async def submit(self, capability: str | None = None, *, intent: str | None = None,
                     input: dict | None = None, params: dict | None = None,
                     callback_url: str | None = None, callback_secret: str | None = None,
                     idempotency_key: str | None = None, namespace: str | None = None,
                     **extra) -> dict:
        body = _body(capability, intent, input, params, {
            "mode": "async", "callback_url": callback_url, "callback_secret": callback_secret,
            "namespace": namespace, **extra})
        response = await self._http.post(
            "/v1/invoke", content=orjson.dumps(body),
            headers=self._headers(self.default_timeout, idempotency_key,
                                  {"Content-Type": "application/json"}))
        return self._check(response)

    async def task(self, task_id: str) -> dict:
        return _a_task(await self._http.get(f"/v1/tasks/{task_id}", headers=self._auth),
                       self._check)

    async def wait(self, task_id: str, *, timeout: float | None = None, poll_s: float = 0.25,
                   until: frozenset = FINAL | WAITING) -> dict:
        end = time.monotonic() + (timeout if timeout is not None else self.default_timeout)
        while True:
            task = await self.task(task_id)
            if task["state"] in until:
                return task
            if time.monotonic() >= end:
                raise TimeoutError(f"task {task_id} is still {task['state']}")
            await asyncio.sleep(poll_s)

    async def send(self, task_id: str, input: dict) -> dict:
        return self._check(await self._http.post(
            f"/v1/tasks/{task_id}/messages", content=orjson.dumps({"input": input}),
            headers={**self._auth, "Content-Type": "application/json"}))

    async def cancel(self, task_id: str) -> dict:
        return self._check(await self._http.post(f"/v1/tasks/{task_id}/cancel",
                                                 headers=self._auth))


def new_idempotency_key() -> str:
    return uuid.uuid4().hex
