"""Reverse tunnels: agents behind NAT hold a WebSocket to a gateway, and calls come to them
through it.

An agent (``reach: tunnel``) opens ``GET /v1/tunnel`` with its agent token
(``Authorization: Bearer``) and its instance id (``X-Reach-Instance``) and listens on no
port. The gateway sends each call as frames over that socket and reads the answer back,
several calls at once, told apart by a stream id. Frames are JSON text messages:

    gateway -> agent  {"t": "req", "id", "method", "path", "headers", "body"}
                      {"t": "credit", "id", "bytes"}       more of a stream may come
                      {"t": "cancel", "id"}                the caller went away
                      {"t": "ping"} / {"t": "pong"}
    agent -> gateway  {"t": "head", "id", "status", "headers"}
                      {"t": "data", "id", "data"}          part of the body (text)
                      {"t": "end", "id"} / {"t": "error", "id", "message"}
                      {"t": "ping"} / {"t": "pong"}

Flow control: the agent may have at most ``WINDOW`` bytes of a stream's body in flight;
the gateway grants more (``credit``) as it hands them on. A frame over ``MAX_FRAME`` bytes
closes the socket with 1009. The gateway pings every ``PING_S`` (20 s) and drops a peer that
does not answer within ``PONG_TIMEOUT_S`` (5 s), failing its calls at once.

Several gateway processes: the one holding a tunnel records it (``TunnelDirectory``, in
Redis); a call that lands on another is relayed to the holder through the channel layer
(channels-redis), request and answer frames alike. An instance whose tunnel no gateway
holds is not routable (``TunnelHub.up``, the router's presence check).

To the caller an upstream over a tunnel is the same as a direct one: ``TunnelSession``
answers ``post`` with a response the call pipeline reads or relays as it reads aiohttp's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson

from reach_core.errors import error_body
from reach_core.requestid import new_request_id
from routing.table import RouteTable

logger = logging.getLogger(__name__)

TUNNEL_PATH = "/v1/tunnel"
MAX_FRAME = 4 * 1024 * 1024
WINDOW = 256 * 1024
PING_S = 20.0
PONG_TIMEOUT_S = 5.0
# A holder renews its records every second; a gateway killed outright stops being the
# holder (and its tunnels stop being routable) this long after.
DIRECTORY_TTL_S = 3.0
# How long a relayed call waits for the holding gateway to take it: a dead holder is a
# quick 502, not a wait for the caller's whole deadline.
RELAY_ACK_S = 2.0
PRESENCE_S = 1.0  # how often a gateway learns which tunnels the others hold
# Close codes (4000-4999 are the application's).
# One prefix for every relay channel of a process (its inbox and each call's replies):
# channels-redis serves all of a process's channels under one lock, receiving on the
# prefix's shared Redis list and sorting messages out to each channel. Channels under
# two prefixes would wait on each other's blocking reads.
RELAY_PREFIX = "tunnel"
CLOSE_TOO_BIG = 1009
CLOSE_NOT_A_FRAME = 1007  # RFC 6455: data inconsistent with the message's type
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_REPLACED = 4409
CLOSE_UNAVAILABLE = 1013  # try again later


class TunnelDown(aiohttp.ClientConnectionError):
    """No gateway holds the instance's tunnel: the call was never sent."""


class TunnelBadFrame(aiohttp.ClientPayloadError):
    """The agent broke the tunnel's protocol for one call (a head that is not one, a
    body before its head, more than its credit allows): that call fails as a bad
    response."""


_spawned: set[asyncio.Future] = set()


async def _nothing() -> None:
    return None


def spawn(coro) -> asyncio.Future:
    """Run ``coro`` on its own, kept referenced until done, its failure swallowed (frames
    to a socket that closed meanwhile)."""
    task = asyncio.ensure_future(coro)
    _spawned.add(task)
    task.add_done_callback(lambda t: (_spawned.discard(t), t.cancelled() or t.exception()))
    return task


# ---- the answer, as the pipeline reads it -------------------------------------------------


class _Content:
    """The body of a tunnelled answer, read like aiohttp's ``StreamReader``."""

    def __init__(self, response: TunnelResponse) -> None:
        self._response = response

    async def iter_any(self):
        while True:
            chunk = await self._response._next()
            if chunk is None:
                return
            yield chunk

    async def iter_chunked(self, size: int):  # the pipeline reads what comes
        async for chunk in self.iter_any():
            yield chunk


