"""Caller authentication from the route table: no database on the hot path.

The key's prefix finds its entry; the SHA-256 of the presented key is
compared in constant time. Revoked keys are not in the table at all.
"""

from __future__ import annotations

import time

from reach_core import keys  # the key format itself: pure functions, no Django
from reach_core.errors import ReachError
from routing.table import ApiKeyEntry, RouteTable


def authenticate(table: RouteTable, authorization: str | None, *, scope: str = "invoke",
                 now: float | None = None) -> ApiKeyEntry:
    """The caller's key entry, or ``ReachError('unauthorized'|'forbidden')``."""
    if not authorization:
        raise ReachError("unauthorized", "Missing 'Authorization: Bearer <api key>'.")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ReachError("unauthorized", "Expected 'Authorization: Bearer <api key>'.")
    prefix = keys.prefix_of(token)
    if prefix is None:
        raise ReachError("unauthorized", "API key is malformed.")
    entry = table.api_keys_by_prefix.get(prefix)
    if entry is None or not keys.matches(token, entry.key_hash):
        raise ReachError("unauthorized", "API key is not known or has been revoked.")
    if entry.expires_at is not None and entry.expires_at <= (now or time.time()):
        raise ReachError("unauthorized", "API key has expired.")
    tenant = table.tenants.get(entry.tenant_pk)
    if tenant is None or not tenant.is_active:
        raise ReachError("unauthorized", "The key's tenant is disabled.")
    if scope not in entry.scopes:
        raise ReachError("forbidden", f"This key lacks the {scope!r} scope.")
    return entry


def presents_key(authorization: str | None) -> bool:
    """Whether an ``Authorization`` value offers a credential at all: a guess to count
    against the address. "Bearer" with nothing after it (a client whose key variable is
    unset) offers none."""
    _, _, token = (authorization or "").strip().partition(" ")
    return bool(token.strip())
