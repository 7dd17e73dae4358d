"""Usage events into rows: exactly once, whatever the gateway or the stream hands over."""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from decimal import Decimal

import orjson
import pytest
import redis

from gateway.usage import UsageQueue
from metering import ingest
from metering.ingest import (
    GROUP,
    STREAM,
    usage_events_store,
    usage_queue_drain,
    usage_stream_append,
    usage_stream_consume,
)
from metering.models import UsageEvent
from tests import factories

_ids = itertools.count(1)


def event(tenant_id: int, **kw) -> dict:
    return {
        "request_id": f"req-{uuid.uuid4().hex[:12]}-{next(_ids)}", "tenant": tenant_id,
        "agent": None, "capability": None, "instance": None, "outcome": "success",
        "input_tokens": 3, "output_tokens": 5, "cost": 0.25, "latency_ms": 12,
        "occurred_at": time.time(), **kw,
    }


@pytest.fixture
def tenant(db):
    return factories.tenant()


# ---- storing ---------------------------------------------------------------------------


def test_the_same_events_stored_twice_are_stored_once(tenant):
    first, second = event(tenant.pk), event(tenant.pk)

    assert usage_events_store([first, second]) == 2
    # Redelivered, plus one new event and a duplicate inside the batch itself.
    third = event(tenant.pk)
    assert usage_events_store([first, second, third, dict(third)]) == 1

    assert UsageEvent.objects.count() == 3
    row = UsageEvent.objects.get(request_id=first["request_id"])
    assert (row.tenant_id, row.input_tokens, row.output_tokens) == (tenant.pk, 3, 5)
    assert row.cost == Decimal("0.250000")
    assert row.occurred_at.timestamp() == pytest.approx(first["occurred_at"], abs=1e-5)


def test_a_request_id_a_caller_repeats_never_hides_a_call(tenant):
    """Callers choose X-Request-ID: twenty calls with one id, or another tenant reusing
    it, are twenty-one rows; only the gateway's own event id de-duplicates."""
    other = factories.tenant()
    calls = [event(tenant.pk, request_id="req-X", event_id=f"ev-{i}") for i in range(20)]
    calls.append(event(other.pk, request_id="req-X", event_id="ev-other"))
    assert usage_events_store(calls) == 21
    assert usage_events_store(calls[:5]) == 0  # redelivered: still once each
    assert UsageEvent.objects.filter(request_id="req-X").count() == 21
    assert UsageEvent.objects.filter(tenant=other, request_id="req-X").count() == 1


def test_malformed_events_are_skipped_and_logged_not_fatal(tenant, caplog):
    good = event(tenant.pk)
    bad = [
        "not an object",
        None,
        {k: v for k, v in event(tenant.pk).items() if k != "request_id"},
        event(tenant.pk, request_id=""),
        event(tenant.pk, request_id="x" * 129),
        event(tenant.pk, request_id="nul\x00byte"),  # PostgreSQL would reject the batch
        event(tenant.pk, tenant=True),
        event(tenant.pk, tenant="abc"),
        event(tenant.pk, outcome="exploded"),
        event(tenant.pk, input_tokens=-1),
        event(tenant.pk, output_tokens=2**31),  # beyond the column: would abort the batch
        event(tenant.pk, input_tokens=1.5),
        event(tenant.pk, cost=float("nan")),
        event(tenant.pk, cost=-0.01),
        event(tenant.pk, cost="free"),
        event(tenant.pk, occurred_at="yesterday"),
        event(tenant.pk, occurred_at=float("inf")),
        event(tenant.pk, agent=0),
    ]
    with caplog.at_level(logging.WARNING, logger="metering.ingest"):
        assert usage_events_store([*bad, good]) == 1

    assert list(UsageEvent.objects.values_list("request_id", flat=True)) == [good["request_id"]]
    assert "skipped 18 malformed events" in caplog.text


def test_numbers_are_coerced_where_unambiguous(tenant):
    raw = event(tenant.pk, tenant=str(tenant.pk), input_tokens=7.0, output_tokens="9",
                cost=0.1, latency_ms=3.0, occurred_at=1_700_000_000)
    raw.pop("agent")  # optional fields may be absent

    assert usage_events_store([raw]) == 1

    row = UsageEvent.objects.get()
    assert (row.input_tokens, row.output_tokens, row.latency_ms) == (7, 9, 3)
    assert row.cost == Decimal("0.100000")  # not 0.1000000000000000055...
    assert row.occurred_at.timestamp() == 1_700_000_000


def test_events_of_unknown_tenants_are_skipped(tenant, caplog):
    known, stray = event(tenant.pk), event(tenant.pk + 10_000)
    with caplog.at_level(logging.WARNING, logger="metering.ingest"):
        assert usage_events_store([stray, known]) == 1
    assert list(UsageEvent.objects.values_list("request_id", flat=True)) == [known["request_id"]]
    assert "unknown tenants" in caplog.text and stray["request_id"] in caplog.text