class TunnelResponse:
    """An answer coming over a tunnel: status and headers first, the body as it comes.
    ``timeout``: the whole answer (a plain call); ``idle``: the longest gap between parts
    (a stream)."""

    def __init__(self, stream: _Stream, *, deadline: float | None, idle: float | None) -> None:
        self._stream = stream
        self._deadline = deadline
        self._idle = idle
        self.status = 0
        self.headers: dict[str, str] = {}
        self.content = _Content(self)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/octet-stream").split(";")[0].strip()

    @property
    def content_length(self) -> int | None:
        raw = self.headers.get("content-length")
        return int(raw) if raw and raw.isdigit() else None

    def _wait_s(self) -> float | None:
        limits = [x for x in (self._idle, None if self._deadline is None
                              else self._deadline - time.monotonic()) if x is not None]
        return max(0.0, min(limits)) if limits else None

    async def _head(self) -> None:
        head = await asyncio.wait_for(self._stream.head, self._wait_s())
        self.status = int(head["status"])
        self.headers = {str(k).lower(): str(v) for k, v in (head.get("headers") or {}).items()}

    async def _next(self) -> bytes | None:
        event = await asyncio.wait_for(self._stream.parts.get(), self._wait_s())
        if isinstance(event, BaseException):
            raise event
        if event is not None:
            self._stream.consumed(len(event))
        return event

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.content.iter_any()])

    def release(self) -> None:
        self._stream.close()

    def close(self) -> None:
        self._stream.close()


class _Stream:
    """One call over a tunnel (local or relayed): its head, its body parts, its credit."""

    def __init__(self, on_close: Callable[[], None], grant: Callable[[int], None]) -> None:
        loop = asyncio.get_running_loop()
        self.head: asyncio.Future = loop.create_future()
        self.parts: asyncio.Queue = asyncio.Queue()
        self._on_close = on_close
        self._grant = grant
        self._pending_credit = 0
        self.unacknowledged = 0  # body bytes the agent sent beyond what was granted back
        self.closed = False

    def feed_head(self, frame: dict) -> None:
        if not self.head.done():
            self.head.set_result(frame)

    def feed(self, data: bytes) -> None:
        self.parts.put_nowait(data)

    def end(self) -> None:
        self.parts.put_nowait(None)

    def fail(self, exc: BaseException) -> None:
        if not self.head.done():
            self.head.set_exception(exc)
        self.parts.put_nowait(exc)

    def consumed(self, size: int) -> None:
        # Credit in batches (a quarter window), not a frame per part.
        self._pending_credit += size
        if self._pending_credit >= WINDOW // 4:
            self._grant(self._pending_credit)
            self.unacknowledged -= self._pending_credit
            self._pending_credit = 0

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._on_close()


# ---- one agent's tunnel, held by this process ---------------------------------------------


def _valid_head(frame: dict) -> bool:
    status, headers = frame.get("status"), frame.get("headers") or {}
    return (type(status) is int and 100 <= status <= 599 and isinstance(headers, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()))



