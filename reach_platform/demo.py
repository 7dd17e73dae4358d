"""The embedded demo: a tenant, an admin user and an API key, ready on first start."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from tenants.choices import ApiKeyScope, MembershipRole
from tenants.models import ApiKey, Membership, Tenant
from tenants.services import api_key_create

DEMO_TENANT = "demo"
DEMO_PRICES = {
    "demo-chat": {"price_input_per_1k": "0.5", "price_output_per_1k": "1.5"},
    "demo-translator": {"price_per_call": "0.002"},
}
DEMO_KEY_NAME = "demo (printed by the run command)"
ADMIN_USERNAME = "admin"


@dataclass(frozen=True)
class DemoAccess:
    tenant: Tenant
    admin_username: str
    admin_password: str
    api_key: str


@transaction.atomic
def demo_setup() -> DemoAccess:
    """Create or refresh the demo tenant, admin user and API key.

    Passwords and keys cannot be read back from their hashes, so each start
    issues fresh ones and revokes the previous demo key rather than storing
    any plaintext on disk. ``REACH_ADMIN_PASSWORD`` pins the admin password.
    """
    tenant, _ = Tenant.objects.get_or_create(slug=DEMO_TENANT, defaults={"name": "Demo tenant"})
    password = os.environ.get("REACH_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(
        username=ADMIN_USERNAME, defaults={"email": "admin@localhost"}
    )
    user.is_staff = user.is_superuser = user.is_active = True
    user.set_password(password)
    user.save()
    Membership.objects.get_or_create(
        tenant=tenant, user=user, defaults={"role": MembershipRole.ADMIN}
    )
    ApiKey.objects.filter(tenant=tenant, name=DEMO_KEY_NAME, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    issued = api_key_create(
        tenant=tenant, name=DEMO_KEY_NAME,
        scopes=[ApiKeyScope.INVOKE, ApiKeyScope.READ, ApiKeyScope.MANAGE],
    )
    return DemoAccess(
        tenant=tenant, admin_username=ADMIN_USERNAME, admin_password=password,
        api_key=issued.plaintext,
    )


def demo_agents_register(*, tenant: Tenant, agents) -> list[int]:
    """Register the demo agents (``reach_platform.demo_agents``) for ``tenant``; returns their
    instance pks. Their ports change on every start, so earlier instances are dropped."""
    from registry.descriptors import parse_json_descriptor
    from registry.models import Instance
    from registry.services import agent_register

    instances = []
    for agent in agents:
        spec = parse_json_descriptor(agent.descriptor)
        Instance.objects.filter(agent__namespace__name=spec.namespace,
                                agent__name=spec.name).exclude(
            endpoint=spec.endpoint).delete()
        registration = agent_register(tenant=tenant, spec=spec)
        # Prices, so the usage report has costs to allocate (descriptors carry none).
        for name, value in DEMO_PRICES.get(spec.name, {}).items():
            setattr(registration.agent, name, Decimal(value))
        registration.agent.save()
        instances.append(registration.instance.pk)
    return instances


def demo_heartbeat(instance_pks: list[int]) -> None:
    """Keep the demo agents' leases: they run inside the platform's own process."""
    from registry.health import Load
    from registry.models import Instance
    from registry.services import Heartbeat, instance_heartbeat

    for instance in Instance.objects.select_related("agent").filter(pk__in=instance_pks):
        instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load()))
