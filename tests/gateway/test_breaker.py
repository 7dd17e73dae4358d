"""CircuitBreakers: window, thresholds, cool-down, half-open probes, and bounded memory."""

from __future__ import annotations

import threading

from gateway.breaker import BreakerState, CircuitBreakers
from tests.support.clock import FakeClock


def _breakers(clock: FakeClock) -> CircuitBreakers:
    return CircuitBreakers(clock=clock)


def _feed(cb: CircuitBreakers, pk: int, ok: int, fail: int) -> None:
    for _ in range(ok):
        cb.record(pk, ok=True)
    for _ in range(fail):
        cb.record(pk, ok=False)


def _open(cb: CircuitBreakers, pk: int) -> None:
    _feed(cb, pk, 0, 10)
    assert cb.state(pk) is BreakerState.OPEN


def test_unknown_instance_is_closed_and_allowed() -> None:
    cb = _breakers(FakeClock())
    assert cb.allow(1)
    assert cb.state(1) is BreakerState.CLOSED
    assert cb.open_instances() == frozenset()
    assert cb.states() == {}


def test_stays_closed_below_min_volume_even_at_full_failure() -> None:
    cb = _breakers(FakeClock())
    _feed(cb, 1, 0, 9)
    assert cb.state(1) is BreakerState.CLOSED
    assert cb.allow(1)


def test_opens_exactly_at_threshold() -> None:
    cb = _breakers(FakeClock())
    _feed(cb, 1, 7, 3)
    assert cb.state(1) is BreakerState.OPEN
    _feed(cb, 2, 8, 2)
    assert cb.state(2) is BreakerState.CLOSED


def test_a_success_never_trips_it() -> None:
    """Nine failures, then a success brings the window to its volume at 90 % failed: the
    instance just answered, so it stays closed; the next failure trips it."""
    clock = FakeClock()
    cb = _breakers(clock)
    _feed(cb, 1, 0, 9)
    clock.advance(29)
    _feed(cb, 1, 1, 0)
    assert cb.state(1) is BreakerState.CLOSED
    _feed(cb, 1, 0, 1)
    assert cb.state(1) is BreakerState.OPEN


def test_old_outcomes_slide_out_of_window() -> None:
    clock = FakeClock()
    cb = _breakers(clock)
    _feed(cb, 1, 0, 9)
    clock.advance(61)
    # The nine old failures are gone: nine ok + one fail is 10 %, not a trip.
    _feed(cb, 1, 9, 1)
    assert cb.state(1) is BreakerState.CLOSED
    clock.advance(30)
    # The previous ten still count: 4 fails of 13 is ≥ 30 %.
    _feed(cb, 1, 0, 3)
    assert cb.state(1) is BreakerState.OPEN


def test_open_refuses_until_cooldown_then_one_probe() -> None:
    clock = FakeClock()
    cb = _breakers(clock)
    _open(cb, 1)
    clock.advance(29.9)
    assert not cb.allow(1)
    clock.advance(0.1)
    assert cb.state(1) is BreakerState.HALF_OPEN
    assert cb.allow(1)
    assert not cb.allow(1)
    assert not cb.allow(1)
    assert cb.state(1) is BreakerState.HALF_OPEN


def test_probe_success_closes_and_clears_window() -> None:
    clock = FakeClock()
    cb = _breakers(clock)
    _open(cb, 1)
    clock.advance(30)
    assert cb.allow(1)
    cb.record(1, ok=True)
    assert cb.state(1) is BreakerState.CLOSED
    assert cb.allow(1)
    # A cleared window needs a full min volume again before it can trip.
    _feed(cb, 1, 0, 9)
    assert cb.state(1) is BreakerState.CLOSED


def test_probe_failure_reopens_with_fresh_cooldown() -> None:
    clock = FakeClock()
    cb = _breakers(clock)
    _open(cb, 1)
    clock.advance(30)
    assert cb.allow(1)
    clock.advance(5)
    cb.record(1, ok=False)
    assert cb.state(1) is BreakerState.OPEN
    clock.advance(29)
    assert not cb.allow(1)
    clock.advance(1)
    assert cb.allow(1)