def test_deleted_agents_capabilities_and_instances_are_stored_as_null(tenant):
    kept = factories.agent(owner=tenant)
    kept_cap = factories.capability(agent=kept)
    kept_inst = factories.instance(agent=kept)
    gone = factories.agent(owner=tenant)
    gone_ids = (gone.pk, factories.capability(agent=gone).pk, factories.instance(agent=gone).pk)
    gone.delete()  # takes its capability and instance with it
    live = event(tenant.pk, agent=kept.pk, capability=kept_cap.pk, instance=kept_inst.pk)
    dead = event(tenant.pk, agent=gone_ids[0], capability=gone_ids[1], instance=gone_ids[2])

    assert usage_events_store([live, dead]) == 2

    rows = {r.request_id: r for r in UsageEvent.objects.all()}
    assert (rows[live["request_id"]].agent_id, rows[live["request_id"]].capability_id,
            rows[live["request_id"]].instance_id) == (kept.pk, kept_cap.pk, kept_inst.pk)
    assert (rows[dead["request_id"]].agent_id, rows[dead["request_id"]].capability_id,
            rows[dead["request_id"]].instance_id) == (None, None, None)


def test_embedded_mode_drains_the_gateways_queue(tenant):
    queue = UsageQueue()
    sent = [event(tenant.pk) for _ in range(2500)]
    for item in sent:
        queue.emit(item)

    assert usage_queue_drain(queue, batch=1000) == 2500
    assert len(queue) == 0 and UsageEvent.objects.count() == 2500
    assert usage_queue_drain(queue) == 0


def test_a_failed_drain_hands_the_events_back(tenant, monkeypatch):
    queue = UsageQueue()
    queue.emit(event(tenant.pk))

    def down(events):
        raise RuntimeError("database away")

    monkeypatch.setattr(ingest, "usage_events_store", down)
    with pytest.raises(RuntimeError):
        usage_queue_drain(queue)
    assert len(queue) == 1


# ---- the Redis stream ------------------------------------------------------------------


@pytest.fixture
def stream(settings):
    """A Redis client and a usage stream under a prefix of this test's own."""
    if not settings.REDIS_URL:
        pytest.skip("needs Redis: set REDIS_URL (CI does)")
    settings.REDIS_KEY_PREFIX = f"{settings.REDIS_KEY_PREFIX}{uuid.uuid4().hex[:8]}:"
    key = STREAM()
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        yield client
    finally:
        client.delete(key)
        client.close()


def append(client, events: list[dict]) -> None:
    pipe = client.pipeline(transaction=False)
    for item in events:
        usage_stream_append(pipe, item)
    pipe.execute()


def pending(client) -> int:
    return client.xpending(STREAM(), GROUP)["pending"]


def test_stream_round_trip_stores_every_event_and_acknowledges_it(transactional_db, stream):
    tenant = factories.tenant()
    sent = [event(tenant.pk, input_tokens=i) for i in range(1000)]
    append(stream, sent)

    assert usage_stream_consume(client=stream, consumer="c1", batch=300, block_ms=0) == 1000

    assert UsageEvent.objects.count() == 1000
    assert set(UsageEvent.objects.values_list("request_id", flat=True)) == {
        e["request_id"] for e in sent
    }
    assert pending(stream) == 0
    assert stream.xlen(STREAM()) == 0  # stored entries are deleted
    # Nothing new: returns at once.
    assert usage_stream_consume(client=stream, consumer="c1", block_ms=0) == 0


def test_entries_are_acknowledged_only_when_the_rows_commit(
    tenant, stream, django_capture_on_commit_callbacks
):
    append(stream, [event(tenant.pk) for _ in range(10)])

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        assert usage_stream_consume(client=stream, consumer="c1", block_ms=0) == 10
        assert pending(stream) == 10  # the test's transaction has not committed yet
    assert len(callbacks) == 1
    assert pending(stream) == 0


def test_a_failed_store_leaves_the_entries_pending_for_the_next_run(
    transactional_db, stream, monkeypatch
):
    tenant = factories.tenant()
    append(stream, [event(tenant.pk) for _ in range(20)])
    real_store = ingest.usage_events_store

    def down(events):
        raise RuntimeError("database away")

    monkeypatch.setattr(ingest, "usage_events_store", down)
    with pytest.raises(RuntimeError):
        usage_stream_consume(client=stream, consumer="c1", block_ms=0)
    assert pending(stream) == 20 and UsageEvent.objects.count() == 0

    monkeypatch.setattr(ingest, "usage_events_store", real_store)
    assert usage_stream_consume(client=stream, consumer="c1", block_ms=0) == 20
    assert pending(stream) == 0 and UsageEvent.objects.count() == 20


