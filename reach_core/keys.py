"""API key format, hashing and parsing: pure functions, no database.

A tenant API key reads ``rk_<prefix>_<secret>``; an agent token
``rat_<prefix>_<secret>``. The prefix (10 url-safe characters) is stored in
clear to find the row; the whole key is stored only as SHA-256. A
key carries 256 bits of randomness, so a fast unsalted hash is safe here: the
slow-hash defence is for low-entropy passwords, not for random tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string

KEY_MARK = "rk_"
PREFIX_LENGTH = 10
_ALPHABET = string.ascii_letters + string.digits


def generate(mark: str = KEY_MARK) -> tuple[str, str, str]:
    """Return ``(plaintext, prefix, key_hash)`` for a new key starting with ``mark``."""
    prefix = "".join(secrets.choice(_ALPHABET) for _ in range(PREFIX_LENGTH))
    plaintext = f"{mark}{prefix}_{secrets.token_urlsafe(32)}"
    return plaintext, prefix, hash_key(plaintext)


def hash_key(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def prefix_of(plaintext: str, mark: str = KEY_MARK) -> str | None:
    """Return the lookup prefix of a presented key, or None if it is not shaped like one."""
    if not plaintext.startswith(mark):
        return None
    prefix, sep, secret = plaintext[len(mark):].partition("_")
    if not sep or len(prefix) != PREFIX_LENGTH or not secret or len(plaintext) > 200:
        return None
    return prefix


def matches(plaintext: str, key_hash: str) -> bool:
    return hmac.compare_digest(hash_key(plaintext), key_hash)