def test_stuck_probe_is_replaced_after_cooldown() -> None:
    clock = FakeClock()
    cb = _breakers(clock)
    _open(cb, 1)
    clock.advance(30)
    assert cb.allow(1)
    clock.advance(29)
    assert not cb.allow(1)
    assert cb.open_instances() == {1}
    clock.advance(1)
    assert cb.open_instances() == frozenset()
    assert cb.allow(1)
    assert not cb.allow(1)


def test_a_probe_that_ends_with_no_verdict_lets_the_next_call_probe() -> None:
    """helper-50: a half-open probe cut by its caller's deadline (nothing said of the
    instance) kept every other call out until its cool-down ran out."""
    clock = FakeClock()
    cb = _breakers(clock)
    _open(cb, 1)
    clock.advance(30)
    assert cb.allow(1)  # the probe
    assert not cb.allow(1)
    cb.no_verdict(1)
    assert cb.open_instances() == frozenset()
    assert cb.allow(1)  # the next call probes at once
    cb.record(1, ok=True)
    assert cb.state(1) is BreakerState.CLOSED
    cb.no_verdict(1)  # nothing to release when closed
    assert cb.state(1) is BreakerState.CLOSED


def test_late_results_while_open_do_not_close() -> None:
    clock = FakeClock()
    cb = _breakers(clock)
    _open(cb, 1)
    _feed(cb, 1, 50, 0)
    assert cb.state(1) is BreakerState.OPEN
    clock.advance(30)
    # Half-open but no probe issued yet: a straggler's success is not the probe's.
    cb.record(1, ok=True)
    assert cb.state(1) is BreakerState.HALF_OPEN


def test_open_instances_in_each_state() -> None:
    clock = FakeClock()
    cb = _breakers(clock)
    _feed(cb, 1, 5, 0)
    assert cb.open_instances() == frozenset()
    _open(cb, 2)
    assert cb.open_instances() == {2}
    assert cb.states() == {2: BreakerState.OPEN}
    clock.advance(30)
    # Half-open, no probe out: the router may pick it so the call becomes the probe.
    assert cb.open_instances() == frozenset()
    assert cb.states() == {2: BreakerState.HALF_OPEN}
    assert cb.allow(2)
    assert cb.open_instances() == {2}
    cb.record(2, ok=True)
    assert cb.open_instances() == frozenset()
    assert cb.states() == {}


def test_breakers_are_independent_per_instance() -> None:
    cb = _breakers(FakeClock())
    _feed(cb, 1, 0, 10)
    _feed(cb, 2, 10, 0)
    assert cb.state(1) is BreakerState.OPEN
    assert cb.state(2) is BreakerState.CLOSED
    assert not cb.allow(1)
    assert cb.allow(2)
    assert cb.open_instances() == {1}


def test_closed_breakers_with_empty_window_are_dropped() -> None:
    clock = FakeClock()
    cb = _breakers(clock)
    for pk in range(100):
        cb.record(pk, ok=True)
    clock.advance(61)
    assert cb.states() == {}
    assert cb._breakers == {}


def test_concurrent_allow_issues_exactly_one_probe() -> None:
    clock = FakeClock()
    cb = _breakers(clock)
    _open(cb, 1)
    clock.advance(30)
    barrier = threading.Barrier(16)
    results: list[bool] = []

    def worker() -> None:
        barrier.wait()
        results.append(cb.allow(1))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 15 + [True]


def test_memory_bounded_under_heavy_traffic() -> None:
    clock = FakeClock(0.0)
    cb = _breakers(clock)
    start = clock.now
    for i in range(100_000):
        # 100,000 outcomes spread over 600 simulated seconds, 10 % failures: stays closed.
        clock.now = start + i * 0.006
        cb.record(1, ok=i % 10 != 0)
        assert len(cb._breakers[1].buckets) <= 60 + 1
    assert cb.state(1) is BreakerState.CLOSED
