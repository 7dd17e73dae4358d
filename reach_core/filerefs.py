"""Which of the gateway host's files a tenant's mTLS credential or tool may name.

``client_cert_path``, ``client_key_path`` and ``ca_file`` are paths on the gateway's
host. Nothing of a file is ever sent (a key stays inside the TLS handshake), but a
tenant who could name any file would have the gateway present the host's own
certificate and key (another service's, say) to the tenant's server. So files are read
only from the operator's directory (``REACH_CREDENTIAL_FILES``, default
``/etc/agent-reach/certs``): checked by name at registration, and again by the gateway
after symbolic links are resolved, whatever got into the table.
"""

from __future__ import annotations

import os

DEFAULT_DIRECTORY = "/etc/agent-reach/certs"
FIELDS = ("client_cert_path", "client_key_path", "ca_file")


def refusal(path: str, directory: str) -> str | None:
    """Why ``path`` may not be named by a tenant's credential; None when it may."""
    if not directory:
        return ("This platform reads no certificate files for tenants "
                "(REACH_CREDENTIAL_FILES is empty).")
    if "\x00" in path or not os.path.isabs(path) or os.path.normpath(path) != path:
        return "Must be an absolute, normalised path (no '..', no '//')."
    if not _inside(path, os.path.normpath(directory)):
        return (f"Certificate files are read only under {directory} (its operator sets "
                f"the directory with REACH_CREDENTIAL_FILES).")
    return None


def problems(row, directory: str) -> dict[str, str]:
    """A model's file fields that it may not name, with why (for ``clean``)."""
    found = {}
    for name in FIELDS:
        why = getattr(row, name) and refusal(getattr(row, name), directory)
        if why:
            found[name] = why
    return found


def resolved(path: str, directory: str) -> str | None:
    """``path`` with its links resolved, if it still lies inside ``directory``."""
    if refusal(path, directory):
        return None
    real = os.path.realpath(path)
    return real if _inside(real, os.path.realpath(directory)) else None


def _inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip("/") + "/")