class TunnelConnection:
    def __init__(self, instance_pk: int, send: Callable[[dict], Awaitable[None]]) -> None:
        self.instance_pk = instance_pk
        self._send = send
        self._ids = itertools.count(1)
        self.streams: dict[int, _Stream] = {}
        self.closed = False
        self.last_pong = time.monotonic()
        # Closes this socket when a newer one of the same instance takes over.
        self.close_replaced: Callable[[], Awaitable[None]] = _nothing

    async def request(self, method: str, path: str, headers: dict, body: bytes,
                      stream: _Stream | None = None) -> tuple[int, _Stream]:
        if self.closed:
            raise TunnelDown("the tunnel closed")
        sid = next(self._ids)
        if stream is None:
            stream = _Stream(on_close=lambda: self._forget(sid),
                             grant=lambda n: spawn(self._frame(
                                 {"t": "credit", "id": sid, "bytes": n})))
        self.streams[sid] = stream
        await self._frame({"t": "req", "id": sid, "method": method, "path": path,
                           "headers": headers, "body": body.decode("utf-8", "replace")})
        return sid, stream

    def _forget(self, sid: int) -> None:
        stream = self.streams.pop(sid, None)
        if stream is not None and not self.closed:
            spawn(self._frame({"t": "cancel", "id": sid}))

    async def _frame(self, frame: dict) -> None:
        await self._send(frame)

    def on_frame(self, frame: dict) -> None:
        kind = frame.get("t")
        if kind == "ping":
            spawn(self._frame({"t": "pong"}))
            return
        if kind == "pong":
            self.last_pong = time.monotonic()
            return
        stream = self.streams.get(frame.get("id"))
        if stream is None:
            return  # a stream already given up (the caller left)
        if kind == "head":
            if _valid_head(frame):
                stream.feed_head(frame)
            else:
                self._refuse(frame["id"], stream, "a head frame whose status is not an HTTP "
                             "status or whose headers are not a mapping of strings")
        elif kind == "data":
            data = str(frame.get("data", "")).encode()
            stream.unacknowledged += len(data)
            if not stream.head.done():
                self._refuse(frame["id"], stream, "body data before the head")
            elif stream.unacknowledged > WINDOW:
                self._refuse(frame["id"], stream, "more body than its flow-control credit")
            else:
                stream.feed(data)
        elif kind == "end":
            stream.end()
            self.streams.pop(frame["id"], None)
        elif kind == "error":
            stream.fail(aiohttp.ServerDisconnectedError(
                f"the agent failed the call: {str(frame.get('message'))[:200]}"))
            self.streams.pop(frame["id"], None)

    def _refuse(self, sid, stream: _Stream, what: str) -> None:
        stream.fail(TunnelBadFrame(f"the agent's tunnel sent {what}"))
        self.streams.pop(sid, None)
        spawn(self._frame({"t": "cancel", "id": sid}))

    def broke(self, what: str) -> None:
        """The agent sent what belongs to no call (a frame that is no JSON object): it
        does not speak the protocol, and every call on the tunnel fails as its bad
        response, at once rather than at its deadline."""
        self._fail_all(lambda: TunnelBadFrame(f"the agent's tunnel sent {what}"))

    def lost(self) -> None:
        """The socket is gone: every call on it fails now (delivered: the agent had it)."""
        self._fail_all(lambda: aiohttp.ServerDisconnectedError("the agent's tunnel closed"))

    def _fail_all(self, error: Callable[[], Exception]) -> None:
        """Closed, and each of its calls failed with an error of its own."""
        self.closed = True
        streams, self.streams = list(self.streams.values()), {}
        for stream in streams:
            stream.fail(error())


# ---- where tunnels are held ---------------------------------------------------------------


class LocalDirectory:
    """One process: the tunnels it holds are all there are (the embedded mode)."""

    async def claim(self, instance_pk: int, holder: str) -> None:
        return None

    async def claim_many(self, instance_pks: list[int], holder: str) -> None:
        return None

    async def release(self, instance_pk: int, holder: str) -> None:
        return None

    async def holder(self, instance_pk: int) -> str | None:
        return None

    async def present(self) -> set[int]:
        return set()


class RedisDirectory:
    """``<prefix>tunnel:<instance>`` -> the holding process's relay channel, with a TTL the
    holder renews; and ``<prefix>tunnels``, every held tunnel scored by when its record
    lapses, so that ``present`` (asked every second by every gateway, for routing) is one
    range read however many keys Redis holds."""

    def __init__(self, client, prefix: str, clock: Callable[[], float] = time.time) -> None:
        self._client = client
        self._prefix = f"{prefix}tunnel:"
        self._all = f"{prefix}tunnels"
        self._clock = clock

    async def claim(self, instance_pk: int, holder: str) -> None:
        await self.claim_many([instance_pk], holder)

    async def claim_many(self, instance_pks: list[int], holder: str) -> None:
        """Renew the records of ``instance_pks`` (one round trip however many)."""
        if not instance_pks:
            return
        pipe = self._client.pipeline(transaction=False)
        for pk in instance_pks:
            pipe.set(f"{self._prefix}{pk}", holder, px=int(DIRECTORY_TTL_S * 1000))
        lapses = self._clock() + DIRECTORY_TTL_S
        pipe.zadd(self._all, {str(pk): lapses for pk in instance_pks})
        await pipe.execute()

    async def release(self, instance_pk: int, holder: str) -> None:
        key = f"{self._prefix}{instance_pk}"
        if (await self._client.get(key) or b"").decode() == holder:
            await self._client.delete(key)
            await self._client.zrem(self._all, str(instance_pk))

    async def holder(self, instance_pk: int) -> str | None:
        value = await self._client.get(f"{self._prefix}{instance_pk}")
        return value.decode() if value else None

    async def present(self) -> set[int]:
        now = self._clock()
        await self._client.zremrangebyscore(self._all, "-inf", now)
        return {int(m) for m in await self._client.zrangebyscore(self._all, now, "+inf")}


