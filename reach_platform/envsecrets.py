"""Secrets for settings: from the environment, or generated once into the data dir.

Production sets every secret through the environment. The embedded default
(no environment at all) must still start on a fresh machine without a secret
literal in the repository, so each secret is generated on first start and kept
in a 0600 file under the data directory.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def secret_from_env_or_file(
    *, env_name: str, path: Path, generate: Callable[[], str]
) -> str:
    """Return the secret from ``env_name`` or from ``path``, creating the file if missing."""
    value = os.environ.get(env_name, "").strip()
    if value:
        return value
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = generate()
    # O_EXCL: two processes starting together must not overwrite each other's secret.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(value)
    if not value:
        raise ImproperlyConfigured(f"{env_name} is empty and {path} could not be written")
    return value


def token_urlsafe_50() -> str:
    return secrets.token_urlsafe(50)


def fernet_key() -> str:
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode()
