"""Steady heartbeats go to Redis and reach PostgreSQL in batches; everything else is
judged by the database as before. The door runs in front of the real Django ASGI app,
on this run's PostgreSQL and Redis, on an injected clock."""

from __future__ import annotations

import asyncio
import datetime as dt

import httpx
import orjson
import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.asgi import get_asgi_application
from django.db import connections
from django.utils import timezone

from reach_core import outage
from reach_platform import auth_throttle, heartbeat_door
from reach_platform.heartbeat_door import HeartbeatDoor
from registry import heartbeats, routes
from registry.api.serializers import HeartbeatSerializer
from registry.choices import InstanceState
from registry.models import AgentToken, Instance
from registry.services import instance_drain, instances_sweep
from registry.snapshot import current_version
from registry.tokens import agent_token_issue
from tests import factories
from tests.support.clock import FakeClock

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="steady beats need Redis")

T0 = 1_900_000_000.0  # the injected clock's start (epoch seconds)


class Platform:
    """The door before Django, with a counting fallback, driven over ASGI."""

    def __init__(self, clock: FakeClock) -> None:
        django_app = get_asgi_application()
        self.fallback_calls = 0

        async def counted(scope, receive, send):
            self.fallback_calls += 1
            await django_app(scope, receive, send)

        self.clock = clock
        self.door = HeartbeatDoor(counted, clock=clock)
        # One loop for the test: the door's Redis client belongs to the loop it began on.
        self.loop = asyncio.new_event_loop()

    def beat(self, instance: Instance, token: str, body=None, *,
             content_type: str = "application/json", path: str | None = None
             ) -> httpx.Response:
        async def go():
            transport = httpx.ASGITransport(app=self.door)
            async with httpx.AsyncClient(transport=transport,
                                         base_url="http://127.0.0.1") as client:
                return await client.post(
                    path or f"/api/v1/instances/{instance.pk}/heartbeat",
                    content=orjson.dumps(body if body is not None else {}),
                    headers={"Authorization": f"Bearer {token}",
                             "Content-Type": content_type})
        return self.loop.run_until_complete(go())

    def close(self) -> None:
        self.loop.run_until_complete(self.door.aclose())
        # The door's lookups ran in asgiref's thread: its connection ends with the test.
        self.loop.run_until_complete(sync_to_async(connections.close_all)())
        self.loop.close()


@pytest.fixture
def fleet(transactional_db, monkeypatch):
    factories.seed_defaults()
    tenant = factories.tenant()
    agent = factories.agent(owner=tenant, lease_ttl_seconds=30, heartbeat_interval_seconds=10)
    factories.capability(agent=agent, capability_id="echo.one")
    instance = factories.instance(agent=agent)
    token = agent_token_issue(agent=agent)
    clock = FakeClock(T0)
    # The view's services read Django's clock: the same injected one.
    monkeypatch.setattr(timezone, "now", lambda: at(clock()))
    outage.REDIS.clear()  # no earlier test's outage
    platform = Platform(clock)
    yield platform, instance, token
    outage.REDIS.clear()
    platform.close()
    heartbeats.forget(instance.pk)


class Untouchable:
    def __getattr__(self, name):
        raise AssertionError(f"Redis was called ({name}) while it is away")


def redis_untouchable(monkeypatch) -> None:
    """Every Redis client a heartbeat may use fails the test if touched."""
    monkeypatch.setattr(heartbeats, "_client", Untouchable)
    monkeypatch.setattr(auth_throttle, "_redis", Untouchable)
    monkeypatch.setattr(routes, "route_bus", Untouchable)


def at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def test_a_steady_beat_touches_no_row_and_moves_no_version_until_the_flush(fleet):
    platform, instance, token = fleet
    first = platform.beat(instance, token, {"cpu": 0.1})
    assert first.status_code == 200, first.text
    assert platform.fallback_calls == 1  # the first beat is judged by the database
    version = current_version()
    for n in range(1, 6):
        platform.clock.advance(10)
        reply = platform.beat(instance, token, {"cpu": 0.1, "queue_depth": n})
        assert reply.status_code == 200, reply.text
        assert reply.json()["state"] == "healthy"
        assert reply.json()["heartbeat_interval_seconds"] == 10
    assert platform.fallback_calls == 1
    assert current_version() == version
    instance.refresh_from_db()
    assert instance.lease_expires_at == at(T0 + 30)  # the database has not seen them
    assert instance.queue_depth == 0

    assert heartbeats.flush() == 1
    instance.refresh_from_db()
    assert instance.lease_expires_at == at(T0 + 50 + 30)
    assert instance.last_heartbeat_at == at(T0 + 50)
    assert instance.queue_depth == 5
    assert current_version() == version


