"""Downstream credentials: decrypted only when a call uses them, kept in memory only.

The route table carries each tenant x agent credential encrypted (or as an
environment variable name); snapshots on disk therefore never hold a secret.
"""

from __future__ import annotations

import base64
import os
import ssl
import stat
import tempfile
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from reach_core import filerefs
from reach_core.envrefs import DEFAULT_PATTERNS, refusal
from reach_core.errors import ReachError
from routing.table import RouteTable


def _regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True  # missing: the load fails, and says so (without the path)


class Credentials:
    def __init__(self, keys: tuple[str, ...],
                 env_patterns: tuple[str, ...] = DEFAULT_PATTERNS,
                 files: str = filerefs.DEFAULT_DIRECTORY) -> None:
        """``env_patterns``: the environment variables a credential may name
        (``reach_core.envrefs``); ``files``: the directory its certificate files must lie
        in (``reach_core.filerefs``). Both checked here too, whatever the control plane
        let in."""
        self._files = files
        self._fernet = MultiFernet([Fernet(k.encode()) for k in keys]) if keys else None
        self._secret = lru_cache(maxsize=4096)(self._decrypt)
        self._ssl = lru_cache(maxsize=256)(self._ssl_context)
        self._env_refusal = lru_cache(maxsize=1024)(
            lambda name, owner: refusal(name, env_patterns, owner))

    def _lent(self, name: str, owner: str) -> str:
        """``name`` if a credential of the tenant ``owner`` (its slug) may read it from
        this gateway's environment."""
        why = self._env_refusal(name, owner)
        if why is not None:
            raise ReachError("service_unavailable", f"A downstream credential cannot be "
                             f"used here: {why}")
        return name

    def _decrypt(self, ciphertext: str) -> str:
        if self._fernet is None:
            raise ReachError("internal_error", "Credential keys are not configured.")
        try:
            return self._fernet.decrypt(base64.b64decode(ciphertext)).decode()
        except (InvalidToken, ValueError) as exc:
            raise ReachError(
                "internal_error", "A downstream credential cannot be decrypted."
            ) from exc

    def _file(self, path: str, owner: str) -> str:
        """``path`` resolved, if it lies in the certificate directory of the tenant
        ``owner`` (its slug)."""
        real = filerefs.resolved(path, self._files, owner)
        if real is not None and not _regular(real):
            # A FIFO or a device would block the load (and every call waiting on it).
            raise ReachError("service_unavailable", "A client certificate file of this "
                             "call is not a regular file in this gateway.")
        if real is None:
            # Which path stays out of the answer: it is about this host.
            raise ReachError("service_unavailable", "A client certificate file of this "
                             "call is outside this gateway's certificate directory.")
        return real

    def _ssl_context(self, cert: str, key: str, key_env: str, ca_file: str,
                     owner: str) -> ssl.SSLContext:
        """A client context for mTLS. The key is a file, or an environment variable that
        holds a path or the PEM text itself (written to a private temporary file only for
        as long as ``load_cert_chain`` reads it: ssl loads keys from files only)."""
        cert = self._file(cert, owner)
        context = ssl.create_default_context(
            cafile=self._file(ca_file, owner) if ca_file else None)
        if key_env:
            value = os.environ.get(key_env, "")
            if not value:
                raise ReachError("service_unavailable", "The client key's environment "
                                 "variable is not set in this gateway.")
            if not value.lstrip().startswith("-----BEGIN"):
                key = value  # a path: checked below as any other
            else:
                with tempfile.NamedTemporaryFile("w", suffix=".pem") as handle:
                    os.fchmod(handle.fileno(), 0o600)
                    handle.write(value)
                    handle.flush()
                    context.load_cert_chain(cert, handle.name)
                return context
        context.load_cert_chain(cert, self._file(key, owner) if key else None)
        return context

    def client_ssl(self, cert: str, key: str, key_env: str, ca_file: str,
                   owner: str) -> ssl.SSLContext:
        """A client context for mTLS (cached): a credential's, or a tool's, of the tenant
        ``owner`` (its slug)."""
        try:
            return self._ssl(cert, key, key_env and self._lent(key_env, owner), ca_file,
                             owner)
        except (ssl.SSLError, OSError, ValueError):
            # Missing or non-PEM files, a key that does not fit: the operator's to fix.
            # Which file, and why, stays out of the caller's answer (host paths).
            raise ReachError("service_unavailable", "A client certificate for this call "
                             "cannot be loaded in this gateway.") from None

    def secret(self, entry, owner: str) -> str | None:
        """The secret of a credential (or of a tool: the same two fields) of the tenant
        ``owner`` (its slug)."""
        if entry.value_env:
            return os.environ.get(self._lent(entry.value_env, owner))
        if entry.secret_ciphertext:
            return self._secret(entry.secret_ciphertext)
        return None

    def apply(self, table: RouteTable, tenant_pk: int, agent_pk: int,
              headers: dict[str, str], query: dict[str, str]) -> ssl.SSLContext | None:
        """Add the tenant's credentials for the agent to ``headers`` / ``query``; return an
        SSL context when one is an mTLS client certificate."""
        context = None
        entries = table.credentials_for(tenant_pk, agent_pk)
        owner = table.tenants[tenant_pk].slug if entries and tenant_pk in table.tenants else ""
        for entry in entries:
            if entry.kind == "mtls":
                context = self.client_ssl(entry.client_cert_path, entry.client_key_path,
                                          entry.value_env, entry.ca_file, owner)
                continue
            value = self.secret(entry, owner)
            if not value:
                # An operator's business (the variable is unset in this gateway), not a
                # failure of the gateway's own: 503, and the caller is not to blame.
                raise ReachError("service_unavailable", "A downstream credential of this "
                                 "agent has no value in this gateway.")
            if entry.kind == "bearer":
                headers["authorization"] = f"Bearer {value}"
            elif entry.kind == "header":
                headers[entry.field_name.lower()] = value
            elif entry.kind == "query":
                query[entry.field_name] = value
        return context
