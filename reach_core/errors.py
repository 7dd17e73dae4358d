"""The one error catalogue of both planes: each code's HTTP status and retry hint.

Every failure a caller sees, from the gateway or the control-plane API, is::

    {"error": {"code", "message", "request_id", "retryable", "details"?}}

and inside an SSE stream the same body travels as an ``error`` event
(``ReachError.sse_event``). ``retryable`` tells a client whether sending the
same request again later may succeed; ``Retry-After`` (when known) says when.

The tree is flat on purpose: a ``ReachError`` is raised with its code, and
what a caller needs beside the message (field ``details``, ``retry_after``
seconds, a dry run's ``explain``) are constructor arguments, so an error is
complete the moment it is raised.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson


@dataclass(frozen=True)
class ErrorKind:
    code: str
    status: int
    retryable: bool


CATALOGUE: dict[str, ErrorKind] = {k.code: k for k in (
    # the caller's request
    ErrorKind("bad_request", 400, False),
    ErrorKind("invalid_input", 400, False),
    ErrorKind("malformed_json", 400, False),
    ErrorKind("unauthorized", 401, False),
    ErrorKind("forbidden", 403, False),
    ErrorKind("not_found", 404, False),
    ErrorKind("method_not_allowed", 405, False),
    ErrorKind("not_acceptable", 406, False),
    ErrorKind("conflict", 409, False),
    ErrorKind("payload_too_large", 413, False),
    ErrorKind("unsupported_media_type", 415, False),
    ErrorKind("headers_too_large", 431, False),
    # The request's body did not arrive in time (a stalled or slow sender).
    ErrorKind("request_timeout", 408, True),
    ErrorKind("too_many_requests", 429, True),
    # routing
    ErrorKind("no_capability", 404, False),
    # An intent that matches two capabilities nearly equally, with "on_ambiguity": "ask":
    # the candidates come back and the caller repeats the call naming one.
    ErrorKind("needs_confirmation", 300, False),
    ErrorKind("no_healthy_instance", 503, True),
    ErrorKind("circuit_open", 503, True),
    # admission
    ErrorKind("rate_limited", 429, True),
    ErrorKind("quota_exceeded", 429, False),
    ErrorKind("idempotency_in_progress", 409, True),
    ErrorKind("idempotency_key_reused", 422, False),
    ErrorKind("idempotency_unavailable", 503, True),
    # the agent
    ErrorKind("deadline_exceeded", 504, False),
    ErrorKind("upstream_timeout", 504, True),
    ErrorKind("upstream_error", 502, True),
    ErrorKind("upstream_bad_response", 502, False),
    ErrorKind("upstream_refused", 502, False),
    ErrorKind("upstream_busy", 503, True),
    # the platform
    ErrorKind("overloaded", 503, True),
    ErrorKind("service_unavailable", 503, True),
    ErrorKind("internal_error", 500, True),
    # asynchronous tasks
    ErrorKind("worker_lost", 503, True),
)}


def kind_of(code: str) -> ErrorKind:
    """The catalogue entry for ``code``; an unknown code is an internal error."""
    return CATALOGUE.get(code) or CATALOGUE["internal_error"]


def error_body(*, code: str, message: str, request_id: str, details=None) -> dict:
    error = {"code": code, "message": message, "request_id": request_id,
             "retryable": kind_of(code).retryable}
    if details:
        error["details"] = details
    return {"error": error}


class ReachError(Exception):
    """A failure with a catalogue code; the boundary (the gateway's ASGI app, the API's
    exception handler) turns it into the structured reply.

    ``details`` maps field paths to messages (invalid input); ``retry_after`` is whole
    seconds for the ``Retry-After`` header (every retryable 429 and every 503 carries
    one: 1 s unless the raiser knows better; a spent monthly budget does not come back
    in a second, so ``quota_exceeded`` carries none); ``explain`` is a dry run's explanation,
    returned beside the error so callers see why. Raises ``KeyError`` for a code that
    is not in the catalogue: codes are part of the contract.
    """

    def __init__(self, code: str, message: str, *, details: dict | None = None,
                 retry_after: int | None = None, explain: dict | None = None) -> None:
        super().__init__(message)
        self.kind = CATALOGUE[code]
        self.message = message
        self.details = details
        if retry_after is None and self.kind.status in (429, 503) and self.kind.retryable:
            retry_after = 1
        self.retry_after = retry_after
        self.explain = explain

    @property
    def code(self) -> str:
        return self.kind.code

    def body(self, request_id: str) -> dict:
        body = error_body(code=self.kind.code, message=self.message, request_id=request_id,
                          details=self.details)
        if self.explain is not None:
            body["route"] = self.explain
        return body

    def sse_event(self, request_id: str) -> bytes:
        """The error as the SSE event that ends a broken stream (never a fake ``[DONE]``)."""
        return b"event: error\ndata: " + orjson.dumps(self.body(request_id)) + b"\n\n"