def test_the_sweep_does_not_take_a_lease_renewed_only_in_redis_for_a_lapse(fleet):
    platform, instance, token = fleet
    platform.beat(instance, token)
    platform.clock.advance(25)
    platform.beat(instance, token)  # steady: renews to T0 + 55 in Redis only
    assert platform.fallback_calls == 1
    counts = instances_sweep(now=at(T0 + 40))
    assert counts["unknown"] == 0
    instance.refresh_from_db()
    assert instance.state == InstanceState.HEALTHY
    assert instance.lease_expires_at == at(T0 + 55)

    # Silent past the renewed lease: unknown, and the next beat is judged by the database
    # (a return within 2 x TTL is a flap) and moves a version.
    assert instances_sweep(now=at(T0 + 56))["unknown"] == 1
    platform.clock.now = T0 + 60
    version = current_version()
    back = platform.beat(instance, token)
    assert back.status_code == 200 and platform.fallback_calls == 2
    instance.refresh_from_db()
    assert instance.state == InstanceState.HEALTHY and instance.flaps == 1
    assert current_version() > version


def test_a_lapsed_lease_is_judged_by_the_database_even_before_the_sweep(fleet):
    platform, instance, token = fleet
    platform.beat(instance, token)
    platform.clock.advance(31)  # lease (T0 + 30) lapsed; no sweep ran
    platform.beat(instance, token)
    assert platform.fallback_calls == 2
    instance.refresh_from_db()
    assert instance.flaps == 1


@pytest.mark.parametrize(("body", "change"), [
    ({"cpu": 0.95}, ("health_tier", "overloaded")),
    ({"in_flight": 3, "processed_recent": 0}, ("health_tier", "sub_healthy")),
    ({"capabilities_available": []}, ("capabilities_available", [])),
])
def test_a_structural_change_goes_to_the_database_and_moves_a_version(fleet, body, change):
    platform, instance, token = fleet
    platform.beat(instance, token, {"capabilities_available": ["echo.one"]})
    platform.clock.advance(10)
    platform.beat(instance, token, {"capabilities_available": ["echo.one"]})
    assert platform.fallback_calls == 1
    version = current_version()
    platform.clock.advance(10)
    assert platform.beat(instance, token, body).status_code == 200
    assert platform.fallback_calls == 2
    instance.refresh_from_db()
    assert getattr(instance, change[0]) == change[1]
    assert current_version() > version


def test_a_drained_instance_is_told_so_at_its_next_beat(fleet):
    platform, instance, token = fleet
    platform.beat(instance, token)
    platform.clock.advance(10)
    platform.beat(instance, token)
    instance.refresh_from_db()
    instance_drain(instance=instance)
    platform.clock.advance(10)
    reply = platform.beat(instance, token)
    assert reply.status_code == 200
    assert reply.json()["state"] == "draining"
    assert platform.fallback_calls == 2
    # And the flush never writes a steady lease over a drain's.
    heartbeats.flush()
    instance.refresh_from_db()
    assert instance.state == InstanceState.DRAINING


def test_a_flap_is_forgiven_on_time_although_every_beat_is_steady(fleet):
    platform, instance, token = fleet
    platform.beat(instance, token)
    platform.clock.advance(31)
    platform.beat(instance, token)  # a flap at T0 + 31: weight halved
    instance.refresh_from_db()
    assert instance.flaps == 1
    for _ in range(7):  # steady until T0 + 101 = the flap + 2 x TTL + 10
        platform.clock.advance(10)
        platform.beat(instance, token)
    instance.refresh_from_db()
    assert instance.flaps == 0
    assert platform.fallback_calls == 3  # the first, the flap, the forgiving beat


def test_what_the_door_is_not_sure_of_gets_the_views_answer(fleet):
    platform, instance, token = fleet
    platform.beat(instance, token)
    platform.clock.advance(5)
    base = platform.fallback_calls
    wrong = platform.beat(instance, token, {"cpu": 0.5, "wieght": 1})
    assert wrong.status_code == 400
    assert "wieght" in wrong.json()["error"]["details"]
    typed = platform.beat(instance, token, {"cpu": True})
    assert typed.status_code == 400 and "cpu" in typed.json()["error"]["details"]
    assert platform.beat(instance, token, {"queue_depth": -1}).status_code == 400
    assert platform.beat(instance, token, {"processed_recent": 2**31}).status_code == 400
    assert platform.beat(instance, token, content_type="text/plain").status_code == 415
    digits = str(instance.pk).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    platform.beat(instance, token, path=f"/api/v1/instances/{digits}/heartbeat")
    assert platform.beat(instance, "rat_notarealtoken_xxxxxxxx").status_code == 401
    other = agent_token_issue(agent=factories.agent(owner=factories.tenant()))
    assert platform.beat(instance, other).status_code in (403, 404)
    assert platform.fallback_calls == base + 8
    # And nothing of that changed the instance's steady record.
    assert platform.beat(instance, token).status_code == 200
    assert platform.fallback_calls == base + 8