# ---- the hub: this process's tunnels, and calls to any tunnel -----------------------------


class TunnelHub:
    """Serves ``/v1/tunnel`` and carries calls to tunnelled instances, wherever their
    tunnel is held. ``authenticate(token)`` gives the agent pk of an agent token (or None);
    ``relay`` is a channel layer (``new_channel``, ``send``, ``receive``) when several
    processes share the tunnels, None in one process."""

    def __init__(self, *, table: Callable[[], RouteTable],
                 authenticate: Callable[[str], Awaitable[int | None]],
                 directory=None, relay=None) -> None:
        self._table = table
        self._authenticate = authenticate
        self.directory = directory or LocalDirectory()
        self._relay = relay
        self.channel: str | None = None  # this process's relay inbox
        self.local: dict[int, TunnelConnection] = {}
        self._present: set[int] = set()

    # -- presence (routing)

    def up(self, instance_pk: int) -> bool:
        return instance_pk in self.local or instance_pk in self._present

    async def follow(self) -> None:
        """Background job: keep the directory's records of this process's tunnels alive,
        learn the others' (every few seconds), and serve relayed calls."""
        if self._relay is not None:
            self.channel = await self._relay.new_channel(RELAY_PREFIX)
            await asyncio.gather(self._refresh_forever(), _restarting(self._serve_relayed))
        else:
            await self._refresh_forever()

    async def _refresh_forever(self) -> None:
        """Every second: this process's own records renewed, and the tunnels held
        anywhere learnt (for routing)."""
        while True:
            try:
                await self.directory.claim_many(list(self.local), self._holder())
                self._present = await self.directory.present()
            except Exception as exc:  # Redis away: local tunnels still serve
                logger.warning("tunnel directory refresh failed (%s)", type(exc).__name__)
            await asyncio.sleep(PRESENCE_S)

    def _holder(self) -> str:
        return self.channel or "local"

    # -- the WebSocket

    async def serve(self, scope, receive, send) -> None:
        """ASGI ``websocket`` for ``/v1/tunnel``."""
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        token = headers.get("authorization", "").partition(" ")[2].strip()
        raw_instance = headers.get("x-reach-instance", "")
        agent_pk = await self._authenticate(token) if token else None
        if agent_pk is None:
            await _refuse(scope, send, CLOSE_UNAUTHORIZED, 401, "unauthorized",
                          "An agent token (Authorization: Bearer) is needed for a tunnel.")
            return
        instance_pk = int(raw_instance) if raw_instance.isdigit() else None
        if instance_pk is None or not await self._owns(agent_pk, instance_pk):
            await _refuse(scope, send, CLOSE_FORBIDDEN, 403, "forbidden",
                          "X-Reach-Instance must name an instance of this token's agent.")
            return
        await send({"type": "websocket.accept"})
        lock = asyncio.Lock()

        async def send_frame(frame: dict) -> None:
            async with lock:
                await send({"type": "websocket.send", "text": orjson.dumps(frame).decode()})

        async def close_replaced() -> None:
            async with lock:
                await send({"type": "websocket.close", "code": CLOSE_REPLACED})

        connection = TunnelConnection(instance_pk, send_frame)
        connection.close_replaced = close_replaced
        previous = self.local.get(instance_pk)
        if previous is not None:
            # The agent reconnected: the newer socket wins, and the older is closed (left
            # open, its agent would think itself reachable through it).
            previous.lost()
            spawn(previous.close_replaced())
        self.local[instance_pk] = connection
        with contextlib.suppress(Exception):
            await self.directory.claim(instance_pk, self._holder())
        pinging = asyncio.ensure_future(self._ping(connection, send_frame, send))
        logger.info("tunnel up: instance %s", instance_pk)
        try:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    return
                text = message.get("text")
                raw = text.encode() if text is not None else message.get("bytes") or b""
                if len(raw) > MAX_FRAME:
                    await send({"type": "websocket.close", "code": CLOSE_TOO_BIG})
                    return
                try:
                    frame = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    frame = None
                if not isinstance(frame, dict):
                    # Skipped, it left the call it was meant for waiting out its
                    # deadline (helper-53 saw such calls end as retryable errors).
                    connection.broke("a frame that is not a JSON object")
                    await send({"type": "websocket.close", "code": CLOSE_NOT_A_FRAME})
                    return
                connection.on_frame(frame)
        finally:
            pinging.cancel()
            connection.lost()
            if self.local.get(instance_pk) is connection:
                del self.local[instance_pk]
                with contextlib.suppress(Exception):
                    await self.directory.release(instance_pk, self._holder())
            logger.info("tunnel down: instance %s", instance_pk)

    async def _owns(self, agent_pk: int, instance_pk: int) -> bool:
        # A registration a moment ago may not have reached this process's table yet.
        for _ in range(20):
            agent = self._table().agents.get(agent_pk)
            if agent is not None and any(i.pk == instance_pk and i.reach_mode == "tunnel"
                                         for i in agent.instances):
                return True
            await asyncio.sleep(0.1)
        return False

    async def _ping(self, connection: TunnelConnection, send_frame, send) -> None:
        while not connection.closed:
            await asyncio.sleep(PING_S)
            asked = time.monotonic()
            with contextlib.suppress(Exception):
                await send_frame({"t": "ping"})
            await asyncio.sleep(PONG_TIMEOUT_S)
            if connection.last_pong < asked:
                logger.warning("tunnel of instance %s: no pong in %.0f s; closing",
                               connection.instance_pk, PONG_TIMEOUT_S)
                connection.lost()
                with contextlib.suppress(Exception):
                    await send({"type": "websocket.close", "code": 1011})
                return

    # -- calls

    def session(self, instance_pk: int) -> TunnelSession:
        return TunnelSession(self, instance_pk)

    async def open(self, instance_pk: int, method: str, path: str, headers: dict,
                   body: bytes) -> _Stream:
        """Send a call to the instance's tunnel, here or where it is held."""
        local = self.local.get(instance_pk)
        if local is not None:
            _, stream = await local.request(method, path, headers, body)
            return stream
        holder = None
        if self._relay is not None:
            with contextlib.suppress(Exception):
                holder = await self.directory.holder(instance_pk)
        if not holder or holder == self.channel:
            raise TunnelDown("no gateway holds this instance's tunnel")
        return await self._relayed(holder, instance_pk, method, path, headers, body)

    async def _relayed(self, holder: str, instance_pk: int, method: str, path: str,
                       headers: dict, body: bytes) -> _Stream:
        reply = await self._relay.new_channel(RELAY_PREFIX)
        call = uuid.uuid4().hex
        closed = False

        def on_close() -> None:
            nonlocal closed
            closed = True
            spawn(self._relay.send(holder, {"type": "tunnel.cancel", "call": call}))

        stream = _Stream(on_close=on_close, grant=lambda n: None)
        await self._relay.send(holder, {
            "type": "tunnel.request", "call": call, "reply": reply, "instance": instance_pk,
            "method": method, "path": path, "headers": headers, "body": body})

        async def pump() -> None:
            try:
                try:
                    await asyncio.wait_for(self._relay.receive(reply), RELAY_ACK_S)
                except TimeoutError:
                    stream.fail(TunnelDown("the gateway holding the tunnel did not take "
                                           "the call"))
                    return
                while not closed:
                    message = await self._relay.receive(reply)
                    kind = message.get("type")
                    if kind == "tunnel.head":
                        stream.feed_head(message)
                    elif kind == "tunnel.data":
                        stream.feed(message["data"])
                    elif kind == "tunnel.end":
                        stream.end()
                        return
                    elif kind == "tunnel.error":
                        stream.fail(aiohttp.ServerDisconnectedError(message.get("message")))
                        return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                stream.fail(aiohttp.ServerDisconnectedError(f"relay failed ({exc})"))

        spawn(pump())
        return stream

    async def _serve_relayed(self) -> None:
        """Calls other processes relay to the tunnels held here."""
        calls: dict[str, _Stream] = {}
        while True:
            message = await self._relay.receive(self.channel)
            if message.get("type") == "tunnel.cancel":
                stream = calls.pop(message.get("call"), None)
                if stream is not None:
                    stream.close()
            elif message.get("type") == "tunnel.request":
                spawn(self._answer_relayed(message, calls))

    async def _send_relayed(self, channel: str, message: dict) -> None:
        # A reader slower than the agent fills its channel (100 messages): wait for room
        # rather than drop a part of the answer.
        for _ in range(100):
            try:
                await self._relay.send(channel, message)
                return
            except Exception as exc:
                if type(exc).__name__ != "ChannelFull":
                    raise
                await asyncio.sleep(0.05)
        raise TimeoutError("the relayed call's reader stopped reading")

    async def _answer_relayed(self, message: dict, calls: dict) -> None:
        reply, call = message["reply"], message["call"]
        local = self.local.get(message["instance"])
        if local is None:
            await self._relay.send(reply, {"type": "tunnel.error",
                                           "message": "the tunnel moved or closed"})
            return
        try:
            await self._relay.send(reply, {"type": "tunnel.accepted"})
            _, stream = await local.request(message["method"], message["path"],
                                            message["headers"], message["body"])
            calls[call] = stream
            head = await stream.head
            await self._relay.send(reply, {"type": "tunnel.head", "status": head["status"],
                                           "headers": head.get("headers") or {}})
            while True:
                part = await stream.parts.get()
                if isinstance(part, BaseException):
                    raise part
                if part is None:
                    await self._relay.send(reply, {"type": "tunnel.end"})
                    return
                stream.consumed(len(part))
                await self._send_relayed(reply, {"type": "tunnel.data", "data": part})
        except Exception as exc:
            with contextlib.suppress(Exception):
                await self._relay.send(reply, {"type": "tunnel.error",
                                               "message": str(exc)[:200]})
        finally:
            stream = calls.pop(call, None)
            if stream is not None:
                stream.close()


