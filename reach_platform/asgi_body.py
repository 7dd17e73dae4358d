"""Request bodies sent without a length, made whole before Django reads them.

Django takes a request's body to be ``Content-Length`` bytes long, and a body sent with
``Transfer-Encoding: chunked`` has no such header: Django read it as empty (a break test:
a heartbeat reporting cpu 0.99 stored as 0, a registration "missing" its capabilities,
a 50 MB body accepted past the 2 MB limit). This layer reads such a body (refusing it
with 413 past ``max_bytes``, as a declared length over the limit is refused) and hands it
on with the length it turned out to have.
"""

from __future__ import annotations

import orjson

from reach_core import requestid
from reach_core.errors import ReachError


def chunked_bodies(app, *, max_bytes: int):
    async def application(scope, receive, send) -> None:
        if scope["type"] != "http" or not _chunked(scope):
            await app(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > max_bytes:
                await _too_large(scope, send, max_bytes)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        headers = [(k, v) for k, v in scope.get("headers", [])
                   if k.lower() not in (b"transfer-encoding", b"content-length")]
        whole = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await app(whole, replay, send)

    return application


def _chunked(scope) -> bool:
    if any(key.lower() == b"content-length" for key, _ in scope.get("headers", [])):
        return False
    return any(key.lower() == b"transfer-encoding" and b"chunked" in value.lower()
               for key, value in scope.get("headers", []))


async def _too_large(scope, send, max_bytes: int) -> None:
    request_id = requestid.accept_or_new(next(
        (v.decode("latin-1") for k, v in scope.get("headers", [])
         if k.lower() == b"x-request-id"), None))
    error = ReachError("payload_too_large", f"Request body exceeds {max_bytes} bytes.")
    body = orjson.dumps(error.body(request_id))
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode())]})
    await send({"type": "http.response.body", "body": body})
