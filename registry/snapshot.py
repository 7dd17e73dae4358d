"""Builds route-table entries from the database: the only place the ORM meets ``routing``."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import sys
import types

import orjson
from django.db import connection, transaction
from django.db.models import Prefetch
from django.utils.dateparse import parse_datetime

from registry.health import weight_factor
from registry.models import (
    Agent,
    Capability,
    Instance,
    LearnedPhrase,
    RouteChange,
    RouteVersion,
)
from routing.table import (
    AgentEntry,
    ApiKeyEntry,
    CapabilityEntry,
    CredentialEntry,
    Delta,
    GrantEntry,
    InstanceEntry,
    LearnedEntry,
    QuotaEntry,
    RouteTable,
    TenantEntry,
    ToolEntry,
)
from tenants.models import ApiKey, Credential, Grant, Quota, Tenant


def current_version() -> int:
    return RouteVersion.objects.filter(pk=1).values_list("version", flat=True).first() or 0


def _agents():
    return Agent.objects.select_related("namespace").prefetch_related(
        Prefetch("capabilities", queryset=Capability.objects.order_by("pk")),
        Prefetch("instances", queryset=Instance.objects.order_by("pk")),
    )


_AGENT_FIELDS = (
    "pk", "name", "owner_tenant_id", "version", "description", "protocol", "visibility",
    "internal_only", "weight", "priority", "traffic_percent", "price_input_per_1k",
    "price_output_per_1k", "price_per_call", "pool_max_connections", "pool_idle_seconds",
)


def agent_entry(agent: Agent) -> AgentEntry:
    return _agent_entry(agent, agent.namespace.name,
                        tuple(capability_entry(c) for c in agent.capabilities.all()),
                        tuple(instance_entry(i) for i in agent.instances.all()))


def _agent_entry(agent, namespace: str, capabilities: tuple, instances: tuple) -> AgentEntry:
    return AgentEntry(
        pk=agent.pk,
        namespace=_intern(namespace),
        name=agent.name,
        owner_tenant_pk=agent.owner_tenant_id,
        version=_intern(agent.version),
        description=agent.description,
        protocol=_intern(agent.protocol),
        visibility=_intern(agent.visibility),
        internal_only=agent.internal_only,
        weight=agent.weight,
        priority=agent.priority,
        traffic_percent=agent.traffic_percent,
        price_input_per_1k=_shared(float(agent.price_input_per_1k)),
        price_output_per_1k=_shared(float(agent.price_output_per_1k)),
        price_per_call=_shared(float(agent.price_per_call)),
        pool_max_connections=agent.pool_max_connections,
        pool_idle_seconds=agent.pool_idle_seconds,
        capabilities=capabilities,
        instances=instances,
    )


class _Row(dict):
    """A ``values()`` row read like a model instance, for the builders above."""

    __slots__ = ()

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def all_agent_entries():
    """Every agent's entry, for a whole table: three plain queries, rows as tuples, no model
    instances and none of Django's per-value converters (at 10,000 agents x 5 instances
    the prefetching ORM path took 4 s, most of it building objects the entries copy)."""
    capabilities: dict[int, list] = {}
    for agent_id, *values in _rows(Capability, ("agent_id", *_CAPABILITY_COLUMNS)):
        # Positional, in the entry's field order: a dict per row and a lookup per field
        # cost as much as the rest of the load together.
        for at, empty in _CAPABILITY_JSON_AT:
            value = values[at]
            values[at] = empty if value is None else _json(value)
        for at in _REPEATED_CAPABILITY_AT:
            values[at] = _intern(values[at])
        capabilities.setdefault(agent_id, []).append(CapabilityEntry(*values))
    # Per agent: its pk, then its instances. The pk is kept as one object for the agent's
    # entry and its instances' agent_pk, not one per row (1.6 MB at 10,000 agents x 5).
    instances: dict[int, list] = {}
    factors: dict[tuple, float] = {}
    for (pk, agent_id, endpoint, reach_mode, state, tier, flaps, cpu, memory, queue_depth,
         in_flight, available, lease) in _rows(Instance, _INSTANCE_COLUMNS,
                                                epochs=("lease_expires_at",)):
        own = instances.setdefault(agent_id, [agent_id])
        factor = factors.get((state, tier, flaps))
        if factor is None:
            factor = factors[(state, tier, flaps)] = _shared(
                weight_factor(state=state, health_tier=tier, flaps=flaps))
        available = _json(available) if available is not None else None
        if lease is not None and not isinstance(lease, float):
            lease = _datetime(lease).timestamp()
        own.append(InstanceEntry(
            pk, own[0], endpoint, _intern(reach_mode), _intern(state), _intern(tier),
            factor, _shared(cpu), _shared(memory), queue_depth, in_flight,
            frozenset(available) if available else _SERVES_ALL, lease))
    for row in Agent.objects.order_by("pk").values(
            *_AGENT_COLUMNS, "namespace__name").iterator(chunk_size=5000):
        pk = row.pop("id")
        own = instances.get(pk, [pk])
        row["pk"] = own[0]
        yield _agent_entry(_Row(row), row["namespace__name"],
                           tuple(capabilities.get(pk, ())), tuple(own[1:]))


def _rows(model, columns: tuple[str, ...], epochs: tuple[str, ...] = ()):
    """``model``'s rows as tuples of ``columns`` (field names), in pk order, streamed (a
    server-side cursor on PostgreSQL: the driver never holds the whole result).

    On PostgreSQL the server does what would cost the gateway a Python object per value:
    the datetime ``epochs`` come as seconds since the epoch (parsing 50,000 timestamps
    into datetimes only to take their ``timestamp()`` was a quarter of a 10,000-agent
    load) and empty JSON lists and objects as None (most capabilities and instances leave
    most of theirs empty). Elsewhere values come as the driver gives them."""
    quote = connection.ops.quote_name
    meta = model._meta
    postgresql = connection.vendor == "postgresql"

    def column(name: str) -> str:
        field = meta.get_field("id" if name == "pk" else name)
        quoted = quote(field.column)
        if postgresql and name in epochs:
            return f"EXTRACT(EPOCH FROM {quoted})::float8"
        if postgresql and field.get_internal_type() == "JSONField":
            return f"NULLIF(NULLIF({quoted}, '[]'::jsonb), '{{}}'::jsonb)"
        return quoted

    names = ", ".join(column(c) for c in columns)
    with connection.chunked_cursor() as cursor:
        cursor.execute(f"SELECT {names} FROM {quote(meta.db_table)} "  # noqa: S608
                       f"ORDER BY {quote(meta.pk.column)}")
        while rows := cursor.fetchmany(5000):
            yield from rows


def _json(value):
    # JSON columns come back as text (PostgreSQL through Django's loader, and SQLite).
    return orjson.loads(value) if isinstance(value, str | bytes) else value


def _datetime(value):
    # SQLite keeps datetimes as text, in UTC without an offset.
    if isinstance(value, str):
        value = parse_datetime(value)
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
    return value


# Every entry field is read from the model attribute of the same name; the entry
# turns the JSON lists and objects into tuples and read-only mappings itself.
_CAPABILITY_FIELDS = tuple(f.name for f in dataclasses.fields(CapabilityEntry))
_CAPABILITY_COLUMNS = tuple("id" if f == "pk" else f for f in _CAPABILITY_FIELDS)
_INSTANCE_COLUMNS = ("id", "agent_id", "endpoint", "reach_mode", "state", "health_tier",
                     "flaps", "cpu", "memory", "queue_depth", "in_flight",
                     "capabilities_available", "lease_expires_at")
_AGENT_COLUMNS = tuple("id" if f == "pk" else f for f in _AGENT_FIELDS)
_CAPABILITY_JSON = tuple(f.name for f in Capability._meta.fields
                         if f.get_internal_type() == "JSONField" and f.name in _CAPABILITY_FIELDS)


# A fleet's entries repeat a handful of values (states, tiers, kinds, versions, 0.0): each
# a new object per row as the database driver returns it. One shared object each keeps
# a table of 10,000 agents x 5 instances some 20 MB smaller in every gateway.
_intern = sys.intern
_SERVES_ALL = frozenset()
_REPEATED_CAPABILITY_FIELDS = ("kind", "version", "path", "display_name")
# (position, the field's empty value): the JSON fields, which come as None when empty.
_CAPABILITY_JSON_AT = tuple(
    (_CAPABILITY_FIELDS.index(f.name), f.default if f.default is not dataclasses.MISSING
     else f.default_factory())
    for f in dataclasses.fields(CapabilityEntry) if f.name in _CAPABILITY_JSON)
_REPEATED_CAPABILITY_AT = tuple(_CAPABILITY_FIELDS.index(name)
                                for name in _REPEATED_CAPABILITY_FIELDS)


def _shared(number: float) -> float:
    return 0.0 if number == 0 else 1.0 if number == 1 else number


def capability_entry(c: Capability) -> CapabilityEntry:
    values = {name: getattr(c, name) for name in _CAPABILITY_FIELDS}
    for name in _REPEATED_CAPABILITY_FIELDS:
        values[name] = _intern(values[name])
    return CapabilityEntry(**values)


def instance_entry(i: Instance) -> InstanceEntry:
    return InstanceEntry(
        pk=i.pk, agent_pk=i.agent_id, endpoint=i.endpoint, reach_mode=_intern(i.reach_mode),
        state=_intern(i.state), health_tier=_intern(i.health_tier),
        weight_factor=_shared(weight_factor(state=i.state, health_tier=i.health_tier,
                                            flaps=i.flaps)),
        cpu=_shared(i.cpu), memory=_shared(i.memory), queue_depth=i.queue_depth,
        in_flight=i.in_flight,
        capabilities_available=(frozenset(i.capabilities_available)
                                if i.capabilities_available else _SERVES_ALL),
        lease_expires_at=i.lease_expires_at.timestamp() if i.lease_expires_at else None,
    )


def tenant_entry(t: Tenant) -> TenantEntry:
    return TenantEntry(pk=t.pk, slug=t.slug, is_active=t.is_active)


def api_key_entry(k: ApiKey) -> ApiKeyEntry | None:
    """None for a revoked key: the data plane never needs to know it existed."""
    if k.revoked_at is not None:
        return None
    return ApiKeyEntry(
        pk=k.pk, prefix=k.prefix, key_hash=k.key_hash, tenant_pk=k.tenant_id,
        scopes=frozenset(k.scopes),
        expires_at=k.expires_at.timestamp() if k.expires_at else None,
    )


def grant_entry(g: Grant) -> GrantEntry | None:
    if g.accepted_at is None:  # offered: nothing until the grantee accepts it
        return None
    return GrantEntry(
        pk=g.pk, tenant_pk=g.tenant_id, agent_pk=g.agent_id, capability_pk=g.capability_id,
        capability_ids=frozenset(g.accepted_capabilities or ()),
    )


def credential_entry(c: Credential) -> CredentialEntry:
    return CredentialEntry(
        pk=c.pk, tenant_pk=c.tenant_id, agent_pk=c.agent_id, kind=c.kind,
        field_name=c.field_name,
        secret_ciphertext=(
            base64.b64encode(bytes(c.secret_ciphertext)).decode() if c.secret_ciphertext else ""
        ),
        value_env=c.value_env, client_cert_path=c.client_cert_path,
        client_key_path=c.client_key_path, ca_file=c.ca_file,
    )


def quota_entry(q: Quota) -> QuotaEntry:
    return QuotaEntry(
        pk=q.pk, tenant_pk=q.tenant_id, agent_pk=q.agent_id, capability_pk=q.capability_id,
        requests_per_minute=q.requests_per_minute, burst=q.burst,
        monthly_requests=q.monthly_requests, monthly_tokens=q.monthly_tokens,
        monthly_cost=float(q.monthly_cost) if q.monthly_cost is not None else None,
    )


def learned_entry(p: LearnedPhrase) -> LearnedEntry | None:
    """None unless the phrase is routable (``registry.learning`` decides): the data plane
    never needs the phrases that are not used."""
    if not p.routable:
        return None
    return LearnedEntry(pk=p.pk, tenant_pk=p.tenant_id, capability_id=p.capability_id,
                        phrase=p.phrase)


def _routable_phrases():
    return LearnedPhrase.objects.filter(routable=True).only(
        "pk", "tenant_id", "capability_id", "phrase", "routable")


def tool_entry(t) -> ToolEntry:
    grants = list(t.grants.all())
    return ToolEntry(
        pk=t.pk, name=t.name, owner_tenant_pk=t.owner_tenant_id, display_name=t.display_name,
        description=t.description, when_to_use=t.when_to_use,
        when_not_to_use=t.when_not_to_use, input_schema=t.input_schema or {},
        output_description=t.output_description, output_schema=t.output_schema or {},
        examples=t.examples or [], timeout_ms=t.timeout_ms, visibility=t.visibility,
        url_template=t.url_template, method=t.method,
        query_arguments=t.query_arguments or [], auth_kind=t.auth_kind,
        auth_field_name=t.auth_field_name,
        secret_ciphertext=(base64.b64encode(bytes(t.secret_ciphertext)).decode()
                           if t.secret_ciphertext else ""),
        value_env=t.value_env, client_cert_path=t.client_cert_path,
        client_key_path=t.client_key_path, ca_file=t.ca_file,
        caller_calls_per_minute=t.caller_calls_per_minute,
        calls_per_minute=t.calls_per_minute,
        granted_tenants=frozenset(g.tenant_id for g in grants if g.tenant_id),
        granted_agents=frozenset(g.agent_id for g in grants if g.agent_id),
    )


def _tools():
    from tools.models import Tool

    return Tool.objects.prefetch_related("grants")


# kind -> (table attribute, queryset of all rows, row -> entry or None)
BUILDERS = {
    "agent": ("agents", _agents, agent_entry),
    "tenant": ("tenants", Tenant.objects.all, tenant_entry),
    "api_key": ("api_keys", ApiKey.objects.all, api_key_entry),
    "grant": ("grants", Grant.objects.all, grant_entry),
    "credential": ("credentials", Credential.objects.all, credential_entry),
    "quota": ("quotas", Quota.objects.all, quota_entry),
    "learned": ("learned", _routable_phrases, learned_entry),
    "tool": ("tools", _tools, tool_entry),
}


def entry_for(kind: str, pk: int):
    """The current entry for one row, or None when it is gone (or not for the data plane)."""
    _, rows, build = BUILDERS[kind]
    row = rows().filter(pk=pk).first()
    return build(row) if row is not None else None


CATCH_UP_MAX_ROWS = 2000  # more changed rows than this: a whole reload is as quick


@transaction.atomic
def changes_since(version: int) -> tuple[int, list[Delta]] | None:
    """The current version and, as deltas stamped with it, the current entry of every row
    changed after ``version``; None when the change log does not reach back that far (or
    so many rows changed that a whole reload is cheaper). As with ``build_table`` the
    version is read first: a change it misses carries a later version."""
    now = current_version()
    if now <= version:
        return now, []
    oldest = RouteChange.objects.order_by("version").values_list("version", flat=True).first()
    if oldest is None or oldest > version + 1:
        return None
    rows = list(RouteChange.objects.filter(version__gt=version, version__lte=now)
                .values_list("kind", "row").distinct()[:CATCH_UP_MAX_ROWS + 1])
    if len(rows) > CATCH_UP_MAX_ROWS:
        return None
    deltas = []
    for kind, pk in sorted(rows):
        entry = entry_for(kind, pk)
        deltas.append(Delta(version=now, kind=kind, op="upsert" if entry is not None
                            else "delete", pk=pk, entry=entry))
    return now, deltas


@transaction.atomic
def build_table() -> RouteTable:
    """The whole table as of now. The version is read first: any change it misses carries
    a later version and arrives as a delta (entries are whole rows, so re-applying is safe)."""
    version = current_version()
    collections = {}
    for kind, (attribute, rows, build) in BUILDERS.items():
        entries = (all_agent_entries() if kind == "agent" else
                   (build(row) for row in rows().iterator(chunk_size=2000)))
        collections[attribute] = types.MappingProxyType({e.pk: e for e in entries if e})
    return RouteTable(version=version, **collections).indexed()
