"""A lean HTTP/1.1 client for calls to agents over plain HTTP: the data plane's hot path.

Why not aiohttp here: profiled under load (``bench/gateway_overhead.py --profile``),
aiohttp's client was 40 % of the gateway's CPU per call: a request and a response
object with their multidicts, a task to write each body, a timer object, an upload
tracker. An agent call is one small POST on a kept-alive connection, so this client
does the least that is correct: the head and body in one write, the reply parsed by
``httptools`` (llhttp, the parser uvicorn uses on the other side), and idle connections
kept per (host, port), last used first. ``https://`` goes on through aiohttp
(``H1Session.fallback``), with the same pools' settings.

It answers ``post`` as ``aiohttp.ClientSession`` does, for what the gateway reads
(``status``, ``headers``, ``content_type``, ``content_length``, ``read``, ``release``,
``close``, ``content.iter_any`` / ``iter_chunked``), and fails with aiohttp's exception
types, so ``gateway.upstream.translate_error`` reads both clients alike:

- no connection (refused, a refused address, no route) -> ``ConnectFailed``, and a
  connect time-out -> ``aiohttp.ConnectionTimeoutError``: never delivered;
- the connection reset (ECONNRESET, EPIPE) while bytes of the request were still in
  the send buffer -> ``ResetBeforeSent``: the agent never had the whole request;
- the connection closed or reset once the request was out, before the head ->
  ``aiohttp.ServerDisconnectedError`` / ``aiohttp.ClientOSError``: delivered as far as
  anyone can tell;
- the reply cut short or malformed -> ``aiohttp.ClientPayloadError``;
- the call's total time-out -> ``TimeoutError``; a stream idle past ``sock_read`` ->
  ``aiohttp.SocketTimeoutError``.

Limits: a reply head over ``MAX_HEAD_BYTES`` is refused; reading pauses while more than
``READ_HIGH_WATER`` bytes wait unread, each chunk counted ``CHUNK_COST`` more (a fast agent
cannot fill the gateway's memory behind a slow caller, nor hold its loop with tiny
chunks). Header values with CR or LF are refused before anything is sent. Every
connection is checked against the endpoint policy at connect time, after the name is
resolved (resolutions cached ``RESOLVE_TTL_S``), as ``SafeResolver`` does.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections import deque
from urllib.parse import urlencode, urlsplit

import aiohttp
import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from reach_core.endpoints import EndpointPolicy, EndpointRefused, resolve_and_check

MAX_HEAD_BYTES = 64 * 1024
READ_HIGH_WATER = 256 * 1024
# What a body chunk costs beyond its bytes, counted against ``READ_HIGH_WATER``: a
# reply of 1-byte chunks is parsed a Python call per chunk, and the event loop reads a
# socket up to 32 times in one turn; counted by its bytes only, a million such chunks held
# the loop for 150-280 ms at a time (helper-50 saw 1.5 s), never pausing the reading.
CHUNK_COST = 64
CHUNKS_PER_TURN = 4096  # body chunks read before the event loop is given a turn
RESOLVE_TTL_S = 30.0
RESET_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})


class ConnectFailed(aiohttp.ClientConnectionError):
    """No connection to the agent: nothing was sent."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class ResetBeforeSent(aiohttp.ClientOSError):
    """The agent reset the connection while part of the request was still unsent."""


class MalformedReply(aiohttp.ClientPayloadError):
    """The agent's reply breaks HTTP or this client's limits: the agent's fault, reported
    as ``upstream_bad_response`` (a reply cut short by the network stays a payload error)."""


class _Target:
    """A parsed ``http://`` URL, kept per URL string (agents' URLs are few and fixed)."""

    __slots__ = ("authority", "host", "path", "port")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.hostname is None:
            raise aiohttp.InvalidURL(url)
        self.host = parts.hostname
        self.port = parts.port or 80
        self.authority = parts.netloc.rpartition("@")[2]  # the Host header, as written
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