async def _restarting(job: Callable[[], Awaitable[None]]) -> None:
    """Run ``job`` for good: a failure is logged and the job started again a moment later
    (the other jobs of ``follow`` must not end with it)."""
    while True:
        try:
            await job()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis away or slow: the relay resumes when it answers
            logger.warning("tunnel relay failed (%s); starting it again", type(exc).__name__)
            await asyncio.sleep(1.0)


class TunnelSession:
    """``post`` as ``aiohttp.ClientSession`` answers it, over a tunnel."""

    def __init__(self, hub: TunnelHub, instance_pk: int) -> None:
        self._hub = hub
        self._instance_pk = instance_pk
        self.closed = False

    async def post(self, url: str, *, data: bytes, headers: dict, params=None,
                   timeout: aiohttp.ClientTimeout | None = None, **_: Any) -> TunnelResponse:
        path = url.split("://", 1)[-1].partition("/")[2]
        path = "/" + path
        if params:
            from urllib.parse import urlencode

            path += ("&" if "?" in path else "?") + urlencode(params)
        total = timeout.total if timeout is not None else None
        idle = timeout.sock_read if timeout is not None else None
        deadline = time.monotonic() + total if total else None
        stream = await self._hub.open(self._instance_pk, "POST", path, dict(headers),
                                      data)
        response = TunnelResponse(stream, deadline=deadline, idle=idle)
        try:
            await response._head()
        except BaseException:
            stream.close()
            raise
        return response


async def _refuse(scope, send, close_code: int, status: int, code: str, message: str) -> None:
    """A handshake refused in the platform's error shape where the server can answer it
    in HTTP (helper-50: a bare 403 with an empty body), else by the close code."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": close_code})
        return
    request_id = new_request_id()
    body = orjson.dumps(error_body(code=code, message=message, request_id=request_id))
    await send({"type": "websocket.http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode())]})
    await send({"type": "websocket.http.response.body", "body": body})
