"""Writes for the registry: registration, heartbeats, leases, deregistration."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from reach_core.endpoints import EndpointRefused, check_registration
from reach_platform.endpoints import endpoint_policy
from registry import health, heartbeats, routes
from registry.choices import InstanceState, ReachMode
from registry.descriptors import normalise_params
from registry.models import (
    Agent,
    Capability,
    Instance,
    InstanceTransition,
    Namespace,
    ParameterSynonym,
)
from registry.spec import AgentSpec, CapabilitySpec, CredentialSpec, DescriptorError
from registry.tokens import agent_token_issue
from routing.table import LoadReport
from tenants.models import Credential, Tenant

logger = logging.getLogger(__name__)

# A deregistered instance keeps draining this long before its row goes, so
# calls already routed to it can finish.
DRAIN_GRACE = dt.timedelta(seconds=30)


class RegistrationConflict(Exception):
    """The namespace + name belongs to another tenant, or the token is for another agent."""


def synonym_table() -> dict[str, str]:
    return dict(ParameterSynonym.objects.values_list("synonym", "canonical"))


@dataclass(frozen=True)
class Registration:
    agent: Agent
    instance: Instance | None
    created: bool
    # Plaintext agent token: only when one was issued by this registration.
    token: str | None = None


@transaction.atomic
def agent_register(
    *,
    tenant: Tenant,
    spec: AgentSpec,
    acting_agent: Agent | None = None,
    now: dt.datetime | None = None,
) -> Registration:
    """Create or update the agent ``spec`` names (idempotent by namespace + name).

    ``acting_agent`` is set when an agent token registers: it may only update
    itself, and no new token is issued. Raises ``DescriptorError`` (every
    problem at once) or ``RegistrationConflict``; on error nothing is written.
    """
    now = now or timezone.now()
    problems: dict[str, list[str]] = {}
    endpoint = None
    if spec.reach_mode == ReachMode.TUNNEL:
        endpoint = f"tunnel://{spec.instance_key}"
    elif spec.endpoint:
        try:
            endpoint = check_registration(spec.endpoint, endpoint_policy())
        except EndpointRefused as exc:
            # At the field the author wrote, in the format they wrote it in.
            where = {"json": "reach.endpoint", "a2a": "url"}.get(spec.source_format,
                                                                "endpoint")
            problems[where] = [str(exc)]
    namespace = Namespace.objects.filter(name=spec.namespace).first()
    if namespace is None:
        problems["namespace"] = [f"unknown namespace {spec.namespace!r}"]
    try:
        spec = normalise_params(spec, synonym_table())
    except DescriptorError as exc:
        problems.update(exc.problems)
    if problems:
        raise DescriptorError(problems)

    _hold_name(namespace.pk, spec.name)
    agent = (
        Agent.objects.select_for_update().filter(namespace=namespace, name=spec.name).first()
    )
    if acting_agent is not None and (agent is None or agent.pk != acting_agent.pk):
        raise RegistrationConflict("An agent token can only re-register its own agent.")
    if agent is not None and agent.owner_tenant_id != tenant.pk:
        raise RegistrationConflict(
            f"The name {spec.name!r} is taken in namespace {spec.namespace!r}."
        )
    created = agent is None
    agent = agent or Agent(namespace=namespace, name=spec.name, owner_tenant=tenant)
    agent.version = spec.version
    agent.description = spec.description
    agent.protocol = spec.protocol
    agent.team = spec.team or agent.team
    for name in _STATED_IF_GIVEN:
        if getattr(spec, name) is not None:
            setattr(agent, name, getattr(spec, name))
    agent.lease_ttl_seconds = spec.lease_ttl_seconds
    agent.heartbeat_interval_seconds = spec.heartbeat_interval_seconds
    agent.descriptor = spec.document
    _clean(agent, "")
    agent.save()
    _sync_capabilities(agent, spec)
    if spec.credential is not None:
        _upsert_credential(agent, spec.credential)
    instance = _upsert_instance(agent, endpoint, now, reach_mode=spec.reach_mode) \
        if endpoint else None
    token = agent_token_issue(agent=agent) if acting_agent is None else None
    logger.info("agent %s %s/%s v%s (%d capabilities%s)",
                "registered" if created else "re-registered", spec.namespace, spec.name,
                spec.version, len(spec.capabilities),
                f", instance {instance.pk}" if instance is not None else "")
    return Registration(agent=agent, instance=instance, created=created, token=token)


def _hold_name(namespace_pk: int, name: str) -> None:
    """Registrations of one name (in any letter case) one at a time, until this
    transaction ends. Without it two first registrations race: neither finds a row to lock,
    and the loser fails on the winner's row (the unique index, or the model's check if the
    winner committed in between) instead of updating it as a second registration does."""
    if connection.vendor != "postgresql":
        return  # SQLite runs one writing transaction at a time anyway
    digest = hashlib.sha256(f"agent-name:{namespace_pk}:{name.lower()}".encode()).digest()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)",
                       [int.from_bytes(digest[:8], "big", signed=True)])


# Agent fields a descriptor may leave unsaid: then an operator's value stays.
_STATED_IF_GIVEN = ("weight", "priority", "internal_only", "pool_max_connections",
                    "pool_idle_seconds")


def _upsert_credential(agent: Agent, spec: CredentialSpec) -> Credential:
    """The owner tenant's credential for ``agent`` in the slot the descriptor names."""
    row = Credential.objects.filter(tenant_id=agent.owner_tenant_id, agent=agent,
                                    kind=spec.kind, field_name=spec.field_name).first()
    row = row or Credential(tenant_id=agent.owner_tenant_id, agent=agent, kind=spec.kind,
                            field_name=spec.field_name)
    for name in ("value_env", "client_cert_path", "client_key_path", "ca_file"):
        setattr(row, name, getattr(spec, name))
    if spec.value_env:
        row.secret_ciphertext = None  # the environment variable is the secret now
    _clean(row, "auth", _MTLS_NAMES if spec.kind == "mtls" else {})
    row.save()
    return row


