"""The closed sets of names both planes use: one definition, with the admin's wording.

Plain ``StrEnum``s, so the gateway and the router compare and store them
without Django; ``django_choices`` (in the apps' ``choices.py``) turns each
into the ``TextChoices`` a model field needs, so a value exists in one place.
Each member carries its label (``Protocol.HTTP.label``).
"""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    """A ``StrEnum`` whose members also carry a human label: ``NAME = "value", "Label"``."""

    label: str

    def __new__(cls, value: str, label: str = ""):
        member = str.__new__(cls, value)
        member._value_ = value
        member.label = label or value
        return member


class Protocol(Kind):
    OPENAI = "openai", "OpenAI-compatible chat"
    HTTP = "http", "Plain HTTP/JSON"
    A2A = "a2a", "A2A JSON-RPC"


class CapabilityKind(Kind):
    SYNC = "sync", "Synchronous"
    STREAM = "stream", "Streaming"
    ASYNC = "async", "Asynchronous"


class ReachMode(Kind):
    DIRECT = "direct", "Direct"
    TUNNEL = "tunnel", "Reverse tunnel"


class InstanceState(Kind):
    HEALTHY = "healthy", "Healthy"
    UNKNOWN = "unknown", "Unknown (missed heartbeats)"
    OFFLINE = "offline", "Offline"
    DRAINING = "draining", "Draining"


class HealthTier(Kind):
    HEALTHY = "healthy", "Healthy (full weight)"
    OVERLOADED = "overloaded", "Overloaded (half weight)"
    SUB_HEALTHY = "sub_healthy", "Sub-healthy (probe traffic only)"


class Visibility(Kind):
    PRIVATE = "private", "Private (owner and granted tenants)"
    PUBLIC = "public", "Public (every tenant may discover and reach it)"


class Outcome(Kind):
    """How a call ended, as metered and counted: success, the client going away, or the
    catalogue code of the error it ended with (``reach_core.errors``)."""

    SUCCESS = "success", "Success"
    CLIENT_CANCELLED = "client_cancelled", "Client cancelled"
    INVALID_INPUT = "invalid_input", "Invalid input"
    MALFORMED_JSON = "malformed_json", "Malformed JSON"
    BAD_REQUEST = "bad_request", "Bad request"
    PAYLOAD_TOO_LARGE = "payload_too_large", "Payload too large"
    HEADERS_TOO_LARGE = "headers_too_large", "Headers too large"
    REQUEST_TIMEOUT = "request_timeout", "Request timeout"
    TOO_MANY_REQUESTS = "too_many_requests", "Too many requests"
    UNAUTHORIZED = "unauthorized", "Unauthorized"
    FORBIDDEN = "forbidden", "Forbidden"
    NOT_FOUND = "not_found", "Not found"
    METHOD_NOT_ALLOWED = "method_not_allowed", "Method not allowed"
    NOT_ACCEPTABLE = "not_acceptable", "Not acceptable"
    CONFLICT = "conflict", "Conflict"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type", "Unsupported media type"
    NO_CAPABILITY = "no_capability", "No capability"
    NEEDS_CONFIRMATION = "needs_confirmation", "Needs confirmation"
    NO_HEALTHY_INSTANCE = "no_healthy_instance", "No healthy instance"
    CIRCUIT_OPEN = "circuit_open", "Circuit open"
    RATE_LIMITED = "rate_limited", "Rate limited"
    QUOTA_EXCEEDED = "quota_exceeded", "Quota exceeded"
    IDEMPOTENCY_IN_PROGRESS = "idempotency_in_progress", "Idempotency key in progress"
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused", "Idempotency key reused"
    IDEMPOTENCY_UNAVAILABLE = "idempotency_unavailable", "Idempotency unavailable"
    DEADLINE_EXCEEDED = "deadline_exceeded", "Deadline exceeded"
    UPSTREAM_TIMEOUT = "upstream_timeout", "Upstream timeout"
    UPSTREAM_ERROR = "upstream_error", "Upstream error"
    UPSTREAM_BAD_RESPONSE = "upstream_bad_response", "Upstream bad response"
    UPSTREAM_REFUSED = "upstream_refused", "Upstream refused"
    UPSTREAM_BUSY = "upstream_busy", "Upstream busy"
    OVERLOADED = "overloaded", "Overloaded"
    SERVICE_UNAVAILABLE = "service_unavailable", "Service unavailable"
    INTERNAL_ERROR = "internal_error", "Internal error"
    WORKER_LOST = "worker_lost", "Worker lost"


