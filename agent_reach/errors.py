"""The platform's errors as exceptions: one class per catalogue code, one tree.

    ReachError                      every refusal; .status .code .message .request_id
    ├── BadRequest                  400s: InvalidInput, MalformedJSON
    ├── Unauthorized, Forbidden
    ├── NotFound                    404s: NoCapability (nothing offers what was asked)
    ├── Conflict                    409s: IdempotencyInProgress
    ├── IdempotencyKeyReused        422
    ├── PayloadTooLarge
    ├── RateLimited                 429: .retry_after (seconds); QuotaExceeded, TooManyRequests
    ├── Unavailable                 503s: NoHealthyInstance, CircuitOpen, Overloaded,
    │                                     ServiceUnavailable, UpstreamBusy, IdempotencyUnavailable
    ├── DeadlineExceeded, UpstreamTimeout   504
    └── UpstreamError               502s: UpstreamBadResponse, UpstreamRefused

``retryable`` is the platform's own word on whether the same request may succeed later;
``retry_after`` says when, where it knows. A code this SDK does not know yet still raises
the class of its HTTP status.
"""

from __future__ import annotations

from typing import Any


class ReachError(Exception):
    """The platform refused a call. ``error`` is the whole ``{"code", "message", ...}``."""

    def __init__(self, status: int, error: dict, *, retry_after: float | None = None) -> None:
        self.status = status
        self.error = error
        self.code: str = error.get("code", "error")
        self.message: str = error.get("message", "")
        self.request_id: str | None = error.get("request_id")
        self.retryable: bool = bool(error.get("retryable", False))
        self.details: Any = error.get("details")
        self.retry_after = retry_after
        super().__init__(f"{status} {self.code}: {self.message}")


class BadRequest(ReachError):
    pass


class InvalidInput(BadRequest):
    pass


class MalformedJSON(BadRequest):
    pass


class Unauthorized(ReachError):
    pass


class Forbidden(ReachError):
    pass


class NotFound(ReachError):
    pass


class NoCapability(NotFound):
    pass


class NeedsConfirmation(ReachError):
    """300: the intent matched several capabilities nearly equally (``on_ambiguity:
    "ask"``). ``details["candidates"]`` lists them; call again naming one."""

    @property
    def candidates(self) -> list[str]:
        return [c["capability"] for c in (self.details or {}).get("candidates", [])]


class Conflict(ReachError):
    pass


class IdempotencyInProgress(Conflict):
    pass


class IdempotencyKeyReused(ReachError):
    pass


class PayloadTooLarge(ReachError):
    pass


class RateLimited(ReachError):
    pass


class QuotaExceeded(RateLimited):
    pass


class TooManyRequests(RateLimited):
    pass


class Unavailable(ReachError):
    pass


class GatewayUnreachable(Unavailable):
    """No answer from the gateway at all (refused, not found, cut before its reply):
    ``status`` 0, code ``gateway_unreachable``. ``retryable`` only when the call surely
    never arrived (it could not connect); otherwise it may have run."""


class NoHealthyInstance(Unavailable):
    pass


class CircuitOpen(Unavailable):
    pass


class Overloaded(Unavailable):
    pass


class ServiceUnavailable(Unavailable):
    pass


class UpstreamBusy(Unavailable):
    pass


class IdempotencyUnavailable(Unavailable):
    pass


class DeadlineExceeded(ReachError):
    pass


class UpstreamTimeout(ReachError):
    pass


class UpstreamError(ReachError):
    pass


class UpstreamBadResponse(UpstreamError):
    pass


class UpstreamRefused(UpstreamError):
    pass


BY_CODE: dict[str, type[ReachError]] = {
    "bad_request": BadRequest, "invalid_input": InvalidInput, "malformed_json": MalformedJSON,
    "unauthorized": Unauthorized, "forbidden": Forbidden, "not_found": NotFound,
    "no_capability": NoCapability, "needs_confirmation": NeedsConfirmation,
    "conflict": Conflict,
    "idempotency_in_progress": IdempotencyInProgress,
    "idempotency_key_reused": IdempotencyKeyReused, "payload_too_large": PayloadTooLarge,
    "rate_limited": RateLimited, "quota_exceeded": QuotaExceeded,
    "too_many_requests": TooManyRequests, "no_healthy_instance": NoHealthyInstance,
    "circuit_open": CircuitOpen, "overloaded": Overloaded,
    "service_unavailable": ServiceUnavailable, "upstream_busy": UpstreamBusy,
    "idempotency_unavailable": IdempotencyUnavailable,
    "deadline_exceeded": DeadlineExceeded, "upstream_timeout": UpstreamTimeout,
    "upstream_error": UpstreamError, "upstream_bad_response": UpstreamBadResponse,
    "upstream_refused": UpstreamRefused,
}
BY_STATUS: dict[int, type[ReachError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict,
    413: PayloadTooLarge, 422: IdempotencyKeyReused, 429: RateLimited, 502: UpstreamError,
    503: Unavailable, 504: UpstreamTimeout,
}


def error_from(status: int, body: Any, headers: Any = None) -> ReachError:
    """The exception for an error answer: by its code, else by its status."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        error = {"code": "error", "message": str(body)[:300]}
    retry_after = None
    raw = (headers or {}).get("retry-after") if headers is not None else None
    if raw is not None:
        try:
            retry_after = float(raw)
        except ValueError:
            retry_after = None
    cls = BY_CODE.get(error.get("code")) or BY_STATUS.get(status) or ReachError
    return cls(status, error, retry_after=retry_after)