# A certificate's fields as a descriptor's ``auth`` block names them, for its errors.
_MTLS_NAMES = {"value_env": "client_key_env", "client_cert_path": "client_cert",
               "client_key_path": "client_key"}


def _clean(row, path: str, names: dict[str, str] | None = None) -> None:
    try:
        row.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        names = names or {}
        raise DescriptorError(
            {f"{path}{'.' if path else ''}{names.get(f, f)}": list(m)
             for f, m in exc.message_dict.items()}
        ) from exc


# A spec field is the model field of the same name (see CapabilitySpec).
_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(CapabilitySpec))


def _sync_capabilities(agent: Agent, spec: AgentSpec) -> None:
    existing = {c.capability_id: c for c in agent.capabilities.all()}
    wanted = {c.capability_id for c in spec.capabilities}
    for index, cap in enumerate(spec.capabilities):
        row = existing.get(cap.capability_id) or Capability(agent=agent)
        for name in _SPEC_FIELDS:
            value = getattr(cap, name)
            # The spec's tuples are JSON lists in the row.
            setattr(row, name, list(value) if isinstance(value, tuple) else value)
        _clean(row, f"capabilities[{index}]")
        row.save()
    # Capabilities the new descriptor no longer lists are gone at once, not at
    # the next heartbeat: callers must not be routed to them.
    for capability_id, row in existing.items():
        if capability_id not in wanted:
            row.delete()


def _upsert_instance(agent: Agent, endpoint: str, now: dt.datetime, *,
                     reach_mode: str = ReachMode.DIRECT) -> Instance:
    instance = Instance.objects.filter(agent=agent, endpoint=endpoint).first()
    was = instance.state if instance is not None else ""
    ttl = dt.timedelta(seconds=agent.lease_ttl_seconds)
    if instance is None:
        instance = Instance(agent=agent, endpoint=endpoint, state_changed_at=now,
                            reach_mode=reach_mode)
    elif instance.state == InstanceState.DRAINING and instance.remove_at is not None:
        # Deregistered, and registered again (a restart at the same endpoint): the agent
        # left and is back. An operator's drain (no remove_at) stays until lifted.
        instance.state, instance.state_changed_at, instance.remove_at = (
            InstanceState.HEALTHY, now, None)
    elif instance.state != InstanceState.DRAINING:
        liveness = health.on_heartbeat(_liveness(instance), now=now, ttl=ttl,
                                       lease_expires_at=instance.lease_expires_at)
        _set_liveness(instance, liveness)
    instance.last_heartbeat_at = now
    instance.lease_expires_at = now + ttl
    _clean(instance, "reach")
    instance.save()
    transition_record(instance, was=was, at=now, reason="registered")
    return instance


def _liveness(instance: Instance) -> health.Liveness:
    return health.Liveness(
        instance.state, instance.state_changed_at, instance.flaps, instance.last_flap_at
    )


def _set_liveness(instance: Instance, liveness: health.Liveness) -> None:
    instance.state = liveness.state
    instance.state_changed_at = liveness.state_changed_at
    instance.flaps = liveness.flaps
    instance.last_flap_at = liveness.last_flap_at


# ---- heartbeats and leases -------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat:
    load: health.Load
    capabilities_available: list[str] | None = None


