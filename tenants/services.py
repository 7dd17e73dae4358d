"""Writes for tenants, keys, grants, credentials and quotas."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from reach_core import keys
from reach_core.errors import ReachError
from tenants import crypto
from tenants.choices import ApiKeyScope
from tenants.models import ApiKey, Credential, Grant, Tenant


@dataclass(frozen=True)
class IssuedKey:
    """A new key and its plaintext. The plaintext exists only here: show it once, then drop it."""

    api_key: ApiKey
    plaintext: str


@transaction.atomic
def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    scopes: list[str] | None = None,
    expires_at: datetime | None = None,
) -> IssuedKey:
    api_key = ApiKey(
        tenant=tenant,
        name=name,
        scopes=list(scopes if scopes is not None else [ApiKeyScope.INVOKE]),
        expires_at=expires_at,
    )
    return IssuedKey(api_key=api_key, plaintext=api_key_issue(api_key=api_key))


def api_key_issue(*, api_key: ApiKey) -> str:
    """Give the unsaved ``api_key`` a fresh secret, save it, and return the plaintext."""
    plaintext, api_key.prefix, api_key.key_hash = keys.generate()
    api_key.full_clean()
    api_key.save()
    return plaintext


def api_key_revoke(*, api_key: ApiKey, now: datetime | None = None) -> ApiKey:
    """Revoke ``api_key``; revoking twice keeps the first revocation time."""
    if api_key.revoked_at is None:
        api_key.revoked_at = now or timezone.now()
        api_key.save(update_fields=["revoked_at"])
    return api_key


def grant_given_at(*, grantee_consents: bool) -> datetime | None:
    """When a new grant is in force: at once when whoever gives it manages the grantee
    too (an operator), else never until the grantee accepts it (an offer)."""
    return timezone.now() if grantee_consents else None


def grant_accept(*, grant: Grant, capabilities: list[str],
                 now: datetime | None = None) -> Grant:
    """Put a grant in force for ``capabilities`` (the grantee's consent, naming what it
    accepts), whatever it covered before. 409 ``conflict`` when one is not offered now
    (the offer changed since the grantee read it)."""
    offered = grant.offered_capabilities()
    if not set(capabilities) <= set(offered):
        raise ReachError("conflict", f"The grant does not offer "
                         f"{', '.join(sorted(set(capabilities) - set(offered)))[:500]}; it "
                         f"offers now: {', '.join(offered)[:1000] or 'nothing'}.")
    grant.accepted_at = now or timezone.now()
    grant.accepted_capabilities = sorted(set(capabilities))
    grant.save(update_fields=["accepted_at", "accepted_capabilities"])
    return grant


def api_key_authenticate(*, plaintext: str, now: datetime | None = None) -> ApiKey | str:
    """Return the usable key for ``plaintext``, or the reason (a message) it is refused."""
    now = now or timezone.now()
    prefix = keys.prefix_of(plaintext)
    if prefix is None:
        return "API key is malformed."
    api_key = ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()
    if api_key is None or not keys.matches(plaintext, api_key.key_hash):
        return "API key is not known."
    if api_key.is_revoked:
        return "API key has been revoked."
    if api_key.is_expired(now):
        return "API key has expired."
    if not api_key.tenant.is_active:
        return "The key's tenant is disabled."
    _touch_last_used(api_key, now)
    return api_key


def _touch_last_used(api_key: ApiKey, now: datetime) -> None:
    resolution = settings.API_KEY_LAST_USED_RESOLUTION_SECONDS
    if api_key.last_used_at and (now - api_key.last_used_at).total_seconds() < resolution:
        return
    # A conditional update: concurrent requests race harmlessly, one write wins.
    ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
    api_key.last_used_at = now


def credential_set_secret(*, credential: Credential, secret: str | None) -> Credential:
    """Encrypt ``secret`` into ``credential`` (not saved). ``None`` keeps the stored one.

    A stored secret and ``value_env`` exclude each other: setting one clears the other.
    """
    if secret:
        credential.secret_ciphertext = crypto.encrypt(secret)
        credential.value_env = ""
    elif credential.value_env:
        credential.secret_ciphertext = None
    return credential


@transaction.atomic
def credential_save(*, credential: Credential, secret: str | None = None) -> Credential:
    credential_set_secret(credential=credential, secret=secret)
    credential.full_clean()
    credential.save()
    return credential
