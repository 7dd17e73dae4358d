"""One request id per call, shared by the control plane, the gateway and the logs."""

from __future__ import annotations

import contextvars
import itertools
import os
import re

HEADER = "X-Request-ID"

# Callers may bring their own id for tracing; anything else is replaced so a
# header cannot smuggle newlines or megabytes into our logs.
# It must start with a letter or digit: "-" is what logs write for "no request".
_ACCEPTABLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")

current: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


_PROCESS = os.urandom(10).hex()
_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """Unique without a syscall per call: 80 random bits per process, then a counter.

    32 hex characters, the shape of a uuid4 hex id. Not a secret and not meant to
    be unguessable: it names a request in logs and headers."""
    return f"{_PROCESS}{next(_COUNTER) & 0xFFFFFFFFFFFF:012x}"


def accept_or_new(candidate: str | None) -> str:
    """Return ``candidate`` if it is a sane id, else a fresh one."""
    if candidate and _ACCEPTABLE.match(candidate):
        return candidate
    return new_request_id()
