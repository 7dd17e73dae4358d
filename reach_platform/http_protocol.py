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

Served with ``uvicorn --http reach_platform.http_protocol:GuardedHttpToolsProtocol``
(the Procfile, the systemd units and the run command do).
"""

from __future__ import annotations

import asyncio

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from reach_core.errors import error_body
from reach_core.requestid import new_request_id

DEFAULT_HEADER_TIMEOUT_S = 10.0


def _closing_reply(status: bytes, code: str, message: str) -> bytes:
    """A whole reply in the platform's one error shape, with its request id, after
    which the connection is closed (what came before it cannot be framed)."""
    request_id = new_request_id()
    body = orjson.dumps(error_body(code=code, message=message, request_id=request_id))
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nx-request-id: %s\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n"
            % (status, request_id.encode(), len(body))) + body


def header_timeout_s() -> float:
    from django.conf import settings

    return getattr(settings, "HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    head_timeout_s: float | None = None  # read from the settings on first use

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_head = False  # a request's first byte is in, its head is not yet
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        cls = type(self)
        if cls.head_timeout_s is None:
            cls.head_timeout_s = header_timeout_s()
        if self._head_timer is None and cls.head_timeout_s > 0:
            self._head_timer = self.loop.call_later(cls.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._arm_head_timer()  # a kept-alive connection's next request

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        self._in_head = False
        for name, value in self.headers:
            # Only chunked framing: a coding before it (gzip, chunked) would be ignored
            # by everything downstream, the body read as if it were plain. Raising here
            # ends the parse: the 400 below (send_400_response), the connection closed.
            if name == b"transfer-encoding" and value.strip().lower() != b"chunked":
                raise ValueError("Transfer-Encoding other than 'chunked' is not accepted.")
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A reply is still going out (the slow head is a pipelined next request):
            # nothing may be written across it; the connection ends after it.
            self.cycle.keep_alive = False
            return
        if self._in_head:
            self.transport.write(_closing_reply(
                b"408 Request Timeout", "request_timeout", "The request head did not "
                f"arrive within {type(self).head_timeout_s or 0:g} s."))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """Bytes that are no HTTP request (smuggling attempts, bad chunk sizes, control
        characters in headers): uvicorn's plain-text 400, in the one error shape."""
        self._disarm_head_timer()
        self.transport.write(_closing_reply(b"400 Bad Request", "bad_request", msg))
        self.transport.close()
