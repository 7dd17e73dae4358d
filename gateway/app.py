"""The gateway's ASGI application.

ASGI contract: serves ``http`` scopes under ``/v1/``; reads ``http.request``
messages itself (no buffering framework), answers with one JSON body or an
SSE stream. The routes are filled in by the gateway issue; until then every
path is a structured ``not_found`` so callers never see an HTML page.
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError
from reach_platform import requestid


async def _send_json(send, status: int, body: dict, request_id: str) -> None:
    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (requestid.HEADER.lower().encode(), request_id.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def application(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    request_id = requestid.accept_or_new(_header(scope, b"x-request-id"))
    error = GatewayError("not_found", f"No gateway route for {scope['method']} {scope['path']}")
    await _send_json(send, error.kind.status, error.body(request_id), request_id)
