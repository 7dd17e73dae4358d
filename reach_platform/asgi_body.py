"""Control-plane request bodies, read whole, within a size and a time, before Django.

Django's ASGI handler reads a request's whole body before any view or middleware runs:
into memory and then a temporary file, however long it is, for however long it takes.
So the limits Django applies later (``DATA_UPLOAD_MAX_MEMORY_SIZE``) come after the
bytes are in, and a caller dripping a body holds a request for ever. This layer reads
the body first, and answers in the platform's one error shape:

- a declared ``Content-Length`` over ``max_bytes``: 413 ``payload_too_large`` at once,
  nothing read;
- a body still coming after ``timeout_s``: 408 ``request_timeout``;
- a body sent without a length (``Transfer-Encoding: chunked``): read as sent and handed
  on with the length it turned out to have (Django takes a request's body to be
  ``Content-Length`` bytes long, and read such a body as empty — a heartbeat reporting
  cpu 0.99 stored as 0), 413 past ``max_bytes``.

The connection after an early reply is the server protocol's business
(``reach_platform.http_protocol``: a lingering close).
"""

from __future__ import annotations

import asyncio

from gateway.http_io import CLIENT_GONE, header, read_body, send_error
from reach_core import requestid
from reach_core.errors import ReachError


def bounded_bodies(app, *, max_bytes: int, timeout_s: float):
    async def application(scope, receive, send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        declared, chunked = _framing(scope)
        if (declared is None and not chunked) or declared == 0:
            await app(scope, receive, send)  # nothing to read
            return
        # The gateway's reader: the same limits, messages and disconnect handling.
        try:
            body = await read_body(scope, receive, max_bytes, timeout_s)
        except ReachError as error:
            await send_error(send, error,
                             requestid.accept_or_new(header(scope, b"x-request-id")))
            return
        except asyncio.CancelledError:
            if scope.get(CLIENT_GONE):
                return  # the caller went away mid-body: nobody to answer
            raise
        if chunked:
            headers = [(k, v) for k, v in scope.get("headers", [])
                       if k.lower() not in (b"transfer-encoding", b"content-length")]
            scope = {**scope, "headers": [*headers,
                                          (b"content-length", str(len(body)).encode())]}
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(scope, replay, send)

    return application


def _framing(scope) -> tuple[int | None, bool]:
    """The declared length (None when there is none) and whether the body is chunked.
    (The server refused a request with both, or with a malformed length.)"""
    declared, chunked = None, False
    for key, value in scope.get("headers", []):
        key = key.lower()
        if key == b"content-length":
            declared = int(value)
        elif key == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    return declared, chunked
