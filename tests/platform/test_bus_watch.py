"""A hung Redis (no connection breaks, nothing answers) must be noticed like a stopped
one: leases judged as of that moment, the table reloaded before the clock resumes.
Real Redis behind a forwarder this test owns and freezes."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from reach_platform.routes_runtime import BusWatch
from routing.bus import RedisBus
from routing.subscriber import RouteTableSubscriber
from routing.table import RouteTable
from tests.support.forwarder import Forwarder

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis")


def test_a_hung_redis_freezes_the_lease_clock_and_its_return_reloads_first():
    loads = []

    def loader() -> RouteTable:
        loads.append(time.time())
        return RouteTable(version=0)

    subscriber = RouteTableSubscriber(loader=loader)
    subscriber.start()
    with Forwarder.for_url(settings.REDIS_URL) as redis:
        watch = BusWatch(RedisBus(redis.url(settings.REDIS_URL), channel="watch-test"),
                         subscriber)
        watch.check()
        assert not watch.hung and subscriber.cut_off_since is None
        with redis.freeze():
            started = time.time()
            watch.check()  # one PING, answered by nobody within its second
            assert watch.hung
            assert started <= subscriber.cut_off_since <= time.time()
            frozen = subscriber.lease_clock()
            assert subscriber.lease_clock() == frozen  # leases judged as of the hang
        reloads = len(loads)
        watch.check()
        assert not watch.hung and subscriber.cut_off_since is None
        assert len(loads) == reloads + 1  # leases from the database before the clock
        assert redis.accepted
