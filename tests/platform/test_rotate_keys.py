"""Key rotation: with a new key prepended, every stored secret is re-encrypted with it,
and still decrypts once the old key is removed."""

from __future__ import annotations

import io

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command

from tasks.services import signing_secret_create, signing_secret_value
from tenants import crypto
from tests import factories
from tools.models import Tool
from tools.services import tool_save


@pytest.mark.django_db
def test_rotation_re_encrypts_every_secret_with_the_new_key(world, settings):
    credential = factories.credential(tenant=world.tenant_a, agent=world.agent_a,
                                      secret="credential-secret")
    tool = tool_save(tool=Tool(owner_tenant=world.tenant_a, name="rotated",
                               description="d", url_template="http://127.0.0.1:9/x"),
                     secret="tool-secret")
    secret, plaintext = signing_secret_create(tenant=world.tenant_a, name="rot")
    old = list(settings.CREDENTIAL_KEYS)
    new = Fernet.generate_key().decode()
    settings.CREDENTIAL_KEYS = [new, *old]
    out = io.StringIO()
    call_command("reach_rotate_keys", stdout=out)
    assert "tenants.Credential: 1 re-encrypted" in out.getvalue()
    settings.CREDENTIAL_KEYS = [new]  # the old key is gone
    crypto._fernet.cache_clear()
    credential.refresh_from_db()
    tool.refresh_from_db()
    secret.refresh_from_db()
    assert crypto.decrypt(credential.secret_ciphertext) == "credential-secret"
    assert crypto.decrypt(tool.secret_ciphertext) == "tool-secret"
    assert signing_secret_value(secret) == plaintext
