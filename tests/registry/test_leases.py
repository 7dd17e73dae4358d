"""Leases and health on an injected clock: no test sleeps through a TTL."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys

import pytest
from django.utils import timezone

from registry.health import Load
from registry.models import Instance
from registry.probe import instances_probe
from registry.services import Heartbeat, instance_heartbeat, instances_sweep
from registry.snapshot import build_table
from tenants.choices import ApiKeyScope
from tests import factories
from tests.support.servers import ROOT
from tests.support.waiting import wait_for

TTL = dt.timedelta(seconds=30)


def _start_agent(control_url: str, key: str, *extra: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.agents.registered_agent", control_url, key, *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"agent did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc, json.loads(line[len("READY "):])


@pytest.fixture
def registration_key(transactional_db):
    factories.seed_defaults()
    tenant = factories.tenant()
    return factories.api_key(tenant=tenant, scopes=[ApiKeyScope.REGISTER]).plaintext


def test_a_killed_agent_goes_unknown_then_offline(live_server, registration_key):
    proc, ready = _start_agent(live_server.url, registration_key)
    try:
        instance = Instance.objects.get(pk=ready["instance"])
        first = instance.last_heartbeat_at
        # Heartbeats arrive over real HTTP: wait for two more than registration's.
        wait_for(lambda: Instance.objects.filter(
            pk=instance.pk, last_heartbeat_at__gt=first).exists(), timeout=20,
            message="a heartbeat after registration's")
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    instance.refresh_from_db()
    assert instance.state == "healthy" and instance.cpu == pytest.approx(0.1)
    last = instance.last_heartbeat_at
    assert instances_sweep(now=last + TTL - dt.timedelta(seconds=1))["unknown"] == 0
    assert instances_sweep(now=last + TTL)["unknown"] == 1
    instance.refresh_from_db()
    assert instance.state == "unknown"
    table = build_table()
    entry = table.agents[instance.agent_id].instances[0]
    # Kept in the table (its place is not lost), but probes only: no caller traffic.
    assert entry.state == "unknown" and entry.weight_factor == 0.0
    assert instances_sweep(now=last + TTL + dt.timedelta(seconds=29))["offline"] == 0
    assert instances_sweep(now=last + TTL + dt.timedelta(seconds=30))["offline"] == 1
    instance.refresh_from_db()
    assert instance.state == "offline"
    # The process is dead: probing finds nobody, the instance stays offline.
    assert instances_probe(now=last + TTL * 3)["recovered"] == 0


def test_a_probe_brings_a_silent_but_alive_instance_back(live_server, registration_key):
    proc, ready = _start_agent(live_server.url, registration_key, "--no-heartbeat")
    try:
        instance = Instance.objects.get(pk=ready["instance"])
        registered = instance.last_heartbeat_at
        instances_sweep(now=registered + TTL)
        instances_sweep(now=registered + TTL * 2)
        instance.refresh_from_db()
        assert instance.state == "offline"
        counts = instances_probe(now=registered + TTL * 2 + dt.timedelta(seconds=1))
        assert counts == {"probed": 1, "recovered": 1}
        instance.refresh_from_db()
        assert instance.state == "healthy"
        assert instance.lease_expires_at > registered + TTL * 2
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.django_db
def test_a_flapping_instance_keeps_its_place_with_lowered_weight(world):
    instance = factories.instance(agent=world.agent_a)
    now = timezone.now()
    instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load()), now=now)
    factors = []
    for _ in range(3):
        now += TTL  # a missed lease...
        instances_sweep(now=now)
        instance.refresh_from_db()
        assert instance.state == "unknown"
        now += dt.timedelta(seconds=5)  # ...and back within 2 x TTL: a flap
        instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load()), now=now)
        instance.refresh_from_db()
        assert instance.state == "healthy"
        entry = build_table().agents[world.agent_a.pk].instances[0]
        factors.append(entry.weight_factor)
    assert factors == [0.5, 0.25, 0.125]
    # Steady for more than 2 x TTL: forgiven.
    for _ in range(8):
        now += dt.timedelta(seconds=10)
        instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load()), now=now)
    assert build_table().agents[world.agent_a.pk].instances[0].weight_factor == 1.0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("load", "tier", "factor"),
    [
        (Load(cpu=0.2, memory=0.3), "healthy", 1.0),
        (Load(cpu=0.95), "overloaded", 0.5),
        (Load(queue_depth=80), "overloaded", 0.5),
        (Load(in_flight=4, processed_recent=0), "sub_healthy", 0.0),
        (Load(processed_recent=10, errors_recent=7), "sub_healthy", 0.0),
    ],
)
def test_health_tiers_from_load(world, load, tier, factor):
    instance = factories.instance(agent=world.agent_a)
    instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=load))
    instance.refresh_from_db()
    assert instance.health_tier == tier
    assert build_table().agents[world.agent_a.pk].instances[0].weight_factor == factor


@pytest.mark.django_db
def test_capability_level_health_from_heartbeats(world, published,
                                                 django_capture_on_commit_callbacks):
    factories.capability(agent=world.agent_a, capability_id="a.one")
    factories.capability(agent=world.agent_a, capability_id="a.two")
    instance = factories.instance(agent=world.agent_a)
    with django_capture_on_commit_callbacks(execute=True):
        instance_heartbeat(instance=instance, heartbeat=Heartbeat(
            load=Load(), capabilities_available=["a.one"]))
    entry = build_table().agents[world.agent_a.pk].instances[0]
    assert entry.serves("a.one") and not entry.serves("a.two")
    assert published[-1]["type"] == "delta"  # a structural change: versioned, at once
    with django_capture_on_commit_callbacks(execute=True):
        instance_heartbeat(instance=instance, heartbeat=Heartbeat(
            load=Load(cpu=0.4), capabilities_available=["a.one"]))
    assert published[-1]["type"] == "load"  # load only: unversioned
    assert published[-1]["cpu"] == 0.4


@pytest.mark.django_db
def test_graceful_deregistration_drains_then_removes(world):
    from registry.services import DRAIN_GRACE, instance_deregister

    instance = factories.instance(agent=world.agent_a)
    now = timezone.now()
    instance_deregister(instance=instance, now=now)
    instance.refresh_from_db()
    assert instance.state == "draining"
    assert build_table().agents[world.agent_a.pk].instances[0].weight_factor == 0.0
    assert instances_sweep(now=now + DRAIN_GRACE - dt.timedelta(seconds=1))["removed"] == 0
    assert instances_sweep(now=now + DRAIN_GRACE)["removed"] == 1
    assert not Instance.objects.filter(pk=instance.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_the_in_process_scheduler_runs_the_sweep(world):
    """The embedded mode's scheduler calls the same job functions Celery beat would."""
    import threading

    from reach_platform.scheduler import InProcessScheduler

    instance = factories.instance(agent=world.agent_a)
    Instance.objects.filter(pk=instance.pk).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    swept = threading.Event()

    def sweep():
        instances_sweep()
        swept.set()

    scheduler = InProcessScheduler({"sweep": (0.05, sweep)})
    scheduler.start()
    try:
        assert swept.wait(10)
    finally:
        scheduler.stop()
    instance.refresh_from_db()
    assert instance.state == "unknown"


