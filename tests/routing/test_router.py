from __future__ import annotations

from collections import Counter

import pytest

from routing.balancer import SmoothWeightedRoundRobin
from routing.router import (
    Feedback,
    Router,
    RouteRequest,
    base_score,
    load_pressure,
)
from tests.routing.tables import agent, grant, inst, table
from tests.support.clock import FakeClock

CAP = "translate.text"


def request(**kw) -> RouteRequest:
    return RouteRequest(**{"tenant_pk": 1, "capability": CAP, **kw})


def reasons(decision) -> dict[str, str]:
    return {d.agent: d.reason for d in decision.dropped}


# ---- smooth weighted round robin -------------------------------------------------------


def test_swrr_gives_exact_shares_over_each_cycle_and_spreads_them():
    swrr = SmoothWeightedRoundRobin()
    weights = [("a", 5), ("b", 1), ("c", 1)]
    picks = [swrr.pick("k", weights) for _ in range(7)]
    assert picks == ["a", "a", "b", "a", "c", "a", "a"]  # nginx's documented sequence
    more = [swrr.pick("k", weights) for _ in range(700)]
    assert Counter(more) == {"a": 500, "b": 100, "c": 100}


def test_swrr_is_deterministic():
    runs = []
    for _ in range(2):
        swrr = SmoothWeightedRoundRobin()
        runs.append([swrr.pick("k", [("x", 3), ("y", 2)]) for _ in range(20)])
    assert runs[0] == runs[1]


def test_router_balances_instances_by_their_weights():
    a = agent("a", weight=300)
    b = agent("b", weight=100)
    router = Router()
    t = table(a, b)
    picks = Counter(router.route(t, request()).chosen.agent.name for _ in range(400))
    assert picks == {"a": 300, "b": 100}


def test_an_ab_split_lands_within_two_percent_over_ten_thousand_picks():
    stable = agent("stable", instances=(inst(), inst()))
    canary = agent("canary", traffic_percent=10)
    router = Router()
    t = table(stable, canary)
    picks = Counter(router.route(t, request()).chosen.agent.name for _ in range(10_000))
    assert abs(picks["canary"] / 10_000 - 0.10) <= 0.02
    assert picks["canary"] + picks["stable"] == 10_000


# ---- filters ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent_kw", "req_kw", "reason"),
    [
        ({"namespace": "dev"}, {}, "namespace"),
        ({"internal_only": True}, {}, "internal_only"),
        ({"cap": {"version": "1.2.0"}}, {"min_version": "1.10"}, "version"),
        ({"cap": {"directions": ("en->zh",)}}, {"src_lang": "en", "dest_lang": "ja"},
         "language"),
        ({"cap": {"languages": ("en", "zh")}}, {"dest_lang": "fr"}, "language"),
        ({"cap": {"formats": ("text",)}}, {"input_format": "pdf"}, "format"),
        ({"cap": {"max_input_chars": 100}}, {"input_chars": 101}, "input_too_long"),
        ({"instances": (inst(state="offline"),)}, {}, "instance_offline"),
        ({"instances": (inst(state="draining"),)}, {}, "instance_draining"),
        ({"instances": (inst(capabilities_available=frozenset({"other"})),)}, {},
         "capability_unavailable"),
        ({"instances": (inst(health_tier="sub_healthy", weight_factor=0.0),)}, {},
         "sub_healthy"),
        ({"instances": ()}, {}, "no_instances"),
    ],
)
def test_each_filter_drops_with_its_reason(agent_kw, req_kw, reason):
    dropped_agent = agent("dropped", **agent_kw)
    kept_agent = agent("kept", cap={"version": "9.0.0"})
    t = table(dropped_agent, kept_agent)
    assert Router().route(t, request(**req_kw)).chosen.agent.name == "kept"
    assert reasons(Router().route(t, request(**req_kw), pick=False))["dropped"] == reason


def test_a_dry_run_never_names_another_tenants_private_agent():
    hidden = agent("someone-elses", owner=2)
    elsewhere = agent("other-namespace", owner=2, namespace="dev")
    kept = agent("kept")
    explained = Router().route(table(hidden, elsewhere, kept), request(), pick=False).explain()
    named = {d["agent"] for d in explained["dropped"]} | {
        c["agent"] for c in explained["candidates"]}
    assert named == {"kept"}
    alone = Router().route(table(hidden), request(), pick=False)
    assert alone.error == "no_capability" and alone.explain()["dropped"] == []


def test_filters_pass_when_the_constraint_is_met():
    a = agent("a", cap={"version": "1.10.0", "directions": ("en->ja",), "formats": ("pdf",),
                        "max_input_chars": 100})
    req = request(min_version="1.9", src_lang="en", dest_lang="ja", input_format="pdf",
                  input_chars=100)
    assert Router().route(table(a), req).chosen is not None
    assert not Router().route(table(a), req, pick=False).dropped


