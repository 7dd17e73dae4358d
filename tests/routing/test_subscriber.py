"""The subscriber alone: a loader that is a plain function, no database."""

from __future__ import annotations

import time
from dataclasses import replace

import orjson
import pytest

from routing.subscriber import RouteTableSubscriber
from routing.table import (
    AgentEntry,
    CapabilityEntry,
    Delta,
    InstanceEntry,
    LoadReport,
    RouteTable,
    delta_to_wire,
    load_to_wire,
    table_from_wire,
    table_to_json,
)


def agent(pk: int, *, version: str = "1.0.0", endpoint: str | None = None) -> AgentEntry:
    return AgentEntry(
        pk=pk, namespace="default", name=f"agent-{pk}", owner_tenant_pk=1, version=version,
        capabilities=(CapabilityEntry(pk=pk * 10, capability_id=f"cap.{pk}",
                                      input_schema={"type": "object"}),),
        instances=(InstanceEntry(pk=pk * 100, agent_pk=pk,
                                 endpoint=endpoint or f"http://127.0.0.1:{9000 + pk}/"),),
    )


class Source:
    """The source of truth as the subscriber sees it: a table, a version, and an outage switch."""

    def __init__(self) -> None:
        self.table = RouteTable(version=0)
        self.down = False
        self.loads = 0

    def upsert(self, entry: AgentEntry) -> dict:
        delta = Delta(version=self.table.version + 1, kind="agent", op="upsert", pk=entry.pk,
                      entry=entry)
        self.table = self.table.apply(delta)
        return delta_to_wire(delta)

    def load(self) -> RouteTable:
        if self.down:
            raise ConnectionError("database unreachable")
        self.loads += 1
        return self.table

    def version(self) -> int:
        if self.down:
            raise ConnectionError("database unreachable")
        return self.table.version


@pytest.fixture
def source() -> Source:
    return Source()


def make(source: Source, path=None, identity: str = "db-a") -> RouteTableSubscriber:
    return RouteTableSubscriber(loader=source.load, current_version=source.version,
                                snapshot_path=path, identity=identity)


def test_deltas_apply_in_order_without_reloading(source):
    sub = make(source)
    sub.start()
    for pk in (1, 2, 3):
        sub.handle(source.upsert(agent(pk)))
    assert sub.table.version == 3 and set(sub.table.agents) == {1, 2, 3}
    assert sub.reloads == 1  # the start only
    assert sub.table.agents_by_capability["cap.2"] == (2,)


def test_an_old_or_duplicate_delta_is_ignored(source):
    sub = make(source)
    sub.start()
    first = source.upsert(agent(1, version="1.0.0"))
    second = source.upsert(agent(1, version="2.0.0"))
    sub.handle(first)
    sub.handle(second)
    sub.handle(first)
    assert sub.table.agents[1].version == "2.0.0" and sub.table.version == 2


def test_a_gap_triggers_a_full_reload(source):
    sub = make(source)
    sub.start()
    source.upsert(agent(1))  # lost on the way
    sub.handle(source.upsert(agent(2)))
    assert sub.reloads == 2
    assert sub.table.version == 2 and set(sub.table.agents) == {1, 2}


