"""The gateway's error tree: one table maps each code to its HTTP status and retry hint.

Every failure a caller sees is ``{"error": {"code", "message", "request_id",
"retryable"}}``; in an SSE stream the same body is sent as an ``error`` event.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorKind:
    code: str
    status: int
    retryable: bool


_KINDS = [
    ErrorKind("unauthorized", 401, False),
    ErrorKind("forbidden", 403, False),
    ErrorKind("not_found", 404, False),
    ErrorKind("method_not_allowed", 405, False),
    ErrorKind("invalid_input", 400, False),
    ErrorKind("malformed_json", 400, False),
    ErrorKind("payload_too_large", 413, False),
    ErrorKind("headers_too_large", 431, False),
    ErrorKind("no_capability", 404, False),
    ErrorKind("no_healthy_instance", 503, True),
    ErrorKind("rate_limited", 429, True),
    ErrorKind("quota_exceeded", 429, False),
    ErrorKind("deadline_exceeded", 504, False),
    ErrorKind("upstream_timeout", 504, True),
    ErrorKind("upstream_error", 502, True),
    ErrorKind("upstream_bad_response", 502, False),
    ErrorKind("circuit_open", 503, True),
    ErrorKind("idempotency_in_progress", 409, True),
    ErrorKind("idempotency_key_reused", 422, False),
    ErrorKind("internal_error", 500, True),
]
KINDS: dict[str, ErrorKind] = {k.code: k for k in _KINDS}


class GatewayError(Exception):
    """Raised anywhere on the hot path; the ASGI app turns it into the structured reply."""

    def __init__(self, code: str, message: str, *, explain: dict | None = None) -> None:
        super().__init__(message)
        self.kind = KINDS[code]
        self.message = message
        # A dry run's explanation, returned beside the error so callers see why.
        self.explain = explain
        # Field paths -> messages, for invalid input.
        self.details: dict | None = None

    def body(self, request_id: str) -> dict:
        error = {
            "code": self.kind.code,
            "message": self.message,
            "request_id": request_id,
            "retryable": self.kind.retryable,
        }
        if self.details:
            error["details"] = self.details
        return {"error": error}
