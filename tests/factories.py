"""Small factories: rows with sane defaults, overridable by keyword."""

from __future__ import annotations

import itertools

from django.contrib.auth import get_user_model

from registry.models import Agent, Capability, Instance, Namespace
from tenants.choices import ApiKeyScope, CredentialKind, MembershipRole
from tenants.models import Credential, Membership, Tenant
from tenants.services import api_key_create, credential_save

_seq = itertools.count(1)


def tenant(**kw) -> Tenant:
    n = next(_seq)
    return Tenant.objects.create(**{"name": f"Tenant {n}", "slug": f"tenant-{n}", **kw})


def staff_user(*, tenant: Tenant | None = None, role: str = MembershipRole.ADMIN, **kw):
    n = next(_seq)
    user = get_user_model().objects.create_user(
        username=kw.pop("username", f"user{n}"), password="pw-" + str(n), is_staff=True, **kw
    )
    if tenant is not None:
        Membership.objects.create(tenant=tenant, user=user, role=role)
    return user


def api_key(*, tenant: Tenant, scopes=(ApiKeyScope.READ, ApiKeyScope.MANAGE), **kw):
    return api_key_create(tenant=tenant, name=kw.pop("name", "test key"), scopes=list(scopes), **kw)


def namespace(name: str = "default") -> Namespace:
    return Namespace.objects.get_or_create(name=name)[0]


def agent(*, owner: Tenant, **kw) -> Agent:
    n = next(_seq)
    return Agent.objects.create(
        **{"namespace": namespace(), "name": f"agent-{n}", "owner_tenant": owner, **kw}
    )


def capability(*, agent: Agent, **kw) -> Capability:
    n = next(_seq)
    return Capability.objects.create(**{"agent": agent, "capability_id": f"cap.{n}", **kw})


def instance(*, agent: Agent, **kw) -> Instance:
    n = next(_seq)
    return Instance.objects.create(
        **{"agent": agent, "endpoint": f"http://127.0.0.1:{9000 + n}/", **kw}
    )


def credential(*, tenant: Tenant, agent: Agent, secret: str, **kw) -> Credential:
    fields = {"kind": CredentialKind.HEADER, "field_name": "X-Api-Token", **kw}
    row = Credential(tenant=tenant, agent=agent, **fields)
    return credential_save(credential=row, secret=secret)


def seed_defaults() -> None:
    """What the migrations seed (namespace, synonym table, version counter).

    ``transactional_db`` tests flush every table afterwards, seeds included.
    """
    import importlib

    from django.apps import apps

    namespace("default")
    seed = importlib.import_module("registry.migrations.0005_seed_synonyms_and_version")
    seed.seed(apps, None)
