"""``manage.py reach_tenant``: the first tenant and key of a fresh install, from the shell."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import CommandError, call_command

from tenants.models import ApiKey, Tenant
from tenants.services import api_key_authenticate


def run(*args) -> str:
    out = io.StringIO()
    call_command("reach_tenant", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_it_creates_the_tenant_and_a_working_key_printed_once():
    printed = run("cloud-sales", "--name", "Cloud sales")
    assert "tenant cloud-sales (created)" in printed
    (plaintext,) = re.findall(r"(rk_\S+)", printed)
    key = api_key_authenticate(plaintext=plaintext)
    assert isinstance(key, ApiKey) and key.tenant.name == "Cloud sales"
    assert set(key.scopes) == {"invoke", "read", "manage", "register"}
    assert plaintext not in key.key_hash  # stored hashed
    again = run("cloud-sales", "--scope", "invoke")  # reused, another key
    assert "(existing)" in again and Tenant.objects.filter(slug="cloud-sales").count() == 1
    (second,) = re.findall(r"(rk_\S+)", again)
    assert second != plaintext and api_key_authenticate(plaintext=second).scopes == ["invoke"]


@pytest.mark.django_db
def test_a_bad_slug_is_refused_and_leaves_nothing():
    with pytest.raises(CommandError, match="slug"):
        run("Not A Slug!")
    assert not Tenant.objects.filter(name="Not A Slug!").exists()
    assert not ApiKey.objects.exists()
