"""The gateway's ASGI application (the data plane).

ASGI contract: serves ``http`` scopes under ``/v1/``; reads ``http.request``
messages itself (no buffering framework) and answers with one JSON body.
Every failure is the structured error of ``gateway.errors``. The app reads
only the route table it is given: it never imports Django or the ORM.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from urllib.parse import parse_qs

import orjson

from gateway.auth import authenticate
from gateway.errors import GatewayError
from reach_platform import requestid
from routing.router import Router, RouteRequest
from routing.table import RouteTable

logger = logging.getLogger(__name__)

_STATUS_BY_ROUTE_ERROR = {"no_capability": "no_capability",
                          "no_healthy_instance": "no_healthy_instance"}


async def send_json(send, status: int, body: dict, request_id: str) -> None:
    payload = orjson.dumps(body)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"x-request-id", request_id.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class GatewayApp:
    def __init__(self, *, table: Callable[[], RouteTable], router: Router) -> None:
        self._table = table
        self.router = router

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        request_id = requestid.accept_or_new(header(scope, b"x-request-id"))
        try:
            status, body = self._dispatch(scope)
        except GatewayError as error:
            body = error.body(request_id)
            if error.explain is not None:
                body["route"] = error.explain
            await send_json(send, error.kind.status, body, request_id)
            return
        except Exception:
            logger.exception("gateway failure")
            error = GatewayError("internal_error", "The gateway failed; it has been logged.")
            await send_json(send, 500, error.body(request_id), request_id)
            return
        await send_json(send, status, {"request_id": request_id, **body}, request_id)

    def _dispatch(self, scope) -> tuple[int, dict]:
        path, method = scope["path"], scope["method"]
        if path.rstrip("/") == "/v1/route":
            if method not in ("GET", "HEAD"):
                raise GatewayError("method_not_allowed", "Use GET for /v1/route.")
            return 200, self.dry_run(scope)
        raise GatewayError("not_found", f"No gateway route for {method} {path}")

    def dry_run(self, scope) -> dict:
        """``GET /v1/route?capability=…|intent=…``: ranked candidates, scores, drop reasons."""
        table = self._table()
        key = authenticate(table, header(scope, b"authorization"))
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        request = route_request(key.tenant_pk, query,
                                namespace=header(scope, b"x-reach-namespace"))
        decision = self.router.route(table, request, pick=False)
        explained = {"table_version": table.version, **decision.explain()}
        if decision.error:
            raise GatewayError(decision.error, _route_message(decision), explain=explained)
        return explained


def route_request(tenant_pk: int, params: dict, *, namespace: str | None) -> RouteRequest:
    capability, intent = params.get("capability"), params.get("intent")
    if bool(capability) == bool(intent):
        raise GatewayError("invalid_input", "Give exactly one of 'capability' or 'intent'.")
    input_chars = params.get("input_chars")
    if input_chars is not None and not input_chars.isdigit():
        raise GatewayError("invalid_input", "'input_chars' must be a non-negative integer.")
    cost = params.get("cost", "best")
    if cost not in ("best", "cheapest"):
        raise GatewayError("invalid_input", "'cost' must be 'best' or 'cheapest'.")
    return RouteRequest(
        tenant_pk=tenant_pk, capability=capability, intent=intent,
        namespace=namespace or params.get("namespace") or "default",
        min_version=params.get("min_version"), src_lang=params.get("src_lang"),
        dest_lang=params.get("dest_lang"), input_format=params.get("format"),
        input_chars=int(input_chars) if input_chars is not None else None,
        cost_preference=cost,
    )


def _route_message(decision) -> str:
    if decision.error == "no_capability":
        if decision.capability:
            return f"No agent offers {decision.capability!r} to this tenant."
        return "No capability matches this request."
    return f"No healthy instance can serve {decision.capability!r} now."