class ChangeLog:
    """``changes_since`` over a ``Source``: the rows changed after a version, as deltas
    stamped with the current one; None for versions older than what it ``keeps``."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.changed: dict[int, int] = {}  # version -> agent pk
        self.keeps_from = 1
        self.asked: list[int] = []

    def upsert(self, entry: AgentEntry) -> dict:
        message = self.source.upsert(entry)
        self.changed[message["version"]] = entry.pk
        return message

    def __call__(self, version: int):
        self.asked.append(version)
        now = self.source.table.version
        if version + 1 < self.keeps_from:
            return None
        rows = sorted({pk for v, pk in self.changed.items() if version < v <= now})
        return now, [Delta(version=now, kind="agent", op="upsert", pk=pk,
                           entry=self.source.table.agents[pk]) for pk in rows]


def test_a_gap_is_closed_with_the_rows_changed_since_not_a_reload(source):
    log = ChangeLog(source)
    sub = RouteTableSubscriber(loader=source.load, current_version=source.version,
                               changes_since=log)
    sub.start()
    log.upsert(agent(1))  # lost on the way
    log.upsert(agent(2, version="1.0.0"))  # lost too
    log.upsert(agent(2, version="2.0.0"))  # ... and changed again
    sub.handle(log.upsert(agent(3)))

    assert (sub.reloads, sub.catch_ups, log.asked) == (1, 1, [0])
    assert sub.table == source.table  # what a reload would have given
    assert sub.table.agents[2].version == "2.0.0" and sub.table.version == 4

    log.upsert(agent(4))  # the last message of a burst lost: the periodic check
    sub.check()
    assert (sub.reloads, sub.catch_ups, sub.table.version) == (1, 2, 5)
    assert sub.table == source.table


def test_a_gap_older_than_the_change_log_reloads_the_whole_table(source):
    log = ChangeLog(source)
    sub = RouteTableSubscriber(loader=source.load, current_version=source.version,
                               changes_since=log)
    sub.start()
    log.upsert(agent(1))
    log.keeps_from = 2  # version 1's row was pruned
    sub.handle(log.upsert(agent(2)))
    assert (sub.reloads, sub.catch_ups) == (2, 0)
    assert sub.table == source.table


def test_a_lost_last_message_is_caught_by_the_periodic_check(source):
    sub = make(source)
    sub.start()
    source.upsert(agent(1))  # lost, and nothing follows it
    sub.check()
    assert sub.table.version == 1 and 1 in sub.table.agents


def test_the_last_good_table_keeps_serving_when_the_source_is_down(source):
    sub = make(source)
    sub.start()
    sub.handle(source.upsert(agent(1)))
    source.down = True
    source.upsert(agent(2))
    sub.handle(source.upsert(agent(3)))  # a gap, and the reload fails
    sub.check()
    assert sub.failures == 2
    assert sub.table.version == 1 and set(sub.table.agents) == {1}
    source.down = False
    sub.check()
    assert sub.table.version == 3 and set(sub.table.agents) == {1, 2, 3}


def test_cold_start_from_the_snapshot_file(source, tmp_path):
    path = tmp_path / "routes.json"
    first = make(source, path)
    first.start()
    first.handle(source.upsert(agent(1)))
    first.handle(source.upsert(agent(2, endpoint="http://[::1]:9002/")))
    first.persist_if_dirty()
    source.down = True
    second = make(source, path)
    second.start()
    assert second.table == first.table
    assert second.stale  # served, but known to need a reload
    assert second.table.agents[2].instances[0].endpoint == "http://[::1]:9002/"
    source.down = False
    second.handle(source.upsert(agent(3)))
    assert set(second.table.agents) == {1, 2, 3} and not second.stale


def test_a_snapshot_written_for_another_database_is_never_served(source, tmp_path):
    path = tmp_path / "routes.json"
    first = make(source, path, identity="db-a")
    first.start()
    first.handle(source.upsert(agent(1)))
    first.persist_if_dirty()
    assert path.exists()
    source.down = True

    foreign = make(source, path, identity="db-b")

    assert foreign.start() == RouteTable()
    assert foreign.stale
    # The same database's next process does use it.
    assert set(make(source, path, identity="db-a").start().agents) == {1}


def test_a_snapshot_without_an_identity_is_refused(source, tmp_path):
    path = tmp_path / "routes.json"
    path.write_text('{"version": 3, "agents": []}')  # the format before identities
    source.down = True
    assert make(source, path).start() == RouteTable()


def test_a_torn_snapshot_file_is_ignored(source, tmp_path):
    path = tmp_path / "routes.json"
    path.write_text('{"version": 3, "agents": [')
    source.down = True
    sub = make(source, path)
    assert sub.start() == RouteTable()


def test_load_reports_change_figures_without_a_version(source):
    sub = make(source)
    sub.start()
    sub.handle(source.upsert(agent(1)))
    sub.handle(load_to_wire(LoadReport(agent_pk=1, instance_pk=100, cpu=0.7, memory=0.2,
                                       queue_depth=3, in_flight=1)))
    inst = sub.table.current(sub.table.agents[1].instances[0])
    assert (inst.cpu, inst.queue_depth, sub.table.version) == (0.7, 3, 1)
    # a report for an instance that is not there changes nothing
    sub.handle(load_to_wire(LoadReport(agent_pk=9, instance_pk=9, cpu=1, memory=1,
                                       queue_depth=1, in_flight=1)))
    assert set(sub.table.agents) == {1}


def test_a_load_report_costs_one_write_not_a_new_table(source, tmp_path):
    """Heartbeats arrive at fleet rate: applying one must not copy the table, re-index
    it, wake the listeners (intent index, pools) or dirty the snapshot."""
    sub = make(source, tmp_path / "routes.json")
    sub.start()
    sub.handle(source.upsert(agent(1)))
    sub.handle(source.upsert(agent(2)))
    swaps: list[RouteTable] = []
    sub.on_change(swaps.append)
    before = sub.table
    sub.persist_if_dirty()

    for n in range(50):
        sub.handle(load_to_wire(LoadReport(agent_pk=1, instance_pk=100, cpu=n / 100,
                                           memory=0.1, queue_depth=n, in_flight=0,
                                           lease_expires_at=1000.0 + n)))

    assert sub.table is before and swaps == [] and not sub._dirty
    assert sub.table.current(before.agents[1].instances[0]).queue_depth == 49
    # A delta for another agent swaps the table; the heartbeats seen so far still count.
    sub.handle(source.upsert(agent(3)))
    assert sub.table is not before
    assert sub.table.current(sub.table.agents[1].instances[0]).lease_expires_at == 1049.0


def test_a_report_older_than_the_row_does_not_roll_it_back(source):
    sub = make(source)
    sub.start()
    sub.handle(source.upsert(agent(1)))
    sub.handle(load_to_wire(LoadReport(agent_pk=1, instance_pk=100, cpu=0.9, memory=0.9,
                                       queue_depth=40, in_flight=9, lease_expires_at=500.0)))
    row = replace(sub.table.agents[1].instances[0], lease_expires_at=600.0, queue_depth=1)

    assert sub.table.current(row) is row


def test_wire_round_trip_preserves_every_field(source):
    for pk in (1, 2):
        source.upsert(agent(pk))
    assert table_from_wire(orjson.loads(table_to_json(source.table))) == source.table


def test_a_capability_field_since_removed_is_dropped_on_the_way_in(source):
    # A snapshot file, or a delta from a control plane not yet upgraded, still carries it.
    source.upsert(agent(1))
    wire = orjson.loads(table_to_json(source.table))
    wire["agents"][0]["capabilities"][0]["method"] = "POST"
    assert table_from_wire(wire) == source.table


def test_entries_are_immutable():
    entry = agent(1)
    with pytest.raises(AttributeError):
        entry.name = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        entry.capabilities[0].input_schema["type"] = "array"  # type: ignore[index]
    # Lists handed in (an ORM row's JSON) are copied into tuples, not kept.
    keywords = ["a"]
    capability = CapabilityEntry(pk=1, capability_id="c", keywords=keywords)
    keywords.append("b")
    assert capability.keywords == ("a",)


def test_leases_are_judged_as_of_the_moment_the_process_was_cut_off():
    """An outage of the gateway's own (database, bus) must not look like every agent
    dying: while cut off, the lease clock stands still; once both answer it runs again."""
    from routing.subscriber import RouteTableSubscriber

    subscriber = RouteTableSubscriber(loader=lambda: (_ for _ in ()).throw(OSError("down")))
    assert subscriber.cut_off_since is None
    before = time.time()
    subscriber.reload()  # the source of truth is unreachable
    frozen = subscriber.cut_off_since
    assert frozen is not None and frozen >= before
    assert subscriber.lease_clock() == frozen
    subscriber.cut_off("bus")
    subscriber.reconnected("source")
    assert subscriber.lease_clock() == frozen  # the bus is still away
    subscriber.reconnected("bus")
    assert subscriber.cut_off_since is None and subscriber.lease_clock() >= frozen


def test_after_a_bus_outage_leases_come_from_the_source_before_the_clock_resumes(source):
    """Heartbeats went on while this process could not hear their load reports; the
    source of truth has the leases they renewed. Judged by the clock before a reload,
    every instance would look lapsed (a break test saw the fleet refused for seconds)."""
    from routing.table import LoadReport, load_to_wire

    def lease(sub) -> float:
        return sub.table.current(sub.table.agents[1].instances[0]).lease_expires_at

    now = time.time()
    stale = replace(agent(1).instances[0], lease_expires_at=now - 5)
    source.upsert(replace(agent(1), instances=(stale,)))
    sub = make(source)
    sub.start()
    sub.handle(load_to_wire(LoadReport(agent_pk=1, instance_pk=100, cpu=0.1, memory=0.1,
                                       queue_depth=0, in_flight=0, lease_expires_at=now - 5)))
    sub.cut_off("bus", since=now - 20)  # the bus went away 20 s ago
    assert lease(sub) == now - 5 and sub.lease_clock() == now - 20
    # Meanwhile the heartbeats reached the database: leases only, so no new version.
    renewed = replace(agent(1), instances=(replace(stale, lease_expires_at=now + 25),))
    source.table = source.table.apply(Delta(version=source.table.version, kind="agent",
                                            op="upsert", pk=1, entry=renewed))
    sub.bus_connected()
    assert sub.cut_off_since is None
    assert lease(sub) == now + 25 > sub.lease_clock()