@transaction.atomic
def instance_heartbeat(
    *, instance: Instance, heartbeat: Heartbeat, now: dt.datetime | None = None
) -> Instance:
    """Renew the lease and record load. Structural changes (state, tier, served
    capabilities, flaps) are published as a versioned delta at once; load
    figures alone go out unversioned, so heartbeats never queue on the counter."""
    now = now or timezone.now()
    agent = instance.agent
    # The row as of now, locked until the commit: a drain or deregistration committed
    # after the caller read it must not be written over with the state it read.
    instance = Instance.objects.select_for_update().select_related("agent").get(pk=instance.pk)
    ttl = dt.timedelta(seconds=agent.lease_ttl_seconds)
    before = (instance.state, instance.health_tier, list(instance.capabilities_available),
              instance.flaps)
    # Steady beats renew the lease in Redis before the database has it: the lapse (and
    # so a flap) is judged by the later of the two.
    lease = max(filter(None, (instance.lease_expires_at,
                              heartbeats.renewed_lease(instance.pk))), default=None)
    _set_liveness(instance, health.on_heartbeat(_liveness(instance), now=now, ttl=ttl,
                                                lease_expires_at=lease))
    load = heartbeat.load
    instance.health_tier = health.tier_from_load(load, current=instance.health_tier)
    if heartbeat.capabilities_available is not None:
        instance.capabilities_available = sorted(set(heartbeat.capabilities_available))
    instance.cpu, instance.memory = load.cpu, load.memory
    instance.queue_depth, instance.in_flight = load.queue_depth, load.in_flight
    instance.processed_recent, instance.errors_recent = load.processed_recent, load.errors_recent
    instance.last_heartbeat_at = now
    instance.lease_expires_at = now + ttl
    fields = [
        "state", "state_changed_at", "flaps", "last_flap_at", "health_tier",
        "capabilities_available", "cpu", "memory", "queue_depth", "in_flight",
        "processed_recent", "errors_recent", "last_heartbeat_at", "lease_expires_at",
    ]
    # update() rather than save(): no signal, so no versioned delta unless needed.
    Instance.objects.filter(pk=instance.pk).update(**{f: getattr(instance, f) for f in fields})
    after = (instance.state, instance.health_tier, list(instance.capabilities_available),
             instance.flaps)
    transition_record(instance, was=before[0], at=now, reason="heartbeat")
    _seed_steady(instance, ttl, now, was=before[0])
    if after != before:
        routes.changed("agent", agent.pk)
    else:
        transaction.on_commit(lambda: routes.load_reported(LoadReport(
            agent_pk=agent.pk, instance_pk=instance.pk, cpu=load.cpu, memory=load.memory,
            queue_depth=load.queue_depth, in_flight=load.in_flight,
            # The renewed lease travels with the load: routers drop an instance whose
            # lease has passed without waiting for the sweep.
            lease_expires_at=instance.lease_expires_at.timestamp(),
        )))
    return instance


def _seed_steady(instance: Instance, ttl: dt.timedelta, now: dt.datetime, *,
                 was: str) -> None:
    """After the commit, let the next beats of a healthy instance take the steady way."""
    if not heartbeats.enabled():
        return
    if instance.state != InstanceState.HEALTHY:
        # Its record went when it stopped being healthy (drain, sweep): a drained
        # instance's beats need not ask Redis again each time.
        if was == InstanceState.HEALTHY:
            heartbeats.forget_on_commit(instance.pk)
        return
    agent = instance.agent
    review = (instance.last_flap_at + 2 * ttl).timestamp() if instance.flaps else 0.0
    steady = heartbeats.Steady(
        pk=instance.pk, agent_pk=agent.pk, lease=instance.lease_expires_at.timestamp(),
        lease_ttl_s=agent.lease_ttl_seconds, interval_s=agent.heartbeat_interval_seconds,
        tier=instance.health_tier, capabilities=list(instance.capabilities_available),
        review=review)
    transaction.on_commit(lambda: heartbeats.seed(steady, now=now.timestamp()))


