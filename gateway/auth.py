"""Caller authentication from the route table: no database on the hot path.

The key's prefix finds its entry; the SHA-256 of the presented key is
compared in constant time. Revoked keys are not in the table at all.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from gateway.errors import GatewayError
from routing.table import ApiKeyEntry, RouteTable

KEY_MARK = "rk_"
PREFIX_LENGTH = 10


def authenticate(table: RouteTable, authorization: str | None, *, scope: str = "invoke",
                 now: float | None = None) -> ApiKeyEntry:
    """The caller's key entry, or ``GatewayError('unauthorized'|'forbidden')``."""
    if not authorization:
        raise GatewayError("unauthorized", "Missing 'Authorization: Bearer <api key>'.")
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise GatewayError("unauthorized", "Expected 'Authorization: Bearer <api key>'.")
    prefix, sep, secret = token[len(KEY_MARK):].partition("_")
    if (not token.startswith(KEY_MARK) or not sep or len(prefix) != PREFIX_LENGTH
            or not secret or len(token) > 200):
        raise GatewayError("unauthorized", "API key is malformed.")
    entry = table.api_keys_by_prefix.get(prefix)
    digest = hashlib.sha256(token.encode()).hexdigest()
    if entry is None or not hmac.compare_digest(digest, entry.key_hash):
        raise GatewayError("unauthorized", "API key is not known or has been revoked.")
    if entry.expires_at is not None and entry.expires_at <= (now or time.time()):
        raise GatewayError("unauthorized", "API key has expired.")
    tenant = table.tenants.get(entry.tenant_pk)
    if tenant is None or not tenant.is_active:
        raise GatewayError("unauthorized", "The key's tenant is disabled.")
    if scope not in entry.scopes:
        raise GatewayError("forbidden", f"This key lacks the {scope!r} scope.")
    return entry
