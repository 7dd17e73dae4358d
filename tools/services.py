"""Writing tools: the secret is encrypted on the way in and never comes back out."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from tenants import crypto
from tools.models import Tool


def tool_set_secret(*, tool: Tool, secret: str | None) -> Tool:
    """Encrypt ``secret`` into ``tool`` (not saved). ``None`` or empty keeps the stored
    one. A stored secret and ``value_env`` exclude each other: setting one clears the
    other."""
    if secret:
        if any(c in secret for c in "\r\n\x00"):
            raise ValidationError({"secret": "must not contain line breaks or NUL"})
        tool.secret_ciphertext = crypto.encrypt(secret)
        tool.value_env = ""
    elif tool.value_env:
        tool.secret_ciphertext = None
    return tool


@transaction.atomic
def tool_save(*, tool: Tool, secret: str | None = None) -> Tool:
    tool_set_secret(tool=tool, secret=secret)
    tool.full_clean()
    tool.save()
    return tool
