"""The route table end to end: built from the database, kept current by deltas."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import orjson
import pytest
from django.conf import settings

from registry.health import Load
from registry.models import Agent, Instance
from registry.services import Heartbeat, agent_register, instance_heartbeat
from registry.snapshot import build_table, changes_since, current_version, entry_for
from registry.spec import AgentSpec, CapabilitySpec
from routing.subscriber import RouteTableSubscriber
from routing.table import table_from_wire
from tenants.models import ApiKey
from tenants.services import api_key_revoke
from tests import factories
from tests.support.forwarder import Forwarder
from tests.support.servers import ROOT, platform_env
from tests.support.waiting import wait_for

SECRET = "sk-downstream-do-not-persist"


def spec(name: str, port: int, *capability_ids: str) -> AgentSpec:
    return AgentSpec(
        name=name, endpoint=f"http://127.0.0.1:{port}/",
        capabilities=tuple(CapabilitySpec(capability_id=c) for c in capability_ids),
    )


@pytest.mark.django_db
def test_deltas_replayed_on_a_start_snapshot_equal_a_fresh_build(
    world, published, django_capture_on_commit_callbacks
):
    subscriber = RouteTableSubscriber(loader=build_table)
    subscriber.start()
    start_version = subscriber.table.version
    with django_capture_on_commit_callbacks(execute=True):
        registration = agent_register(tenant=world.tenant_a, spec=spec("x", 9301, "a.b", "a.c"))
    with django_capture_on_commit_callbacks(execute=True):
        agent_register(tenant=world.tenant_a, spec=spec("x", 9302, "a.b"))  # cap gone, + instance
    with django_capture_on_commit_callbacks(execute=True):
        instance_heartbeat(instance=registration.instance,
                           heartbeat=Heartbeat(load=Load(cpu=0.99)))  # tier change
    with django_capture_on_commit_callbacks(execute=True):
        issued = factories.api_key(tenant=world.tenant_b)
    with django_capture_on_commit_callbacks(execute=True):
        api_key_revoke(api_key=issued.api_key)
    with django_capture_on_commit_callbacks(execute=True):
        factories.credential(tenant=world.tenant_a, agent=world.agent_a, secret=SECRET)
    with django_capture_on_commit_callbacks(execute=True):
        moved = factories.capability(agent=world.agent_a, capability_id="a.moved")
    with django_capture_on_commit_callbacks(execute=True):
        moved.agent = registration.agent  # moved: the agent it left is published too
        moved.save()
    with django_capture_on_commit_callbacks(execute=True):
        Agent.objects.filter(pk=world.agent_b.pk).delete()

    versions = [m["version"] for m in published if m["type"] == "delta"]
    assert versions == list(range(start_version + 1, start_version + 1 + len(versions)))
    for message in published:
        subscriber.handle(message)
    assert subscriber.reloads == 1  # every delta applied in order, no reload needed
    fresh = build_table()
    assert subscriber.table == fresh
    agent = fresh.agents[registration.agent.pk]
    assert [c.capability_id for c in agent.capabilities] == ["a.b", "a.moved"]
    assert "a.moved" not in [c.capability_id for c in fresh.agents[world.agent_a.pk].capabilities]
    assert [i.health_tier for i in agent.instances] == ["overloaded", "healthy"]
    assert world.agent_b.pk not in fresh.agents
    assert issued.api_key.pk not in fresh.api_keys  # revoked keys leave the data plane


@pytest.mark.django_db
def test_a_subscriber_that_missed_versions_catches_up_from_the_change_log(
    world, django_capture_on_commit_callbacks
):
    subscriber = RouteTableSubscriber(loader=build_table, current_version=current_version,
                                      changes_since=changes_since)
    subscriber.start()
    with django_capture_on_commit_callbacks(execute=True):  # every delta lost
        registration = agent_register(tenant=world.tenant_a, spec=spec("y", 9311, "y.a"))
    with django_capture_on_commit_callbacks(execute=True):
        agent_register(tenant=world.tenant_a, spec=spec("y", 9312, "y.b"))
    with django_capture_on_commit_callbacks(execute=True):
        issued = factories.api_key(tenant=world.tenant_b)
    with django_capture_on_commit_callbacks(execute=True):
        api_key_revoke(api_key=issued.api_key)
    with django_capture_on_commit_callbacks(execute=True):
        Agent.objects.filter(pk=world.agent_b.pk).delete()

    subscriber.check()

    assert (subscriber.reloads, subscriber.catch_ups) == (1, 1)
    assert subscriber.table == build_table()
    assert [c.capability_id for c in
            subscriber.table.agents[registration.agent.pk].capabilities] == ["y.b"]
    assert world.agent_b.pk not in subscriber.table.agents


@pytest.mark.django_db
def test_the_change_log_keeps_the_last_versions_and_older_gaps_reload(world):
    from registry import routes
    from registry.models import RouteChange

    subscriber = RouteTableSubscriber(loader=build_table, current_version=current_version,
                                      changes_since=changes_since)
    subscriber.start()
    for n in range(3):
        agent_register(tenant=world.tenant_a, spec=spec(f"z{n}", 9320 + n, f"z.{n}"))
        routes.flush()
    now = current_version()
    RouteChange.KEEP, keep = 2, RouteChange.KEEP
    try:
        pruned = routes.prune_changes()
    finally:
        RouteChange.KEEP = keep
    assert sorted(RouteChange.objects.values_list("version", flat=True)) == [now - 1, now]
    assert pruned > 0
    assert changes_since(now - 1) is not None and changes_since(now - 3) is None

    subscriber.check()  # behind by more than the log keeps
    assert (subscriber.reloads, subscriber.catch_ups) == (2, 0)
    assert subscriber.table == build_table()


@pytest.mark.django_db
def test_the_whole_table_builds_each_agent_as_a_single_change_does(world):
    """``build_table`` reads plain rows in bulk, a delta one agent through the ORM: the
    entries must be the same."""
    busy = factories.agent(owner=world.tenant_a, weight=7, priority=2,
                           price_per_call="0.25", description="busy one")
    factories.capability(agent=busy, capability_id="busy.one", keywords=["x", "y"],
                         input_schema={"type": "object", "required": ["a"]},
                         adapter={"request": {"text": "$.a"}}, directions=["en->zh"])
    factories.capability(agent=busy, capability_id="busy.two", max_input_chars=10)
    factories.instance(agent=busy, capabilities_available=["busy.one"], flaps=2,
                       state="unknown", health_tier="overloaded", cpu=0.9)
    factories.instance(agent=busy)
    table = build_table()
    assert set(table.agents) == set(Agent.objects.values_list("pk", flat=True))
    for pk in table.agents:
        assert table.agents[pk] == entry_for("agent", pk)


@pytest.mark.django_db
def test_snapshots_hold_key_hashes_and_ciphertext_never_secrets(world, tmp_path):
    issued = factories.api_key(tenant=world.tenant_a)
    factories.credential(tenant=world.tenant_a, agent=world.agent_a, secret=SECRET)
    subscriber = RouteTableSubscriber(loader=build_table, snapshot_path=tmp_path / "r.json")
    subscriber.start()
    data = (tmp_path / "r.json").read_bytes()
    assert issued.api_key.key_hash.encode() in data
    assert SECRET.encode() not in data and issued.plaintext.encode() not in data
    assert table_from_wire(orjson.loads(data)["table"]) == subscriber.table


@pytest.mark.django_db
def test_expired_keys_carry_their_expiry(world):
    import datetime as dt

    from django.utils import timezone

    issued = factories.api_key(tenant=world.tenant_a)
    when = timezone.now() + dt.timedelta(days=1)
    ApiKey.objects.filter(pk=issued.api_key.pk).update(expires_at=when)
    entry = build_table().api_keys_by_prefix[issued.api_key.prefix]
    assert entry.expires_at == pytest.approx(when.timestamp())


# ---- a separate process, real PostgreSQL and Redis ---------------------------------------

needs_services = pytest.mark.skipif(
    not (settings.DATABASES["default"]["ENGINE"].endswith("postgresql") and settings.REDIS_URL),
    reason="runs against the real PostgreSQL and Redis (.ci/run sets DATABASE_URL, REDIS_URL)",
)


class Watcher:
    """``manage.py reach_routes`` in a subprocess: a gateway's subscriber, observable."""

    def __init__(self, snapshot, env) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "reach_routes", "--snapshot", str(snapshot)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )

    def next_line(self, predicate, timeout: float = 30.0) -> dict:
        """Read lines until one satisfies ``predicate``. Bounded by ``timeout``."""
        import selectors

        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=deadline - time.monotonic()):
                    break
                raw = self.proc.stdout.readline()
                if not raw:
                    break
                line = json.loads(raw)
                if predicate(line):
                    return line
        raise TimeoutError("watcher did not report the expected state")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