def test_celery_beat_schedules_the_registry_jobs():
    from reach_platform.celery import app

    app.loader.import_default_modules()
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert {"registry.sweep_leases", "registry.probe_instances"} <= scheduled
    assert scheduled <= set(app.tasks)


# ---- leases reach the route table ------------------------------------------------------


@pytest.mark.django_db
def test_the_lease_expiry_travels_with_the_snapshot_and_the_load_report(
        world, published, django_capture_on_commit_callbacks):
    from routing.router import Router, RouteRequest

    factories.capability(agent=world.agent_a, capability_id="a.one")
    instance = factories.instance(agent=world.agent_a)
    now = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load()), now=now)
    table = build_table()
    entry = table.agents[world.agent_a.pk].instances[0]
    assert entry.lease_expires_at == pytest.approx((now + TTL).timestamp())
    later = now + dt.timedelta(seconds=10)
    with django_capture_on_commit_callbacks(execute=True):
        instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load(cpu=0.2)), now=later)
    assert published[-1]["type"] == "load"
    assert published[-1]["lease_expires_at"] == pytest.approx((later + TTL).timestamp())

    request = RouteRequest(tenant_pk=world.tenant_a.pk, capability="a.one")
    lapsed = Router(clock=lambda: (now + TTL + dt.timedelta(seconds=2)).timestamp())
    assert lapsed.route(table, request).error == "no_healthy_instance"
    from routing.table import load_from_wire
    renewed = table.apply_load(load_from_wire(published[-1]))
    assert lapsed.route(renewed, request).chosen.instance.pk == instance.pk