def test_a_revoked_token_or_a_disabled_tenant_is_refused_at_the_next_beat(fleet):
    platform, instance, token = fleet
    platform.beat(instance, token)
    platform.clock.advance(1)
    assert platform.beat(instance, token).status_code == 200
    row = AgentToken.objects.get(agent=instance.agent_id)
    row.revoked_at = at(platform.clock())
    row.save()
    assert platform.beat(instance, token).status_code == 401

    fresh = agent_token_issue(agent=instance.agent)
    platform.beat(instance, fresh)
    assert platform.beat(instance, fresh).status_code == 200
    tenant = instance.agent.owner_tenant
    tenant.is_active = False
    tenant.save()
    assert platform.beat(instance, fresh).status_code == 401


def test_a_token_of_another_agent_never_renews_this_instance(fleet):
    platform, instance, token = fleet
    platform.beat(instance, token)
    other_agent = factories.agent(owner=instance.agent.owner_tenant)
    other_instance = factories.instance(agent=other_agent)
    other = agent_token_issue(agent=other_agent)
    platform.beat(other_instance, other)  # known to Redis now, for its own instance
    assert platform.beat(other_instance, other).status_code == 200
    steady = platform.fallback_calls
    assert platform.beat(instance, other).status_code == 404  # not its own: not found
    assert platform.fallback_calls == steady + 1
    heartbeats.forget(other_instance.pk)


def test_with_redis_away_beats_go_to_the_database(fleet, settings, monkeypatch):
    platform, instance, token = fleet
    platform.beat(instance, token)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    platform.loop.run_until_complete(platform.door.aclose())
    platform.clock.advance(10)
    reply = platform.beat(instance, token, {"queue_depth": 7})
    assert reply.status_code == 200, reply.text
    instance.refresh_from_db()
    assert instance.queue_depth == 7
    # Having failed once, the next beats do not wait for Redis's timeout again.
    assert outage.REDIS.away()

    async def hung(**_):
        raise AssertionError("the script was tried again while Redis is away")

    platform.door._script = hung
    platform.clock.advance(10)

    # Nor does the view: its auth throttle, lease lookup, seeds and load report skip
    # Redis too, rather than each waiting out a hung Redis's timeout.
    redis_untouchable(monkeypatch)
    assert platform.beat(instance, token, {"queue_depth": 8}).status_code == 200
    instance.refresh_from_db()
    assert instance.queue_depth == 8


@pytest.mark.parametrize("body", [
    {}, {"cpu": 0}, {"cpu": 1}, {"cpu": 0.5, "memory": 1.0}, {"queue_depth": 2**31 - 1},
    {"capabilities_available": ["a", "b"]}, {"capabilities_available": []},
    {"cpu": 1.5}, {"cpu": -0.1}, {"cpu": None}, {"cpu": "0.5"}, {"queue_depth": 1.0},
    {"queue_depth": True}, {"in_flight": 2**40}, {"capabilities_available": "a"},
    {"capabilities_available": [1]}, {"capabilities_available": [""]},
    {"capabilities_available": ["x" * 129]}, {"other": 1}, [], "x", 3,
    {"capabilities_available": None},
])
def test_the_door_accepts_only_what_the_view_accepts(body):
    parsed = heartbeat_door.parse(orjson.dumps(body))
    if parsed is None:
        return  # the view answers it
    serializer = HeartbeatSerializer(data=body)
    assert serializer.is_valid(), serializer.errors
    heartbeat = serializer.to_heartbeat()
    assert (heartbeat.load, heartbeat.capabilities_available) == parsed


def test_a_repeated_key_is_left_to_the_view_which_refuses_it():
    assert heartbeat_door.parse(b'{"cpu": 0.1, "cpu": 0.2}') is None
    assert heartbeat_door.parse(b'{"cpu": 0.1, "memory": 0.2}') is not None
    assert heartbeat_door.parse(b'{"capabilities_available": ["a:b"]}') is not None


