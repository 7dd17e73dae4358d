"""``reach_core.outage``: after one failure, calls skip the dependency for a while."""

from reach_core.outage import Outage
from tests.support.clock import FakeClock


def test_a_failure_is_remembered_for_the_hold_then_forgotten():
    clock = FakeClock()
    redis = Outage(hold_s=5.0, clock=clock)
    assert not redis.away()
    redis.failed()
    assert redis.away()
    clock.advance(4.9)
    assert redis.away()
    clock.advance(0.2)
    assert not redis.away()