@pytest.mark.django_db
def test_a_heartbeat_after_a_lapse_the_sweep_missed_is_a_flap(world):
    """Jitter protection without the sweep: the instance keeps its place, weight halved."""
    instance = factories.instance(agent=world.agent_a)
    now = timezone.now()
    instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load()), now=now)
    instance.refresh_from_db()
    now += TTL + dt.timedelta(seconds=5)  # lapsed, no sweep ran: still "healthy"
    assert instance.state == "healthy"
    instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load()), now=now)
    instance.refresh_from_db()
    assert instance.state == "healthy" and instance.flaps == 1
    entry = build_table().agents[world.agent_a.pk].instances[0]
    assert entry.weight_factor == 0.5
    assert entry.lease_expires_at == pytest.approx((now + TTL).timestamp())
    # Back long after 2 x TTL: not a flap, just alive again.
    now += TTL * 4
    instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load()), now=now)
    instance.refresh_from_db()
    assert instance.flaps == 0 and instance.state == "healthy"


# ---- drains and deregistrations hold against heartbeats ---------------------------------


@pytest.mark.django_db
def test_a_drain_committed_after_a_heartbeat_read_the_row_holds(world):
    """The interleaving a break test found: the heartbeat's view has read the instance
    (healthy), a drain commits, then the heartbeat writes. The drain must win."""
    from registry.services import instance_drain

    instance = factories.instance(agent=world.agent_a)
    read_by_the_heartbeat = Instance.objects.get(pk=instance.pk)
    instance_drain(instance=Instance.objects.get(pk=instance.pk))
    instance_heartbeat(instance=read_by_the_heartbeat,
                       heartbeat=Heartbeat(load=Load(cpu=0.95)))  # a tier change, too
    instance.refresh_from_db()
    assert instance.state == "draining"
    assert build_table().agents[world.agent_a.pk].instances[0].state == "draining"


@pytest.mark.django_db
def test_a_deregistered_instance_goes_after_the_grace_however_it_heartbeats(world):
    from registry.services import DRAIN_GRACE, instance_deregister

    instance = factories.instance(agent=world.agent_a)
    now = timezone.now()
    instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load()), now=now)
    instance_deregister(instance=Instance.objects.get(pk=instance.pk), now=now)
    for beat in (10, 20, 29):
        instance_heartbeat(instance=instance, heartbeat=Heartbeat(load=Load()),
                           now=now + dt.timedelta(seconds=beat))
    # Deregistering again does not push the removal out.
    instance_deregister(instance=Instance.objects.get(pk=instance.pk),
                        now=now + dt.timedelta(seconds=29))
    assert instances_sweep(now=now + DRAIN_GRACE - dt.timedelta(seconds=1))["removed"] == 0
    assert instances_sweep(now=now + DRAIN_GRACE)["removed"] == 1
    assert not Instance.objects.filter(pk=instance.pk).exists()


@pytest.mark.django_db
def test_registering_again_after_deregistering_is_back_but_a_drain_stays(world):
    from registry.services import agent_register, instance_deregister, instance_drain
    from registry.spec import AgentSpec, CapabilitySpec

    def register(endpoint: str):
        return agent_register(tenant=world.tenant_a, spec=AgentSpec(
            name="restarting", endpoint=endpoint,
            capabilities=(CapabilitySpec(capability_id="restart.me"),))).instance

    left = register("http://127.0.0.1:9501/")
    instance_deregister(instance=left)
    back = register("http://127.0.0.1:9501/")
    assert back.pk == left.pk and back.state == "healthy" and back.remove_at is None

    drained = register("http://127.0.0.1:9502/")
    instance_drain(instance=drained)
    again = register("http://127.0.0.1:9502/")
    assert again.state == "draining"  # the operator's decision, not the agent's
