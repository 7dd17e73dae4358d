"""One request id per call, shared by the control plane, the gateway and the logs."""

from __future__ import annotations

import contextvars
import re
import uuid

HEADER = "X-Request-ID"

# Callers may bring their own id for tracing; anything else is replaced so a
# header cannot smuggle newlines or megabytes into our logs.
_ACCEPTABLE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")

current: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def new_request_id() -> str:
    return uuid.uuid4().hex


def accept_or_new(candidate: str | None) -> str:
    """Return ``candidate`` if it is a sane id, else a fresh one."""
    if candidate and _ACCEPTABLE.match(candidate):
        return candidate
    return new_request_id()
