"""Which of the gateway's environment variables a tenant's credential or tool may name.

A ``value_env`` points into the gateway's own environment. That environment also holds
the platform's secrets (``REACH_SECRET_KEY``, ``REACH_CREDENTIAL_KEYS``, the database's
password in ``DATABASE_URL``) and whatever else the host put there. A tenant who could
name any variable would have the gateway send it, as a header, to the tenant's own
agent. So a name is lent only when it matches one of the operator's patterns
(``REACH_CREDENTIAL_ENV``), and the platform's own settings are never lent, whatever the
patterns say.

``{tenant}`` in a pattern stands for the owning tenant's slug in capitals, ``-`` as
``_``: the default ``DOWNSTREAM_{tenant}__*`` lets tenant ``cloud-sales`` name
``DOWNSTREAM_CLOUD_SALES__TOKEN`` and tenant ``cloud`` not, so no tenant can have
another's downstream token sent to its own agent. A plain pattern lends its names to
every tenant that can register a credential: fit only for names that tenants of one
organisation share.
Only slugs of lower-case letters and digits in parts joined by single hyphens take
part, so no tenant's names can be another's (``a_b`` and ``a-b`` would both be
``A_B``).
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

DEFAULT_PATTERNS = ("DOWNSTREAM_{tenant}__*",)
# The platform's own configuration: never a tenant's, even under a pattern like ``*``.
NEVER = ("REACH_*", "DATABASE_URL", "REDIS_URL", "CELERY_*", "DJANGO_*", "PROMETHEUS_*",
         "OTEL_*")
_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")


_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def names_its_own(tenant: str) -> bool:
    """Whether a tenant's slug may stand for it in a lent name or directory: lower-case
    letters and digits joined by single hyphens, so no tenant's is another's."""
    return bool(_SLUG.fullmatch(tenant))


def refusal(name: str, patterns: tuple[str, ...] | list[str], tenant: str = "") -> str | None:
    """Why ``name`` may not be used as ``value_env`` by a credential of the tenant whose
    slug is ``tenant``; None when it may."""
    if not _NAME.fullmatch(name):
        return "Must be an environment variable name (A-Z, 0-9, _)."
    if any(fnmatchcase(name, pattern) for pattern in NEVER):
        return f"{name} is one of the platform's own settings, never lent to a credential."
    owned = _owned(patterns, tenant)
    if not any(fnmatchcase(name, own) for own in owned):
        # Named as filled in for this tenant: "DOWNSTREAM_{tenant}__*" would leave the
        # author to work out what their slug becomes.
        lent = ", ".join(owned) or "none"
        return (f"{name} is not among the environment variables this platform lends to "
                f"this tenant's credentials ({lent}; its operator sets them with "
                f"REACH_CREDENTIAL_ENV).")
    return None


def _owned(patterns: tuple[str, ...] | list[str], tenant: str) -> list[str]:
    """The patterns with ``{tenant}`` filled in for this tenant (left out where its slug
    cannot stand in a name unambiguously)."""
    name = tenant.upper().replace("-", "_") if names_its_own(tenant) else None
    return [pattern.replace("{tenant}", name) if "{tenant}" in pattern else pattern
            for pattern in patterns if name is not None or "{tenant}" not in pattern]
