"""Encryption of downstream credentials at rest.

Fernet (AES-128-CBC + HMAC-SHA256) with keys from ``settings.CREDENTIAL_KEYS``;
the first key encrypts, every key decrypts (``MultiFernet``), so rotating a key
means prepending the new one and re-encrypting at leisure.
"""

from __future__ import annotations

from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


class CredentialDecryptError(Exception):
    """The ciphertext was made with a key that is no longer configured, or was altered."""


@cache
def _fernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise ImproperlyConfigured("REACH_CREDENTIAL_KEYS holds no key")
    try:
        return MultiFernet([Fernet(k.encode()) for k in keys])
    except ValueError as exc:
        raise ImproperlyConfigured(
            "REACH_CREDENTIAL_KEYS must be url-safe base64 Fernet keys, comma separated"
        ) from exc


def encrypt(plaintext: str) -> bytes:
    return _fernet(tuple(settings.CREDENTIAL_KEYS)).encrypt(plaintext.encode())


def decrypt(ciphertext: bytes) -> str:
    try:
        return _fernet(tuple(settings.CREDENTIAL_KEYS)).decrypt(bytes(ciphertext)).decode()
    except InvalidToken as exc:
        raise CredentialDecryptError(
            "credential cannot be decrypted with the configured keys"
        ) from exc
