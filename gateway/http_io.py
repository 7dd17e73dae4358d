"""The gateway's ASGI plumbing: request headers, bodies and JSON replies.

The gateway reads ``http.request`` messages itself (no framework buffering), so a
body over the limit is refused as it arrives and a disconnect is noticed.
"""

from __future__ import annotations

import asyncio

import orjson

from reach_core.errors import ReachError


def header(scope, name: bytes) -> str | None:
    """A request header by lower-case name (the last one wins), parsed once per request."""
    headers = scope.get("reach.headers")
    if headers is None:
        headers = scope["reach.headers"] = {
            key.lower(): value for key, value in scope.get("headers", [])}
    value = headers.get(name)
    return value.decode("latin-1") if value is not None else None


async def read_body(scope, receive, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit``. A client that
    goes away while sending cancels the request (``CancelledError``)."""
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


def parse_json(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ReachError("malformed_json", f"Request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ReachError("invalid_input", "Request body must be a JSON object.")
    return body


async def send_bytes(send, status: int, payload: bytes, request_id: str,
                     extra: list | None = None,
                     content_type: bytes = b"application/json") -> None:
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", content_type),
                    (b"content-length", str(len(payload)).encode()),
                    (b"x-request-id", request_id.encode()), *(extra or [])],
    })
    await send({"type": "http.response.body", "body": payload})


async def send_json(send, status: int, body: dict, request_id: str,
                    extra: list | None = None) -> None:
    await send_bytes(send, status, orjson.dumps(body), request_id, extra)


async def send_error(send, error: ReachError, request_id: str) -> None:
    extra = [(b"retry-after", str(error.retry_after).encode())] if error.retry_after else None
    await send_json(send, error.kind.status, error.body(request_id), request_id, extra)


def sse_headers(request_id: str) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
            (b"x-request-id", request_id.encode())]
