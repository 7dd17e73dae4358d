from __future__ import annotations

import pytest
from django.contrib.auth import authenticate

from reach_platform.demo import demo_setup
from tenants.models import ApiKey
from tenants.services import api_key_authenticate


@pytest.mark.django_db
def test_each_start_issues_fresh_access_and_revokes_the_previous_key():
    first = demo_setup()
    second = demo_setup()
    assert isinstance(api_key_authenticate(plaintext=second.api_key), ApiKey)
    assert api_key_authenticate(plaintext=first.api_key) == "API key has been revoked."
    assert authenticate(username="admin", password=second.admin_password) is not None
    assert authenticate(username="admin", password=first.admin_password) is None
    assert ApiKey.objects.filter(tenant__slug="demo", revoked_at__isnull=True).count() == 1


@pytest.mark.django_db
def test_admin_password_can_be_pinned(monkeypatch):
    monkeypatch.setenv("REACH_ADMIN_PASSWORD", "pinned-password-123")
    access = demo_setup()
    assert access.admin_password == "pinned-password-123"
    assert authenticate(username="admin", password="pinned-password-123") is not None