@needs_services
def test_a_separate_process_follows_changes_and_survives_postgres_going_away(
    transactional_db, tmp_path
):
    db = settings.DATABASES["default"]
    # The watchers reach PostgreSQL through a forwarder this test owns: cutting it takes
    # the database away from them alone, while this process keeps using it directly.
    postgres = Forwarder(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))
    env = platform_env(
        tmp_path,
        DATABASE_URL=f"postgres://{db['USER']}@127.0.0.1:{postgres.port}/{db['NAME']}",
        REDIS_URL=settings.REDIS_URL,
        REACH_REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX,
        REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS),
        REACH_ROUTES_SNAPSHOT_EVERY_S="0",  # every change written: the test reads the file
    )
    factories.seed_defaults()
    tenant = factories.tenant()
    snapshot = tmp_path / "routes.json"
    watcher = Watcher(snapshot, env)
    cold = None
    try:
        watcher.next_line(lambda line: line["event"] == "start")
        agent_register(tenant=tenant, spec=spec("follow-me", 9401, "x.y"))
        endpoint = "http://127.0.0.1:9401/"
        seen = watcher.next_line(lambda line: endpoint in line["instances"])
        assert seen["instances"][endpoint] == "healthy"
        wait_for(lambda: snapshot.exists() and endpoint.encode() in snapshot.read_bytes(),
                 timeout=10, interval=0.1, message="the snapshot to be persisted")
        assert postgres.accepted, "the watcher does not reach PostgreSQL via the forwarder"

        with postgres.outage():
            # A delta from the future: the watcher must reload, cannot, keeps serving.
            from reach_platform.bus import route_bus

            route_bus().publish({"type": "delta", "version": seen["version"] + 5,
                                 "kind": "tenant", "op": "delete", "pk": 0, "entry": None})
            failed = watcher.next_line(lambda line: line["event"] == "reload_failed")
            assert failed["instances"] == {endpoint: "healthy"} and failed["stale"]
            # A process starting now finds no database: it cold-starts from the file.
            cold = Watcher(snapshot, env)
            started = cold.next_line(lambda line: line["event"] == "start")
            assert started["instances"] == {endpoint: "healthy"}
            assert started["version"] == seen["version"]
        # Back up: the stale watcher reconciles on its own.
        recovered = watcher.next_line(lambda line: line["event"] == "change" and not line["stale"])
        assert endpoint in recovered["instances"]
        assert Instance.objects.filter(endpoint=endpoint).exists()
    finally:
        watcher.close()
        if cold is not None:
            cold.close()
        postgres.close()
