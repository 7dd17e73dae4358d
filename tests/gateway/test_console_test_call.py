"""The console's test call: a dry run and, when asked, one real call through a real
gateway process, as the agent's owner tenant with a key made for it and revoked after."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from registry.models import Agent
from tenants.choices import MembershipRole
from tenants.models import ApiKey
from tests import factories


@pytest.mark.django_db(transaction=True)
def test_a_real_test_call_goes_through_the_gateway_and_its_key_is_revoked(
        gateway, client, settings):
    settings.CONSOLE_GATEWAY_URL = gateway.base
    agent = Agent.objects.get(name="scripted")
    url = reverse("console-agent", args=[agent.pk])
    admin = factories.staff_user(tenant=gateway.tenant)
    client.force_login(admin)
    page = client.post(url, {"capability": "echo.all", "input": '{"text": "from the console"}',
                             "real": "1"}).content.decode()
    status = re.search(r'id="agent-real-call-status">(\d+)<', page)
    assert status and status.group(1) == "200", page[page.find("agent-real-call"):][:800]
    assert "from the console" in page  # the agent's echo, as the gateway relayed it
    assert 'id="agent-dry-run-chosen"' in page  # the dry run came with it
    keys = ApiKey.objects.filter(name__startswith="console test call")
    assert keys.count() == 1 and keys.get().revoked_at is not None

    bad = client.post(url, {"capability": "echo.all", "input": "[1, 2", "real": "1"})
    assert "The input is not JSON" in bad.content.decode()

    viewer = factories.staff_user(tenant=gateway.tenant, role=MembershipRole.VIEWER)
    client.force_login(viewer)
    assert client.post(url, {"capability": "echo.all", "real": "1"}).status_code == 403
    assert ApiKey.objects.filter(name__startswith="console test call").count() == 1
