"""Which of the gateway host's files a tenant's mTLS credential or tool may name.

``client_cert_path``, ``client_key_path`` and ``ca_file`` are paths on the gateway's
host. Nothing of a file is ever sent (a key stays inside the TLS handshake), but a
tenant who could name any file would have the gateway present the host's own
certificate and key (another service's, say) to the tenant's server. So files are read
only from the operator's directory (``REACH_CREDENTIAL_FILES``): checked by name at
registration, and again by the gateway after symbolic links are resolved, whatever got
into the table.

``{tenant}`` in the directory stands for the owning tenant's slug, and the default
``/etc/agent-reach/certs/{tenant}`` gives each tenant a directory of its own: with one
directory for all, tenant B named A's client certificate and key and had the gateway
present A's identity to A's mTLS service (a break test). Only slugs of lower-case
letters and digits joined by single hyphens name a directory.
"""

from __future__ import annotations

import os

from reach_core.envrefs import names_its_own

DEFAULT_DIRECTORY = "/etc/agent-reach/certs/{tenant}"
FIELDS = ("client_cert_path", "client_key_path", "ca_file")


def directory_of(directory: str, tenant: str) -> str | None:
    """The tenant's directory (``{tenant}`` filled in with its slug); None when the slug
    cannot name one."""
    if "{tenant}" not in directory:
        return directory
    return directory.replace("{tenant}", tenant) if names_its_own(tenant) else None


def refusal(path: str, directory: str, tenant: str) -> str | None:
    """Why ``path`` may not be named by a credential of the tenant whose slug is
    ``tenant``; None when it may."""
    if not directory:
        return ("This platform reads no certificate files for tenants "
                "(REACH_CREDENTIAL_FILES is empty).")
    if "\x00" in path or not os.path.isabs(path) or os.path.normpath(path) != path:
        return "Must be an absolute, normalised path (no '..', no '//')."
    own = directory_of(directory, tenant)
    if own is None:
        return "This tenant's slug names no certificate directory."
    if not _inside(path, os.path.normpath(own)):
        return (f"This tenant's certificate files are read only under {own} (its "
                f"operator sets the directory with REACH_CREDENTIAL_FILES).")
    return None


def problems(row, directory: str, tenant: str) -> dict[str, str]:
    """A model's file fields that it may not name, with why (for ``clean``)."""
    found = {}
    for name in FIELDS:
        why = getattr(row, name) and refusal(getattr(row, name), directory, tenant)
        if why:
            found[name] = why
    return found


def resolved(path: str, directory: str, tenant: str) -> str | None:
    """``path`` with its links resolved, if it still lies inside the tenant's directory."""
    if refusal(path, directory, tenant):
        return None
    real = os.path.realpath(path)
    return real if _inside(real, os.path.realpath(directory_of(directory, tenant))) else None


def _inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip("/") + "/")