def test_beats_beyond_what_the_view_can_judge_at_once_get_503_at_once():
    """Beats the view judges hold a database connection each: past the limit they are
    answered 503 with Retry-After at once rather than queued into time-outs."""
    release = asyncio.Event()
    entered = 0

    async def slow_view(scope, receive, send):
        nonlocal entered
        entered += 1
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    door = HeartbeatDoor(slow_view, view_concurrency=2)

    async def go():
        transport = httpx.ASGITransport(app=door)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            def beat():  # a tenant key: always the view's to judge
                return client.post("/api/v1/instances/1/heartbeat", json={},
                                   headers={"Authorization": "Bearer rk_tenant_key"})
            held = [asyncio.ensure_future(beat()) for _ in range(2)]
            while entered < 2:
                await asyncio.sleep(0.01)
            shed = await beat()
            release.set()
            return [r.status_code for r in await asyncio.gather(*held)], shed

    held, shed = asyncio.run(go())
    assert held == [200, 200]
    assert shed.status_code == 503 and shed.json()["error"]["code"] == "overloaded"
    assert 1 <= int(shed.headers["retry-after"]) <= 3


def test_after_redis_forgets_the_sweep_reseeds_and_beats_stay_off_the_view(fleet):
    """A Redis restart without persistence: without a reseed every instance's next beat
    would queue at the view at once, ten times what it judges per second at 10,000
    agents, and leases would lapse meanwhile."""
    platform, instance, token = fleet
    drained_agent = factories.agent(owner=instance.agent.owner_tenant)
    drained = factories.instance(agent=drained_agent, lease_expires_at=at(T0 + 30))
    instance_drain(instance=drained)
    platform.beat(instance, token)
    client = heartbeats._client()
    forgotten = list(client.scan_iter(f"{settings.REDIS_KEY_PREFIX}hb*"))
    assert forgotten
    client.delete(*forgotten)

    instances_sweep(now=at(T0 + 1))
    assert client.exists(heartbeats.key(instance.pk))
    assert not client.exists(heartbeats.key(drained.pk))  # judged by the view, as before
    platform.clock.advance(10)
    calls = platform.fallback_calls
    assert platform.beat(instance, token).status_code == 200
    assert platform.fallback_calls == calls
    # Once only: the marker says Redis remembers.
    assert heartbeats.reseed_if_forgotten(now=at(T0 + 11)) == 0
    heartbeats.forget(drained.pk)


def test_load_hovering_at_a_threshold_does_not_flip_the_tier_on_every_beat(fleet):
    platform, instance, token = fleet
    platform.beat(instance, token, {"cpu": 0.9})
    instance.refresh_from_db()
    assert instance.health_tier == "overloaded"
    version, calls = current_version(), platform.fallback_calls
    for cpu in (0.84, 0.86, 0.8, 0.88, 0.76):  # hovering: stays overloaded, steadily
        platform.clock.advance(10)
        reply = platform.beat(instance, token, {"cpu": cpu})
        assert reply.json()["health_tier"] == "overloaded"
    assert (current_version(), platform.fallback_calls) == (version, calls)
    platform.clock.advance(10)
    assert platform.beat(instance, token, {"cpu": 0.7}).json()["health_tier"] == "healthy"
    assert platform.fallback_calls == calls + 1 and current_version() > version
    # From healthy, the same load is not enough to enter: no hysteresis going up.
    platform.clock.advance(10)
    assert platform.beat(instance, token, {"cpu": 0.8}).json()["health_tier"] == "healthy"
    # And a stalled instance leaves the steady path at once.
    platform.clock.advance(10)
    stalled = platform.beat(instance, token, {"in_flight": 2, "processed_recent": 0})
    assert stalled.json()["health_tier"] == "sub_healthy"


def test_a_drained_instances_beats_do_not_wait_on_a_hung_redis(fleet, monkeypatch):
    """A break test saw each beat of a drained instance take 1-3 s during a Redis hang
    (its record was deleted again on every beat), slowing the others' beats too."""
    platform, instance, token = fleet
    platform.beat(instance, token)
    instance_drain(instance=Instance.objects.get(pk=instance.pk))
    outage.REDIS.failed()  # a call just failed: Redis is hung

    redis_untouchable(monkeypatch)
    for _ in range(3):
        platform.clock.advance(10)
        reply = platform.beat(instance, token)
        assert reply.status_code == 200 and reply.json()["state"] == "draining"


def test_a_token_revoked_while_redis_fails_is_refused_once_a_sweep_reaches_it(
        fleet, monkeypatch):
    platform, instance, token = fleet
    platform.beat(instance, token)
    platform.clock.advance(1)
    assert platform.beat(instance, token).status_code == 200  # steady, token known

    def failing():
        raise ConnectionError("Redis does not answer")

    with monkeypatch.context() as patch:
        patch.setattr(heartbeats, "_client", failing)
        row = AgentToken.objects.get(agent=instance.agent_id)
        row.revoked_at = at(platform.clock())
        row.save()  # its key's delete fails
    outage.REDIS.clear()  # Redis is back
    platform.clock.advance(1)
    instances_sweep(now=at(platform.clock()))
    assert platform.beat(instance, token).status_code == 401