def test_an_open_breaker_removes_its_instance():
    a = agent("a", instances=(inst(), inst()))
    broken = a.instances[0].pk
    router = Router(open_breakers=lambda: [broken])
    assert router.route(table(a), request()).chosen.instance.pk == a.instances[1].pk
    dry = router.route(table(a), request(), pick=False)
    assert [d.reason for d in dry.dropped] == ["circuit_open"]


def test_grants_open_private_agents_and_other_namespaces():
    private = agent("private", owner=2, namespace="prod")
    t = table(private, grants=(grant(1, agent_pk=private.pk),))
    assert Router().route(t, request()).chosen.agent.name == "private"
    cap_grant = table(private, grants=(grant(1, capability_pk=private.capabilities[0].pk),))
    assert Router().route(cap_grant, request()).chosen.agent.name == "private"
    # Accepted for other ids only (the agent offers this one since, or it was renamed).
    for other in (grant(1, agent_pk=private.pk, ids=("x.other",)),
                  grant(1, capability_pk=private.capabilities[0].pk, ids=("x.other",))):
        assert Router().route(table(private, grants=(other,)), request()).error == \
            "no_capability"


def test_internal_agents_need_tenant_and_network():
    internal = agent("internal", internal_only=True)
    t = table(internal)
    assert Router().route(t, request()).error == "no_capability"
    assert Router().route(t, request(internal_network=True)).chosen is not None
    foreign = table(agent("internal2", internal_only=True, owner=2, visibility="public"))
    assert Router().route(foreign, request(internal_network=True)).error == "no_capability"


def test_public_agents_are_reachable_by_every_tenant():
    t = table(agent("public", owner=2, visibility="public"))
    assert Router().route(t, request()).chosen is not None


# ---- errors ----------------------------------------------------------------------------------


def test_no_capability_when_nobody_offers_it_or_it_is_not_offered_to_the_caller():
    t = table(agent("a"), agent("b", "other.cap", owner=2))
    assert Router().route(t, request(capability="missing.cap")).error == "no_capability"
    assert Router().route(t, request(capability="other.cap")).error == "no_capability"


def test_no_healthy_instance_when_it_is_offered_but_every_instance_is_down():
    t = table(agent("a", instances=(inst(state="offline"), inst(state="draining"))))
    decision = Router().route(t, request())
    assert decision.error == "no_healthy_instance" and decision.chosen is None
    assert sorted(d.reason for d in decision.dropped) == ["instance_draining",
                                                           "instance_offline"]


# ---- scores --------------------------------------------------------------------------------


def test_load_pressure_is_the_weighted_sum_of_normalised_figures():
    a = agent("a", instances=(inst(cpu=0.5, memory=0.25, queue_depth=25),))
    assert load_pressure(a.instances[0]) == pytest.approx(0.3 * 0.5 + 0.3 * 0.25 + 0.4 * 0.5)
    saturated = agent("s", instances=(inst(cpu=2.0, memory=1.0, queue_depth=500),))
    assert load_pressure(saturated.instances[0]) == pytest.approx(1.0)


def test_base_score_is_weight_times_health_minus_load_with_a_trickle():
    a = agent("a", weight=200, instances=(inst(weight_factor=0.5, cpu=1.0),))
    assert base_score(a, a.instances[0]) == pytest.approx(200 / 100 * 0.5 - 0.3)
    loaded = agent("l", instances=(inst(cpu=1, memory=1, queue_depth=50),))
    assert base_score(loaded, loaded.instances[0]) == pytest.approx(0.05)
    offline = agent("o", instances=(inst(weight_factor=0.0),))
    assert base_score(offline, offline.instances[0]) == 0.0


def test_health_factor_shifts_traffic():
    healthy = agent("healthy")
    overloaded = agent("overloaded", instances=(inst(health_tier="overloaded",
                                                     weight_factor=0.5),))
    router = Router()
    picks = Counter(router.route(table(healthy, overloaded), request()).chosen.agent.name
                    for _ in range(300))
    assert picks == {"healthy": 200, "overloaded": 100}


def test_observed_failures_and_latency_lower_an_instance():
    a = agent("a", instances=(inst(), inst(), inst()))
    feedback = Feedback(alpha=1.0)
    feedback.record(a.instances[0].pk, ok=False, latency_ms=10)
    feedback.record(a.instances[1].pk, ok=True, latency_ms=400)
    feedback.record(a.instances[2].pk, ok=True, latency_ms=100)
    decision = Router(feedback=feedback).route(table(a), request(), pick=False)
    by_pk = {c.instance.pk: c for c in decision.candidates}
    assert by_pk[a.instances[0].pk].success_factor == 0.05
    assert by_pk[a.instances[1].pk].latency_factor == pytest.approx(0.5)  # sqrt(100/400)
    assert by_pk[a.instances[2].pk].latency_factor == 1.0
    assert decision.candidates[0].instance.pk == a.instances[2].pk