class Reason(Kind):
    """Why a call did or did not reach an agent: the split of the reach success rate, the
    platform's north star. Every ``Outcome`` has exactly one (``reason_of``)."""

    SUCCESS = "success", "Reached"
    ROUTE_MISS = "route_miss", "Route miss"
    NO_INSTANCE = "no_instance", "No healthy instance"
    CIRCUIT_OPEN = "circuit_open", "Circuit open"
    TIMEOUT = "timeout", "Forward timeout"
    AGENT_ERROR = "agent_error", "Agent error"
    LIMITED = "limited", "Rate limit or budget"
    SHED = "shed", "Load shed"
    PLATFORM = "platform", "Platform error"
    CALLER = "caller", "Caller error"
    CANCELLED = "cancelled", "Client cancelled"


# Outcomes by reason; an outcome not listed is the caller's error.
_REASONS = {
    Reason.SUCCESS: (Outcome.SUCCESS,),
    Reason.ROUTE_MISS: (Outcome.NO_CAPABILITY, Outcome.NEEDS_CONFIRMATION),
    Reason.NO_INSTANCE: (Outcome.NO_HEALTHY_INSTANCE,),
    Reason.CIRCUIT_OPEN: (Outcome.CIRCUIT_OPEN,),
    Reason.TIMEOUT: (Outcome.UPSTREAM_TIMEOUT, Outcome.DEADLINE_EXCEEDED),
    Reason.AGENT_ERROR: (Outcome.UPSTREAM_ERROR, Outcome.UPSTREAM_BAD_RESPONSE,
                         Outcome.UPSTREAM_REFUSED, Outcome.UPSTREAM_BUSY),
    Reason.LIMITED: (Outcome.RATE_LIMITED, Outcome.QUOTA_EXCEEDED, Outcome.TOO_MANY_REQUESTS),
    Reason.SHED: (Outcome.OVERLOADED,),
    Reason.PLATFORM: (Outcome.SERVICE_UNAVAILABLE, Outcome.INTERNAL_ERROR,
                      Outcome.IDEMPOTENCY_UNAVAILABLE, Outcome.WORKER_LOST),
    Reason.CANCELLED: (Outcome.CLIENT_CANCELLED,),
}
REASON_OF_OUTCOME: dict[str, Reason] = {
    **{str(outcome): Reason.CALLER for outcome in Outcome},
    **{str(outcome): reason for reason, outcomes in _REASONS.items() for outcome in outcomes},
}
# Left out of the reach success rate: the caller asked for something wrong, or left.
NOT_THE_PLATFORMS = frozenset({Reason.CALLER, Reason.CANCELLED})


def reason_of(outcome: str) -> Reason:
    return REASON_OF_OUTCOME.get(str(outcome), Reason.PLATFORM)


class FeedbackSource(Kind):
    """Where a route feedback (an intent and the capability it should have reached) came
    from: the caller said so (``POST /v1/route/feedback``), or the gateway inferred it
    from an explicit capability call soon after a dry run or a failed intent call."""

    EXPLICIT = "explicit", "Reported by the caller"
    INFERRED = "inferred", "Inferred from the next call"


class TaskState(Kind):
    """An asynchronous task's state: A2A's task states, with their wire names."""

    SUBMITTED = "submitted", "Submitted"
    WORKING = "working", "Working"
    INPUT_REQUIRED = "input-required", "Input required"
    AUTH_REQUIRED = "auth-required", "Auth required"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELED = "canceled", "Canceled"
    REJECTED = "rejected", "Rejected"


# A task in one of these never changes again.
FINAL_TASK_STATES = frozenset({TaskState.COMPLETED, TaskState.FAILED, TaskState.CANCELED,
                               TaskState.REJECTED})
# The agent waits for the caller: the task goes on when the caller sends a message.
INTERRUPTED_TASK_STATES = frozenset({TaskState.INPUT_REQUIRED, TaskState.AUTH_REQUIRED})
