"""Leases in the router, on an injected clock: a lapsed lease gets no caller traffic."""

from __future__ import annotations

import types

from routing.router import LEASE_SLACK_SECONDS, Router, RouteRequest
from routing.table import LoadReport, load_from_wire, load_to_wire
from tests.routing.tables import agent, inst, table

CAP = "translate.text"
T0 = 1_700_000_000.0
TTL = 30.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def request() -> RouteRequest:
    return RouteRequest(tenant_pk=1, capability=CAP)


def dropped(decision) -> dict[int, str]:
    return {d.instance_id: d.reason for d in decision.dropped}


def test_a_lapsed_lease_stops_traffic_within_ttl_plus_two_seconds_and_a_heartbeat_restores_it():
    a = agent("a", instances=(inst(lease_expires_at=T0 + TTL), inst(lease_expires_at=T0 + 600)))
    lapsing, steady = (i.pk for i in a.instances)
    clock = Clock(T0 + TTL - 1)  # last heartbeat at T0; lease still holds
    router = Router(clock=clock)
    t = table(a)
    picks = {router.route(t, request()).chosen.instance.pk for _ in range(4)}
    assert picks == {lapsing, steady}

    assert LEASE_SLACK_SECONDS < 2
    clock.now = T0 + TTL + 2  # no sweep has run: the table still says "healthy"
    assert a.instances[0].state == "healthy"
    picks = {router.route(t, request()).chosen.instance.pk for _ in range(4)}
    assert picks == {steady}
    dry = router.route(t, request(), pick=False)
    assert dropped(dry) == {lapsing: "lease_expired"}
    assert "probe traffic only" in dry.explain()["dropped"][0]["detail"]
    assert [c.instance.pk for c in dry.candidates] == [steady]

    # A heartbeat arrives as an unversioned load report carrying the renewed lease.
    report = load_from_wire(load_to_wire(LoadReport(
        agent_pk=a.pk, instance_pk=lapsing, cpu=0.1, memory=0.1, queue_depth=0, in_flight=0,
        lease_expires_at=clock.now + TTL)))
    renewed = t.apply_load(report)
    picks = {router.route(renewed, request()).chosen.instance.pk for _ in range(4)}
    assert picks == {lapsing, steady}


def test_the_only_instance_lapsing_is_no_healthy_instance_with_the_reason():
    a = agent("a", instances=(inst(lease_expires_at=T0),))
    router = Router(clock=Clock(T0 + 5))
    decision = router.route(table(a), request())
    assert decision.chosen is None and decision.error == "no_healthy_instance"
    assert [d.reason for d in decision.dropped] == ["lease_expired"]


def test_an_unknown_instance_gets_no_caller_traffic():
    a = agent("a", instances=(inst(state="unknown", weight_factor=0.0, lease_expires_at=T0),
                              inst(lease_expires_at=T0 + 600)))
    unknown, healthy = (i.pk for i in a.instances)
    router = Router(clock=Clock(T0 - 10))
    t = table(a)
    assert {router.route(t, request()).chosen.instance.pk for _ in range(10)} == {healthy}
    assert dropped(router.route(t, request(), pick=False))[unknown] == "instance_unknown"
    # Even one that still carries a weight (an older control plane's table).
    old = agent("old", instances=(inst(state="unknown", weight_factor=0.25),))
    assert Router().route(table(old), request()).error == "no_healthy_instance"


def test_an_entry_without_a_lease_is_routed_and_old_load_reports_still_parse():
    a = agent("a")
    assert a.instances[0].lease_expires_at is None
    assert Router(clock=Clock(T0)).route(table(a), request()).chosen is not None
    wire = load_to_wire(LoadReport(agent_pk=a.pk, instance_pk=a.instances[0].pk, cpu=0.5,
                                   memory=0.0, queue_depth=0, in_flight=0))
    del wire["lease_expires_at"]  # from a control plane without leases on the wire
    report = load_from_wire(types.MappingProxyType(wire))
    assert report.lease_expires_at is None
    applied = table(a).apply_load(report)
    entry = applied.current(applied.agents[a.pk].instances[0])
    assert entry.cpu == 0.5 and entry.lease_expires_at is None