def test_observed_failures_fade_when_no_calls_outweigh_them():
    """Break test (helper-34): a burst of 5xx left an instance at a success factor of
    0.05, so it got about 1 % of the calls and needed thousands to climb back, for
    minutes after it had recovered. Failures fade with time too."""
    clock = FakeClock()
    a = agent("a", instances=(inst(), inst()))
    feedback = Feedback(clock=clock)
    for _ in range(30):
        feedback.record(a.instances[0].pk, ok=False, latency_ms=10)
    feedback.record(a.instances[1].pk, ok=True, latency_ms=10)
    router = Router(feedback=feedback)

    def share() -> float:
        picks = Counter(router.route(table(a), request()).chosen.instance.pk
                        for _ in range(200))
        return picks[a.instances[0].pk] / 200

    assert feedback.success(a.instances[0].pk) < 0.05
    assert share() < 0.1
    clock.advance(60)
    assert feedback.success(a.instances[0].pk) == pytest.approx(0.87, abs=0.01)
    assert share() > 0.4
    feedback.record(a.instances[0].pk, ok=False, latency_ms=10)  # failing again: down
    assert feedback.success(a.instances[0].pk) < 0.8


def test_priority_one_is_used_while_any_of_it_is_healthy():
    primary = agent("primary", priority=1, instances=(inst(state="offline"), inst()))
    backup = agent("backup", priority=2)
    router = Router()
    t = table(primary, backup)
    assert {router.route(t, request()).chosen.agent.name for _ in range(10)} == {"primary"}
    assert reasons(router.route(t, request(), pick=False))["backup"] == "lower_priority"
    down = table(agent("primary", priority=1, instances=(inst(state="offline"),)), backup)
    assert router.route(down, request()).chosen.agent.name == "backup"


def test_cost_preference_cheapest_acceptable():
    cheap = agent("cheap", price_per_call=0.001, weight=10)
    best = agent("best", price_per_call=0.01, weight=1000)
    router = Router()
    t = table(cheap, best)
    assert router.route(t, request(cost_preference="cheapest")).chosen.agent.name == "cheap"
    picks = Counter(router.route(t, request()).chosen.agent.name for _ in range(101))
    assert picks["best"] == 100


def test_a_dry_run_explains_every_component_and_does_not_advance_the_balancer():
    a = agent("a", instances=(inst(cpu=0.5), inst()))
    b = agent("b", instances=(inst(state="offline"),))
    router = Router()
    t = table(a, b)
    dry = router.route(t, request(), pick=False).explain()
    assert dry["chosen"] is None
    assert {"match", "weight", "health_factor", "load_pressure", "success_factor",
            "latency_factor", "final"} <= set(dry["candidates"][0]["scores"])
    assert dry["dropped"] == [{"agent": "b", "capability": CAP, "reason": "instance_offline",
                               "instance_id": b.instances[0].pk}]
    first_real = router.route(t, request()).chosen.instance.pk
    fresh = Router().route(t, request()).chosen.instance.pk
    assert first_real == fresh  # the dry run left the cycle where it was


def test_another_tenants_public_agent_never_takes_an_id_the_tenant_offers():
    """A public agent of another tenant under the caller's capability id, weighted 10x,
    gets none of the caller's calls (a break test: such an agent took another tenant's
    calls), not even while the caller's own agent is down or drained (the re-test: a
    deploy of the owner's agent handed its calls to the squatter); a call that names it
    does reach it, and a tenant with no agent of the id reaches it."""
    mine, theirs = agent("mine"), agent("shadow", owner=2, visibility="public", weight=1000)
    router = Router()
    picks = Counter(router.route(table(mine, theirs), request()).chosen.agent.name
                    for _ in range(50))
    assert picks == {"mine": 50}
    explained = router.route(table(mine, theirs), request(), pick=False)
    assert reasons(explained) == {"shadow": "not_own"}
    # The owner of the public agent still reaches its own, and a grant counts as own.
    assert router.route(table(mine, theirs), request(tenant_pk=2)).chosen.agent.name == \
        "shadow"
    granted = table(mine, theirs, grants=(grant(1, agent_pk=theirs.pk),))
    assert {router.route(granted, request()).chosen.agent.name for _ in range(40)} == {
        "mine", "shadow"}
    # Its own agent down or drained: no healthy instance, never the other tenant's.
    for state in ("offline", "draining"):
        down = agent("mine", instances=(inst(state=state),))
        refused = router.route(table(down, theirs), request())
        assert refused.chosen is None and refused.error == "no_healthy_instance", state
        assert reasons(router.route(table(down, theirs), request(), pick=False))[
            "shadow"] == "not_own"
    # Named, it is reached; and by a tenant with no agent of the id.
    assert router.route(table(down, theirs), request(agent="shadow")).chosen.agent.name == \
        "shadow"
    assert router.route(table(down, theirs), request(tenant_pk=3)).chosen.agent.name == \
        "shadow"
