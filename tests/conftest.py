from __future__ import annotations

from dataclasses import dataclass

import pytest
from rest_framework.test import APIClient

from tenants.choices import MembershipRole
from tests import factories


@dataclass
class World:
    """Two tenants with one agent each, and the three actors of every isolation test."""

    tenant_a: object
    tenant_b: object
    owner: object  # admin member of tenant A
    member: object  # viewer member of tenant A
    outsider: object  # admin member of tenant B
    superuser: object
    agent_a: object
    agent_b: object


@pytest.fixture
def world(db, django_user_model) -> World:
    tenant_a = factories.tenant(slug="alpha", name="Alpha")
    tenant_b = factories.tenant(slug="beta", name="Beta")
    return World(
        tenant_a=tenant_a,
        tenant_b=tenant_b,
        owner=factories.staff_user(tenant=tenant_a, username="owner"),
        member=factories.staff_user(tenant=tenant_a, role=MembershipRole.VIEWER, username="member"),
        outsider=factories.staff_user(tenant=tenant_b, username="outsider"),
        superuser=django_user_model.objects.create_superuser("root", "root@localhost", "pw"),
        agent_a=factories.agent(owner=tenant_a, name="alpha-translator"),
        agent_b=factories.agent(owner=tenant_b, name="beta-summariser"),
    )


@pytest.fixture(autouse=True)
def _fresh_auth_throttle():
    """Failed-authentication counts (per address, shared through Redis) start at zero in
    every test: the suite's requests all come from one address. And no test inherits an
    earlier one's Redis outage (``reach_core.outage``: calls skip Redis for 5 s after one
    failed)."""
    from reach_core import outage
    from reach_platform import auth_throttle

    outage.REDIS.clear()
    auth_throttle.reset()
    yield
    outage.REDIS.clear()


@pytest.fixture
def api() -> APIClient:
    return APIClient()


def key_client(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


@pytest.fixture
def published(monkeypatch) -> list[dict]:
    """Route-table messages the control plane publishes, captured in-process."""
    from registry import routes
    from routing.bus import InProcessBus

    bus = InProcessBus()
    messages: list[dict] = []
    bus.subscribe(messages.append)
    monkeypatch.setattr(routes, "route_bus", lambda: bus)
    return messages