def instances_sweep(*, now: dt.datetime | None = None) -> dict[str, int]:
    """Apply the clock to every instance: expired leases -> unknown -> offline; deregistered
    instances past their drain grace are deleted. Returns counts by transition.

    The steady beats since the last sweep are written first, so a lease renewed only in
    Redis is not taken for a lapse. Each transition is a conditional update on the state
    it read, so a heartbeat landing between the read and the write wins and the sweep
    skips that row.
    """
    now = now or timezone.now()
    try:
        heartbeats.reseed_if_forgotten(now=now)
        heartbeats.forget_refused_tokens(now=now)
        heartbeats.flush()
    except Exception as exc:
        # Redis or the database away: the leases in the database are at most one
        # period behind, and heartbeats go to the view meanwhile.
        logger.warning("sweep: heartbeat flush failed (%s)", type(exc).__name__)
    counts = {"unknown": 0, "offline": 0, "removed": 0}
    candidates = Instance.objects.filter(
        state__in=[InstanceState.HEALTHY, InstanceState.UNKNOWN],
    ).filter(
        lease_expires_at__lte=now
    ).only("pk", "agent_id", "state", "state_changed_at", "flaps", "last_flap_at",
           "lease_expires_at")
    for instance in candidates:
        nxt = health.on_tick(_liveness(instance), lease_expires_at=instance.lease_expires_at,
                             now=now)
        if nxt.state == instance.state:
            continue
        with transaction.atomic():
            updated = Instance.objects.filter(pk=instance.pk, state=instance.state,
                                              lease_expires_at=instance.lease_expires_at).update(
                state=nxt.state, state_changed_at=nxt.state_changed_at,
            )
            if updated:
                counts[nxt.state] += 1
                was, instance.state = instance.state, nxt.state
                transition_record(instance, was=was, at=now, reason="lease lapsed")
                routes.changed("agent", instance.agent_id)
                heartbeats.forget_on_commit(instance.pk)
    # Deregistered and past the grace (calls routed to it may run that long), or drained
    # by an operator and no longer heartbeating.
    gone = Q(remove_at__lte=now) | Q(remove_at__isnull=True, lease_expires_at__lte=now)
    drained = Instance.objects.filter(gone, state=InstanceState.DRAINING)
    for instance in drained.only("pk", "agent_id"):
        with transaction.atomic():
            deleted, _ = Instance.objects.filter(
                gone, pk=instance.pk, state=InstanceState.DRAINING).delete()
            if deleted:
                counts["removed"] += 1
    counts["route_changes_pruned"] = routes.prune_changes()
    return counts


def transition_record(instance: Instance, *, was: str, at: dt.datetime, reason: str,
                      to: str | None = None) -> None:
    """Keep ``instance``'s change of state (``was`` -> ``to``, its current state by default)
    for the console's health history; nothing when the state did not change."""
    to = to or instance.state
    if was != to and instance.pk is not None:
        InstanceTransition.objects.create(
            agent_id=instance.agent_id, instance=instance, instance_pk=instance.pk,
            from_state=was or "", to_state=to, reason=reason, at=at)


def instance_drain(*, instance: Instance) -> Instance:
    """Stop new traffic to ``instance``; calls in flight finish. Draining twice is a no-op."""
    if instance.state != InstanceState.DRAINING:
        was, instance.state = instance.state, InstanceState.DRAINING
        instance.state_changed_at = timezone.now()
        instance.save(update_fields=["state", "state_changed_at"])
        transition_record(instance, was=was, at=instance.state_changed_at, reason="drained")
    return instance


def instance_resume(*, instance: Instance, now: dt.datetime | None = None) -> Instance:
    """Lift a drain: calls may be routed to ``instance`` again. Its lease decides as for
    any instance (one that stopped heartbeating gets no traffic). A deregistered
    instance cannot be resumed: the agent left; it comes back by registering."""
    if instance.state == InstanceState.DRAINING and instance.remove_at is None:
        instance.state = InstanceState.HEALTHY
        instance.state_changed_at = now or timezone.now()
        instance.save(update_fields=["state", "state_changed_at"])
        transition_record(instance, was=InstanceState.DRAINING, at=instance.state_changed_at,
                          reason="resumed")
    return instance


def instance_deregister(*, instance: Instance, now: dt.datetime | None = None) -> Instance:
    """Graceful exit: drain at once, delete after ``DRAIN_GRACE``."""
    now = now or timezone.now()
    if instance.state != InstanceState.DRAINING:
        instance.state_changed_at = now
        transition_record(instance, was=instance.state, to=InstanceState.DRAINING, at=now,
                          reason="deregistered")
    instance.state = InstanceState.DRAINING
    # Deregistering again does not push the removal further out.
    instance.remove_at = instance.remove_at or now + DRAIN_GRACE
    instance.save(update_fields=["state", "state_changed_at", "remove_at"])
    return instance


def instance_recover(*, instance: Instance, now: dt.datetime | None = None) -> bool:
    """A probe succeeded: an unknown or offline instance is healthy again with a fresh lease.

    Returns False when the instance changed state meanwhile (a heartbeat won)."""
    now = now or timezone.now()
    ttl = dt.timedelta(seconds=instance.agent.lease_ttl_seconds)
    liveness = health.on_heartbeat(_liveness(instance), now=now, ttl=ttl)
    with transaction.atomic():
        updated = Instance.objects.filter(pk=instance.pk, state=instance.state).update(
            state=liveness.state, state_changed_at=liveness.state_changed_at,
            flaps=liveness.flaps, last_flap_at=liveness.last_flap_at,
            lease_expires_at=now + ttl,
        )
        if updated:
            transition_record(instance, was=instance.state, to=liveness.state, at=now,
                              reason="probe answered")
            routes.changed("agent", instance.agent_id)
            heartbeats.forget_on_commit(instance.pk)
    return bool(updated)