def test_a_consumer_that_died_before_acking_reclaims_its_entries_exactly_once(
    transactional_db, stream
):
    tenant = factories.tenant()
    sent = [event(tenant.pk) for _ in range(50)]
    append(stream, sent)
    usage_stream_consume(client=stream, consumer="probe", block_ms=0, max_batches=0)  # group
    # The process read 30 entries, stored the first 10, then died before acknowledging:
    # 10 rows committed but not acked, 20 read and never stored.
    read = stream.xreadgroup(GROUP, "worker-1", {STREAM(): ">"}, count=30)[0][1]
    assert usage_events_store([orjson.loads(fields[b"e"]) for _, fields in read[:10]]) == 10
    assert pending(stream) == 30

    # Restarted under the same name: its pending entries first, then the rest.
    assert usage_stream_consume(client=stream, consumer="worker-1", batch=7, block_ms=0) == 40

    assert UsageEvent.objects.count() == 50
    assert set(UsageEvent.objects.values_list("request_id", flat=True)) == {
        e["request_id"] for e in sent
    }
    assert pending(stream) == 0 and stream.xlen(STREAM()) == 0


def test_entries_of_a_dead_consumer_are_claimed_once_idle(transactional_db, stream):
    tenant = factories.tenant()
    append(stream, [event(tenant.pk) for _ in range(25)])
    usage_stream_consume(client=stream, consumer="probe", block_ms=0, max_batches=0)
    stream.xreadgroup(GROUP, "dead-host-1", {STREAM(): ">"}, count=25)

    # Not idle long enough: left to their owner, who may still be alive.
    assert usage_stream_consume(client=stream, consumer="live", block_ms=0) == 0
    assert pending(stream) == 25

    time.sleep(0.05)
    assert usage_stream_consume(client=stream, consumer="live", block_ms=0,
                                claim_idle_ms=20) == 25
    assert UsageEvent.objects.count() == 25 and pending(stream) == 0


def test_undecodable_entries_are_acknowledged_and_skipped(transactional_db, stream, caplog):
    tenant = factories.tenant()
    stream.xadd(STREAM(), {b"e": b"{not json"})
    stream.xadd(STREAM(), {b"other": b"field"})
    append(stream, [event(tenant.pk)])

    with caplog.at_level(logging.WARNING, logger="metering.ingest"):
        assert usage_stream_consume(client=stream, consumer="c1", block_ms=0) == 1

    assert "2 undecodable" in caplog.text
    assert pending(stream) == 0 and stream.xlen(STREAM()) == 0


def test_max_batches_bounds_one_call(transactional_db, stream):
    tenant = factories.tenant()
    append(stream, [event(tenant.pk) for _ in range(100)])

    assert usage_stream_consume(client=stream, consumer="c1", batch=30, block_ms=0,
                                max_batches=2) == 60
    assert usage_stream_consume(client=stream, consumer="c1", batch=30, block_ms=0) == 40


def test_a_batch_entry_from_the_gateway_is_stored_event_by_event(world):
    """The gateway ships up to a hundred events per stream entry (field ``b``)."""
    import orjson

    from metering.ingest import _batch_store

    class NoRedis:
        def pipeline(self, transaction=True):
            raise AssertionError("acknowledging is not reached inside the test transaction")

    events = [{"request_id": f"batch-{n}", "tenant": world.tenant_a.pk, "agent": None,
               "capability": None, "instance": None, "outcome": "success",
               "input_tokens": n, "output_tokens": 1, "cost": 0.0, "latency_ms": 1,
               "occurred_at": 1_764_000_000.0} for n in range(3)]
    stored = _batch_store(NoRedis(), "s", [(b"1-0", {b"b": orjson.dumps(events)}),
                                           (b"2-0", {b"b": b"not json"})])
    assert stored == 3
    assert UsageEvent.objects.filter(request_id__startswith="batch-").count() == 3


def test_an_agent_deleted_while_its_batch_is_stored_loses_no_event(
    transactional_db, stream, monkeypatch
):
    """helper-42 saw one consumer run fail on the foreign key when an agent was deleted
    right after calls to it: the delete committed between the batch's check of which
    agents exist and its insert. The batch rolls back, its entries stay pending, and the
    next run stores every event once, the agent as NULL."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (a second connection deletes mid-batch)")
    import psycopg

    tenant = factories.tenant()
    doomed = factories.agent(owner=tenant)
    sent = [event(tenant.pk, agent=doomed.pk) for _ in range(30)]
    append(stream, sent)
    real_existing = ingest._existing
    db = connection.settings_dict

    def then_deleted(queryset, field, values):
        alive = real_existing(queryset, field, values)
        if queryset.model.__name__ == "Agent" and doomed.pk in alive:
            with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"],
                                 dbname=db["NAME"], autocommit=True) as other:
                other.execute("DELETE FROM registry_agent WHERE id = %s", [doomed.pk])
        return alive

    monkeypatch.setattr(ingest, "_existing", then_deleted)
    with pytest.raises(Exception, match=r"(?i)foreign key|violates"):
        usage_stream_consume(client=stream, consumer="c1", block_ms=0)
    assert pending(stream) == 30 and UsageEvent.objects.count() == 0

    monkeypatch.setattr(ingest, "_existing", real_existing)
    assert usage_stream_consume(client=stream, consumer="c1", block_ms=0) == 30
    stored = UsageEvent.objects.filter(request_id__in=[e["request_id"] for e in sent])
    assert stored.count() == 30 and not stored.exclude(agent_id=None).exists()
    assert pending(stream) == 0
