"""uvicorn's HTTP/1.1 protocol (httptools) with a deadline on request heads.

uvicorn times out only an idle kept-alive connection, and only until its next byte: a
connection that is opened and sends nothing, or sends its request head a byte every few
seconds, is kept for ever, and enough of them take every file descriptor the process
has (slowloris). Here every request head — from the connection's first byte, or from a
kept-alive connection's next request — must be complete within
``REACH_HEADER_TIMEOUT_S`` (10 s): else the caller gets 408 ``request_timeout`` and the
connection is closed (a connection that sent nothing at all is just closed). The body
has its own limit in the gateway (``REACH_GATEWAY_BODY_TIMEOUT_S``).

Bytes that are no HTTP request get uvicorn's 400 in the platform's one error shape
(JSON, ``bad_request``, with ``X-Request-ID``) instead of its plain text; a transfer
coding other than plain ``chunked`` is one of them.

A reply that goes out before its request's body is all in (a stranger's 401, 413, 408)
ends the connection the lingering way: a FIN after the reply, what still comes discarded,
closed when the caller closes or after the head deadline (see ``_linger``); so do the
refusals above.

Replies keep request order: a refusal of a pipelined request (400, 408, 431) waits for
the replies to the requests before it. A head is held to ``MAX_HEAD_BYTES`` (431),
cut while still arriving, refused when it came whole in one read. ``Upgrade`` to
anything but WebSocket is refused (400): the parser would hand the body to the other
protocol, lost or read as a smuggled request. A request needs exactly one Host, and it
must be ``host[:port]`` (400); a WebSocket handshake the WebSocket protocol would refuse
in plain text (not a GET, no valid key, a version other than 13: 426) is refused here
in the one error shape.
Bytes between requests (a lone CRLF) start the head deadline.

A caller that closes its connection (a FIN, or a reset) before its reply has begun is
gone: a call in progress that asked to be told (``CANCEL_ON_GONE`` in its scope: a
gateway call without an Idempotency-Key) is cancelled, so the agent's work stops and the
call is metered ``client_cancelled``, as nginx (499) and Go's server do. A FIN is taken
as the caller gone, not as a half-close awaiting its reply: the two cannot be told apart,
and a client that gave up (its time-out) is by far the more common.

A sized reply's head and body leave in one write (``_OneWriteReplies``).

Served with ``uvicorn --http reach_platform.http_protocol:GuardedHttpToolsProtocol``
(the Procfile, the systemd units and the run command do).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.http_io import CANCEL_ON_GONE, CLIENT_GONE
from reach_core.errors import error_body, kind_of
from reach_core.requestid import new_request_id

DEFAULT_HEADER_TIMEOUT_S = 10.0
# The most a request head (request line and headers) may take: 431 past it. The gateway
# refuses heads over its own 16 KiB once they are in; this bounds what the parser holds
# before that, for every route (the API's included).
MAX_HEAD_BYTES = 64 * 1024
# RFC 9112 3.2 / RFC 3986 3.2.2: uri-host [":" port], the host an IP literal in brackets,
# or a reg-name (possibly empty). Anything else (a space, a path, a second authority)
# is a 400: a name that a proxy in front and this server could read differently.
_HOST = re.compile(rb"(?:\[[0-9A-Za-z:.%\-_~]+\]|[A-Za-z0-9\-._~%!$&'()*+,;=]*)(?::[0-9]{0,5})?")


def _closing_reply(status: bytes, code: str, message: str, extra: bytes = b"") -> bytes:
    """A whole reply in the platform's one error shape, with its request id, after
    which the connection is closed (what came before it cannot be framed). ``extra``:
    more header lines, each ending in CRLF."""
    request_id = new_request_id()
    body = orjson.dumps(error_body(code=code, message=message, request_id=request_id))
    retry = b"true" if kind_of(code).retryable else b"false"
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nx-request-id: %s\r\n"
            b"x-should-retry: %s\r\n%sconnection: close\r\ncontent-length: %d\r\n\r\n"
            % (status, request_id.encode(), retry, extra, len(body))) + body


def _websocket_key_ok(keys: list[bytes]) -> bool:
    """RFC 6455 4.2.1: exactly one Sec-WebSocket-Key, 16 bytes in base64."""
    if len(keys) != 1:
        return False
    try:
        return len(base64.b64decode(keys[0].strip(), validate=True)) == 16
    except (binascii.Error, ValueError):
        return False


def header_timeout_s() -> float:
    from django.conf import settings

    return getattr(settings, "HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    head_timeout_s: float | None = None  # read from the settings on first use

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_head = False  # a request's first byte is in, its head is not yet
        self._head_bytes = 0  # what arrived while the head being read is incomplete
        # No byte of a next request yet (since the last head, or the opening): the next
        # bytes, even a lone CRLF the parser skips, start that request's head clock.
        self._idle = True
        self._heads = 0  # heads parsed on this connection
        # When the head being waited for began (the connection's opening counts: one
        # that sends nothing is timed out too); None while no head is awaited.
        self._head_since: float | None = self.loop.time()
        self._arm_head_timer(self._head_since)
        self._linger_timer: asyncio.TimerHandle | None = None
        # The reply to bytes that came after requests still being answered (400, 408,
        # 431): it follows their replies (replies keep request order), then the close.
        self._last_reply: bytes | None = None
        # A head refused after the parser took it: the reply (the parser says less).
        self._refusal: bytes | None = None
        # The request being served (uvicorn's ``cycle`` is the newest parsed, which may
        # be one still waiting its turn behind it).
        self._serving = None

    def _arm_head_timer(self, since: float) -> None:
        """The timer is lazy: armed when a head begins and none is armed, left running
        when the head completes, and on firing it re-arms itself for the head then
        awaited, if any. A kept-alive connection costs one timer per timeout period,
        not a timer set and cancelled per request."""
        cls = type(self)
        if cls.head_timeout_s is None:
            cls.head_timeout_s = header_timeout_s()
        if self._head_timer is None and cls.head_timeout_s > 0:
            self._head_timer = self.loop.call_at(since + cls.head_timeout_s,
                                                 self._head_timer_fired)

    def _disarm_head_timer(self) -> None:
        self._head_since = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._idle = False
        if self._head_since is None:  # a pipelined request (its bytes came during a reply)
            self._head_since = self.loop.time()
            self._arm_head_timer(self._head_since)

    def on_headers_complete(self) -> None:
        self._head_since = None
        self._in_head = False
        self._idle = True
        self._head_bytes = 0
        self._heads += 1
        upgrades, connection, hosts, host = [], b"", 0, b""
        size = len(self.url)
        for name, value in self.headers:
            size += len(name) + len(value) + 4
            if name == b"host":
                hosts += 1
                host = value
            # Only chunked framing: a coding before it (gzip, chunked) would be ignored
            # by everything downstream, the body read as if it were plain. Raising here
            # ends the parse: the 400 below (send_400_response), the connection closed.
            if name == b"transfer-encoding" and value.strip().lower() != b"chunked":
                raise self._refused("Transfer-Encoding other than 'chunked' is not accepted.")
            if name == b"upgrade":
                upgrades.append(value.strip().lower())
            elif name == b"connection":
                connection += b"," + value.lower()  # every Connection header counts
        if size > MAX_HEAD_BYTES:
            # A head that came whole in one read (up to 256 KiB) was never counted by
            # data_received: the same bound, on what the parser handed over.
            raise self._refused(f"The request head exceeds {MAX_HEAD_BYTES} bytes.",
                                b"431 Request Header Fields Too Large", "headers_too_large")
        version = self.parser.get_http_version()
        if version not in ("1.1", "1.0"):
            # helper-53: "HTTP/2.0" in a request line was served as HTTP/1.1 (2.0 is no
            # version of this syntax: HTTP/2 has its own framing).
            raise self._refused(f"HTTP/{version} is not served here: send HTTP/1.1.",
                                b"505 HTTP Version Not Supported")
        if hosts > 1 or (hosts == 0 and version != "1.0"):
            # RFC 9112 3.2: exactly one Host in HTTP/1.1 (helper-50: two were served, the
            # name a proxy in front and this server read could differ).
            raise self._refused("A request must carry exactly one Host header.")
        if hosts and _HOST.fullmatch(host) is None:
            # helper-52: a Host holding a path, spaces or a second authority was served.
            raise self._refused("The Host header must be a host name or address, with an "
                                "optional port.")
        upgrade = next((u for u in upgrades if u != b"websocket"), None)
        if upgrade is not None and b"upgrade" in connection:
            # The parser hands whatever follows such a head to the new protocol: the
            # body would be lost, or, arriving later, parsed as a request of its own (a
            # smuggled call). Only WebSocket (the tunnel) is spoken here.
            raise self._refused(f"Upgrade to {upgrade.decode('latin-1')[:40]!r} is not "
                                "supported: send the request without it.")
        if b"websocket" in upgrades and b"upgrade" in connection \
                and self.parser.get_method() != b"GET":
            # A handshake is a GET (RFC 6455 4.1): any other was refused by the WebSocket
            # protocol in plain text, not in the platform's error shape (helper-50).
            raise self._refused("A WebSocket upgrade must be a GET request.")
        if b"websocket" in upgrades and b"upgrade" in connection:
            self._check_handshake()
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:
            cycle.transport = _OneWriteReplies(self.transport, cycle, self._linger)

    def _check_handshake(self) -> None:
        """A WebSocket handshake the WebSocket protocol would refuse in plain text is
        refused here in the platform's error shape (RFC 6455 4.2.2: an unsupported
        version gets 426 naming the one spoken)."""
        versions = [v.strip() for n, v in self.headers if n == b"sec-websocket-version"]
        if versions != [b"13"]:
            raise self._refused(
                "Only WebSocket version 13 is spoken (one Sec-WebSocket-Version: 13).",
                b"426 Upgrade Required", extra=b"sec-websocket-version: 13\r\n")
        if not _websocket_key_ok([v for n, v in self.headers if n == b"sec-websocket-key"]):
            raise self._refused("A WebSocket handshake needs one Sec-WebSocket-Key: 16 "
                                "bytes in base64.")

    def data_received(self, data: bytes) -> None:
        if self._linger_timer is not None or self._last_reply is not None:
            # The rest of a request already answered, or bytes after ones that were no
            # request (nothing after them can be framed): discarded.
            return
        if self._idle and (self.cycle is None or self.cycle.response_complete):
            # A request's first bytes start its head clock, even a lone CRLF the parser
            # skips: nothing may keep an idle connection open past the head deadline.
            self._idle = False
            self._head_since = self.loop.time()
            self._arm_head_timer(self._head_since)
        heads = self._heads
        super().data_received(data)
        if self._in_head and heads == self._heads and self._last_reply is None \
                and not self.transport.is_closing():
            # The parser keeps a head until it is whole: bound what it may hold. (Counted
            # from the first read that completes no head: pipelined requests before it in
            # one read are not its bytes.)
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._in_head = False
                self._refuse(_closing_reply(
                    b"431 Request Header Fields Too Large", "headers_too_large",
                    f"The request head exceeds {MAX_HEAD_BYTES} bytes."))

    def _unqueue(self, cycle) -> bool:
        """Take a request still waiting its turn out of the queue (it will not run);
        False if it is not waiting (it is the one being served)."""
        waiting = next((entry for entry in self.pipeline if entry[0] is cycle), None)
        if waiting is None:
            return False
        self.pipeline.remove(waiting)
        return True

    def on_response_complete(self) -> None:
        if self._last_reply is not None and not self.pipeline:
            self.server_state.total_requests += 1
            self._end(self._last_reply)
            return
        super().on_response_complete()

    def _linger(self) -> None:
        """End a connection after its last reply while the caller may still be sending
        (a body nobody will read, bytes after a refused head). Closed at once, the
        caller still sending would get a reset, often before it reads its reply; kept
        open, a caller dripping the rest holds it for ever. So: the reply is followed
        by a FIN, what still comes is discarded, and the connection is closed when the
        caller closes its side or, at the latest, after the head deadline."""
        if self._linger_timer is not None:
            return
        self._disarm_head_timer()
        self.flow.resume_reading()  # paused when the unread body filled uvicorn's buffer
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger_timer = self.loop.call_later(
            type(self).head_timeout_s or DEFAULT_HEADER_TIMEOUT_S, self.transport.close)

    def _start_asgi_task(self, cycle, app) -> None:
        self._serving = cycle
        super()._start_asgi_task(cycle, app)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        cycle = self._serving
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # (uvicorn marks only the newest request)
            cycle.message_event.set()
            call = cycle.scope.get(CANCEL_ON_GONE)
            if call is not None and not cycle.response_started and not call.done():
                cycle.scope[CLIENT_GONE] = True  # its handler ends quietly, metered
                call.cancel()
        super().connection_lost(exc)

    def _head_timer_fired(self) -> None:
        self._head_timer = None
        since = self._head_since
        if since is None:
            return  # no head awaited: the next one arms the timer again
        if self.loop.time() - since < (type(self).head_timeout_s or 0):
            self._arm_head_timer(since)  # a later head than the one this was armed for
            return
        self._head_timed_out()

    def _head_timed_out(self) -> None:
        self._head_since = None
        if self.transport.is_closing():
            return
        self._refuse(_closing_reply(
            b"408 Request Timeout", "request_timeout", "The request head did not "
            f"arrive within {type(self).head_timeout_s or 0:g} s.") if self._in_head else b"")

    def send_400_response(self, msg: str) -> None:
        """Bytes that are no HTTP request (smuggling attempts, bad chunk sizes, control
        characters in headers): uvicorn's plain-text 400, in the one error shape."""
        self._refuse(self._refusal or _closing_reply(b"400 Bad Request", "bad_request", msg))

    def _refused(self, message: str, status: bytes = b"400 Bad Request",
                 code: str = "bad_request", extra: bytes = b"") -> ValueError:
        """Refuse the head being parsed: raised from a parser callback, it ends the parse,
        and uvicorn answers with ``send_400_response`` — this reply."""
        self._refusal = _closing_reply(status, code, message, extra)
        return ValueError(message)

    def _refuse(self, reply: bytes) -> None:
        """Answer what cannot be served and close: at once, unless replies to requests
        before it are still owed — then after them (``on_response_complete``). A request
        whose own body broke is answered at once if it is the one being served, and
        never run if it was still waiting its turn."""
        self._disarm_head_timer()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if not cycle.more_body or self._unqueue(cycle):
                self._last_reply = reply
                return
            # Its own body broke while it was being served: the refusal is its answer.
            # Its app is told the caller is gone (as when the connection drops), or it
            # would wait for the rest and answer across the refusal.
            cycle.disconnected = True
            cycle.message_event.set()
        self._end(reply)

    def _end(self, reply: bytes) -> None:
        """The connection's last reply, then its end: the lingering way when there is a
        reply (the caller may still be sending: a reset could destroy the reply before
        it is read), at once when there is none."""
        if self.transport.is_closing():
            return
        if not reply:
            self.transport.close()
            return
        self.transport.write(reply)
        self._linger()


