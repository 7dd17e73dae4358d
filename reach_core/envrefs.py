"""Which of the gateway's environment variables a tenant's credential or tool may name.

A ``value_env`` points into the gateway's own environment. That environment also holds
the platform's secrets (``REACH_SECRET_KEY``, ``REACH_CREDENTIAL_KEYS``, the database's
password in ``DATABASE_URL``) and whatever else the host put there. A tenant who could
name any variable would have the gateway send it, as a header, to the tenant's own
agent. So a name is lent only when it matches one of the operator's patterns
(``REACH_CREDENTIAL_ENV``, default ``DOWNSTREAM_*``), and the platform's own settings
are never lent, whatever the patterns say.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

DEFAULT_PATTERNS = ("DOWNSTREAM_*",)
# The platform's own configuration: never a tenant's, even under a pattern like ``*``.
NEVER = ("REACH_*", "DATABASE_URL", "REDIS_URL", "CELERY_*", "DJANGO_*", "PROMETHEUS_*")
_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")


def refusal(name: str, patterns: tuple[str, ...] | list[str]) -> str | None:
    """Why ``name`` may not be used as a tenant's ``value_env``; None when it may."""
    if not _NAME.fullmatch(name):
        return "Must be an environment variable name (A-Z, 0-9, _)."
    if any(fnmatchcase(name, pattern) for pattern in NEVER):
        return f"{name} is one of the platform's own settings, never lent to a credential."
    if not any(fnmatchcase(name, pattern) for pattern in patterns):
        lent = ", ".join(patterns) or "none"
        return (f"{name} is not among the environment variables this platform lends to "
                f"credentials ({lent}; its operator sets them with REACH_CREDENTIAL_ENV).")
    return None