class _Connection(asyncio.Protocol):
    """One kept-alive connection; reads the reply of the one request in flight on it."""

    def __init__(self, key: tuple[str, int], session: H1Session) -> None:
        self.key = key
        self.session = session
        self.transport: asyncio.Transport | None = None
        self.response: H1Response | None = None
        self.closed = False
        # True while bytes of the request sit in the transport's buffer (see post).
        self.sending = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._unheaded = 0  # bytes fed since this reply's head began
        self._informational = False

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        # High water 0: pause_writing is called as soon as anything is left unsent, and
        # resume_writing once it all went out. That is how ``sending`` is known.
        transport.set_write_buffer_limits(high=0)

    def pause_writing(self) -> None:
        self.sending = True

    def resume_writing(self) -> None:
        self.sending = False

    def data_received(self, data: bytes) -> None:
        if self.response is None or self.response.finished:
            self._out_of_turn()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(MalformedReply("the agent switched protocols"))
            return
        except httptools.HttpParserError as exc:
            ours = exc.__context__
            self._fail(ours if isinstance(ours, aiohttp.ClientPayloadError) else
                       MalformedReply(f"the agent's reply is malformed ({exc})"))
            return
        if self.response is not None and self.response.status is None:
            # The parser keeps a header line it has not seen the end of: bound what the
            # head may take while it is still arriving, not only once it is complete.
            self._unheaded += len(data)
            if self._unheaded > MAX_HEAD_BYTES:
                self._fail(MalformedReply(
                    f"the agent's reply head is over {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool:
        return False  # close: a half-closed agent gets no further request

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is None or response.finished:
            return
        if response.status is not None and not response.framed and exc is None:
            response._complete(keep_alive=False)  # a body that ends at the close
            return
        if response.status is not None:
            response._fail(aiohttp.ClientPayloadError("the agent closed the connection "
                                                      "before the end of its reply"))
        elif exc is None:
            response._fail(aiohttp.ServerDisconnectedError())
        elif getattr(exc, "errno", None) in RESET_ERRNOS and self.sending:
            response._fail(ResetBeforeSent(exc.errno, str(exc)))
        else:
            response._fail(aiohttp.ClientOSError(getattr(exc, "errno", None) or 0, str(exc)))

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD_BYTES:
            raise MalformedReply(f"the agent's reply head is over {MAX_HEAD_BYTES} bytes")
        self._headers.append((name, value))

    def on_message_begin(self) -> None:
        if self.response is None or self.response.finished:
            # A second reply to one request (within the same read, or before the first
            # was released): whatever it answers, it is not the next call's reply.
            self._out_of_turn()
            raise MalformedReply("the agent sent more than one reply")

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        headers, self._headers, self._head_bytes, self._unheaded = self._headers, [], 0, 0
        if 100 <= status < 200:
            self._informational = True  # 100 Continue and friends: the reply follows
            return
        self.response._head_in(status, headers)

    def on_body(self, body: bytes) -> None:
        self.response._feed(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self.response._complete(keep_alive=self._parser.should_keep_alive())

    # -- ours
    def _out_of_turn(self) -> None:
        """Bytes nobody asked for. This connection is closed; and since the same agent may
        do it again a moment later, after the next request went out on another of its
        connections (where that reply would pass for the next call's: HTTP/1.1 cannot
        tell), its connections are not kept for a while (``H1Session.DISTRUST_S``)."""
        self.close()
        self.session._distrust(self.key)

    def _fail(self, exc: BaseException) -> None:
        if self.response is not None and not self.response.finished:
            self.response._fail(exc)
        self.close()

    def start(self, response: H1Response) -> None:
        self.response = response

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Body:
    """``response.content``: the body as it arrives, as aiohttp's ``StreamReader`` gives it."""

    __slots__ = ("_response",)

    def __init__(self, response: H1Response) -> None:
        self._response = response

    async def iter_any(self):
        response = self._response
        while True:
            chunk = await response._next_chunk()
            if not chunk:
                return
            yield chunk

    async def iter_chunked(self, size: int):
        async for chunk in self.iter_any():
            for start in range(0, len(chunk), size):
                yield chunk[start:start + size]


class H1Response:
    """The reply to one ``post``: its head once ``post`` returns, its body as read."""

    def __init__(self, session: H1Session, connection: _Connection,
                 loop: asyncio.AbstractEventLoop, deadline: float | None,
                 read_timeout: float | None) -> None:
        self._session = session
        self._connection = connection
        self._loop = loop
        self._read_timeout = read_timeout
        self.status: int | None = None
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self._fields: dict[bytes, bytes] = {}
        self.framed = True
        self.finished = False  # the whole reply is in, or it failed
        self._keep_alive = False
        self._error: BaseException | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future | None = None
        self._headers: CIMultiDictProxy | None = None
        self._deadline = None if deadline is None else loop.call_at(deadline, self._expire)
        self.content = _Body(self)

    # -- the head
    @property
    def headers(self) -> CIMultiDictProxy:
        if self._headers is None:
            self._headers = CIMultiDictProxy(CIMultiDict(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in self.raw_headers))
        return self._headers

    def _header(self, name: bytes) -> bytes | None:
        return self._fields.get(name)

    @property
    def content_type(self) -> str:
        value = self._header(b"content-type")
        if value is None:
            return "application/octet-stream"
        return value.split(b";", 1)[0].strip().lower().decode("latin-1")

    @property
    def content_length(self) -> int | None:
        value = self._header(b"content-length")
        return int(value) if value is not None and value.isdigit() else None

    # -- what the connection feeds
    def _head_in(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        # By lower-case name, the last one winning (llhttp refuses conflicting lengths).
        fields = self._fields = {name.lower(): value for name, value in headers}
        encoding = fields.get(b"content-encoding")
        if encoding is not None and encoding.strip().lower() != b"identity":
            # Asked for identity (see post): a body that would be passed on undecoded.
            raise MalformedReply(
                "the agent's reply is encoded (Content-Encoding: "
                f"{encoding.decode('latin-1')[:40]}) though the gateway asked for identity")
        self.status, self.raw_headers = status, headers
        self.framed = status in (204, 304) or b"content-length" in fields \
            or b"chunked" in fields.get(b"transfer-encoding", b"").lower()
        self._wake()

    def _feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk) + CHUNK_COST
        if self._buffered > READ_HIGH_WATER and not self._paused:
            self._paused = True
            self._connection.transport.pause_reading()
        self._wake()

    def _complete(self, *, keep_alive: bool) -> None:
        if self.status is None:  # never without a head; if ever, fail rather than hang
            self._fail(aiohttp.ClientPayloadError("the agent's reply ended without a head"))
            return
        self.finished = True
        self._keep_alive = keep_alive
        self._stop_deadline()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if self.finished:
            return
        self.finished = True
        self._error = exc
        self._stop_deadline()
        self._wake()

    def _expire(self) -> None:
        self._deadline = None
        if not self.finished:
            self._fail(TimeoutError())
            self._connection.close()

    def _stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        """Until the connection feeds something; a stream waits ``read_timeout`` at most."""
        self._waiter = waiter = self._loop.create_future()
        timer = None if self._read_timeout is None else self._loop.call_later(
            self._read_timeout, self._idle_expired, waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            self.close()  # a caller gone mid-reply: the connection is of no further use
            raise
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _idle_expired(self, waiter: asyncio.Future) -> None:
        if not waiter.done():
            self._fail(aiohttp.SocketTimeoutError("the agent sent nothing for "
                                                  f"{self._read_timeout:g} s"))
            self._connection.close()

    async def _until_head(self) -> None:
        while self.status is None:
            if self._error is not None:
                raise self._error
            if self.finished:
                raise aiohttp.ClientPayloadError("the agent's reply ended without a head")
            await self._wait()

    async def _next_chunk(self) -> bytes:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.finished:
                return b""
            await self._wait()
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk) + CHUNK_COST
        if self._paused and self._buffered <= READ_HIGH_WATER // 4:
            self._paused = False
            self._connection.transport.resume_reading()
        return chunk

    # -- what the caller uses
    async def read(self) -> bytes:
        parts = []
        while chunk := await self._next_chunk():
            parts.append(chunk)
            if len(parts) >= CHUNKS_PER_TURN:
                # Many small chunks: joined as they come (one join of a million, and
                # their freeing, held the loop 50 ms), and the loop is given a turn.
                parts = [b"".join(parts)]
                await asyncio.sleep(0)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Done with the reply: the connection goes back to the pool when the reply was
        read to its end on a connection that stays open, else it is closed."""
        self._stop_deadline()
        connection, self._connection = self._connection, None
        if connection is None:
            return
        connection.response = None
        # Not while part of the request is still unsent (an agent that answered before
        # reading it all): the rest would be read as the start of the next request.
        if self.finished and self._error is None and self._keep_alive and not self._chunks \
                and not connection.closed and not connection.sending:
            self._session._give_back(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Drop the connection (the agent sees its caller go away)."""
        self._stop_deadline()
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.response = None
            connection.close()
        if not self.finished:
            self._fail(aiohttp.ClientConnectionError("the reply was closed"))

    async def __aenter__(self) -> H1Response:
        return self

    async def __aexit__(self, *exc) -> None:
        self.release()


class H1Session:
    """Kept-alive connections to plain-HTTP agents for one keep-alive setting: at most
    ``max_idle_hosts`` (host, port) keys hold idle connections, each for ``idle_seconds``.
    An agent that sent bytes out of turn gets no kept connection for ``DISTRUST_S``."""

    DISTRUST_S = 60.0

    def __init__(self, policy: EndpointPolicy, *, idle_seconds: float, max_idle_hosts: int,
                 fallback) -> None:
        self._policy = policy
        self._idle_seconds = idle_seconds
        self._max_idle_hosts = max_idle_hosts
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._targets: dict[str, _Target] = {}
        self._resolved: dict[tuple[str, int], tuple[float, list[str]]] = {}
        self._fallback = fallback  # () -> aiohttp.ClientSession, for https://
        self._sweeper: asyncio.TimerHandle | None = None
        self._distrusted: dict[tuple[str, int], float] = {}
        self.closed = False

    @property
    def fallback(self) -> aiohttp.ClientSession:
        return self._fallback()

    def idle_connections(self) -> int:
        return sum(sum(1 for c in kept if not c.closed) for kept in self._idle.values())

    async def close(self) -> None:
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        idle, self._idle = self._idle, {}
        for kept in idle.values():
            for connection in kept:
                connection.close()

    async def post(self, url: str, *, data: bytes, headers: dict[str, str],
                   params: dict | None = None, allow_redirects: bool = False,
                   timeout: aiohttp.ClientTimeout | None = None, ssl=True,
                   upload_tracker=None) -> H1Response:
        if not url.startswith("http://"):
            extra = {"upload_tracker": upload_tracker} if upload_tracker is not None else {}
            return await self.fallback.post(url, data=data, headers=headers, params=params,
                                            allow_redirects=allow_redirects, timeout=timeout,
                                            ssl=ssl, **extra)
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) > 4096:
                self._targets.clear()
            target = self._targets[url] = _Target(url)
        path = target.path
        if params:
            path += ("&" if "?" in path else "?") + urlencode(params)
        # Identity asked for explicitly: with no Accept-Encoding any coding is acceptable
        # (RFC 9110), and this client relays bodies as they come.
        lines = [f"POST {path} HTTP/1.1\r\nHost: {target.authority}\r\n"
                 "Accept-Encoding: identity\r\n"]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers.items())
        lines.append(f"Content-Length: {len(data)}\r\n\r\n")
        head = "".join(lines)
        # Every line ends in CRLF and none may hold another: a header value carrying one
        # would smuggle a header (or a request) to the agent.
        crlfs = len(lines) + 3  # the first line holds three, the last two
        if head.count("\n") != crlfs or head.count("\r") != crlfs:
            raise ValueError("a header value holds a line break")
        loop = asyncio.get_running_loop()
        total = timeout.total if timeout is not None else None
        deadline = None if total is None else loop.time() + total
        key = (target.host, target.port)
        connection = self._take(key)
        if connection is None:
            connect_s = timeout.sock_connect if timeout is not None else None
            if total is not None:
                connect_s = total if connect_s is None else min(connect_s, total)
            connection = await self._connect(loop, url, key, connect_s)
        response = H1Response(self, connection, loop, deadline,
                              timeout.sock_read if timeout is not None else None)
        connection.start(response)
        transport = connection.transport
        connection.sending = True
        transport.write(head.encode("utf-8") + data)
        # Written through unless the transport kept some (then resume_writing clears
        # it) or the write failed (then the transport is closing and nothing is known
        # to have gone out: it stays "sending").
        if not transport.is_closing() and not transport.get_write_buffer_size():
            connection.sending = False
        try:
            await response._until_head()
        except BaseException:
            response.close()
            raise
        return response

    def _take(self, key: tuple[str, int]) -> _Connection | None:
        kept = self._idle.get(key)
        while kept:
            connection = kept.pop()
            if not connection.closed:
                if not kept:
                    del self._idle[key]
                return connection
        if kept is not None:
            del self._idle[key]
        return None

    def _distrust(self, key: tuple[str, int]) -> None:
        if len(self._distrusted) > 4096:
            self._distrusted.clear()
        self._distrusted[key] = time.monotonic() + self.DISTRUST_S
        for connection in self._idle.pop(key, ()):
            connection.close()

    def _give_back(self, connection: _Connection) -> None:
        if self.closed:
            connection.close()
            return
        if self._distrusted:
            until = self._distrusted.get(connection.key)
            if until is not None:
                if time.monotonic() < until:
                    connection.close()
                    return
                del self._distrusted[connection.key]
        kept = self._idle.get(connection.key)
        if kept is None:
            if len(self._idle) >= self._max_idle_hosts:
                connection.close()
                return
            kept = self._idle[connection.key] = []
        kept.append(connection)
        connection.idle_since = time.monotonic()
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(self._idle_seconds,
                                                                   self._sweep)

    def _sweep(self) -> None:
        """Close the connections idle for ``idle_seconds``; come back at the next expiry.
        One timer per session rather than one per returned connection: this is cheaper
        on every call, and the kept connections are few (``max_idle_hosts``)."""
        self._sweeper = None
        now = time.monotonic()
        soonest = None
        for key in list(self._idle):
            kept = []
            for connection in self._idle[key]:
                if connection.closed:
                    continue
                if now - connection.idle_since >= self._idle_seconds:
                    connection.close()
                    continue
                kept.append(connection)
                if soonest is None or connection.idle_since < soonest:
                    soonest = connection.idle_since
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        if soonest is not None:
            self._sweeper = asyncio.get_running_loop().call_later(
                soonest + self._idle_seconds - now, self._sweep)

    async def _connect(self, loop, url: str, key: tuple[str, int], timeout_s: float | None):
        host, port = key
        try:
            addresses = await self._resolve(url, key)
        except EndpointRefused as exc:
            raise ConnectFailed(OSError(f"refused by the endpoint policy: {exc}")) from exc
        except OSError as exc:
            raise ConnectFailed(exc) from exc
        last: OSError | None = None
        for address in addresses:
            try:
                async with asyncio.timeout(timeout_s):
                    _, connection = await loop.create_connection(
                        lambda: _Connection(key, self), address, port)
                return connection
            except TimeoutError:
                raise aiohttp.ConnectionTimeoutError(
                    f"connecting to {host}:{port} timed out") from None
            except OSError as exc:
                last = exc
        raise ConnectFailed(last or OSError(f"{host} has no address"))

    async def _resolve(self, url: str, key: tuple[str, int]) -> list[str]:
        """The addresses to connect to, each allowed by the endpoint policy, kept for
        ``RESOLVE_TTL_S`` per (host, port)."""
        cached = self._resolved.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < RESOLVE_TTL_S:
            return cached[1]
        addresses = await resolve_and_check(url, self._policy)
        if len(self._resolved) > 4096:
            self._resolved.clear()
        self._resolved[key] = (now, addresses)
        return addresses