class _OneWriteReplies:
    """A request cycle's view of its connection: a sized reply's head is held until the
    first bytes of its body and written with them, so a small reply leaves in one write
    (one system call, one segment) instead of two. A chunked reply's head (a stream)
    goes out at once: a caller waiting for an event sees the 200 when it is decided.
    Anything else the cycle does with the transport is the transport's own."""

    __slots__ = ("_cycle", "_head", "_linger", "_replied", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle, linger) -> None:
        self._transport = transport
        self._cycle = cycle
        self._linger = linger
        self._head: bytes | None = None
        self._replied = False

    def write(self, data: bytes) -> None:
        if self._head is not None:
            data, self._head = self._head + data, None
        elif not self._replied and self._cycle.response_started:
            # The reply's head: written by the cycle once its headers are checked.
            self._replied = True
            cycle = self._cycle
            if cycle.more_body and cycle.keep_alive:
                # Its request's body is still coming: the connection ends after this
                # reply (a lingering close), and the head says so, or the caller would
                # send its next request down a connection that is closing.
                cycle.keep_alive = False
                data = data[:-2] + b"connection: close\r\n\r\n"
            # (A HEAD reply has no body to carry its head: it goes now.)
            if cycle.chunked_encoding is False and cycle.expected_content_length > 0 \
                    and cycle.scope["method"] != "HEAD":
                self._head = data
                return
        self._transport.write(data)

    def close(self) -> None:
        cycle = self._cycle
        if cycle.response_complete and cycle.more_body:
            # A whole reply (with Connection: close) to a request whose body is still
            # coming: closed the lingering way, not with a reset.
            self._linger()
            return
        # A reply cut short (the app failed mid-reply) ends as it would have: its head
        # out, then the connection closed.
        if self._head is not None:
            self._transport.write(self._head)
            self._head = None
        self._transport.close()

    def __getattr__(self, name: str):
        return getattr(self._transport, name)
