"""Usage events into ``UsageEvent`` rows, exactly once.

Delivery is at-least-once: a Redis stream read through a consumer group in
production, the gateway's in-process queue in embedded mode. Rows are
exactly-once because ``request_id`` is unique and inserts ignore conflicts, so a
re-delivered event is a no-op. Stream entries are acknowledged only after the
transaction holding their rows has committed: a crash before the commit leaves
them pending (they are read again), a crash between commit and acknowledgement
re-delivers events whose rows already exist (ignored).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import Any

import orjson
import redis
from django.conf import settings
from django.db import models, transaction

from metering.choices import Outcome
from metering.models import UsageEvent
from metering.rollups import pending_mark
from reach_core.queues import Drainable, drain_into
from registry.models import Agent, Capability, Instance
from tenants.models import Tenant
from tools.models import Tool

logger = logging.getLogger(__name__)

GROUP = "metering"
FIELD = b"e"
# The gateway ships events in batches: one entry, a JSON list, per batch.
BATCH_FIELD = b"b"
# An entry another consumer has held unacknowledged this long belongs to a dead
# consumer: far longer than storing one batch takes.
CLAIM_IDLE_MS = 60_000

_INT_MAX = 2**31 - 1  # PositiveIntegerField's ceiling on PostgreSQL
_PK_MAX = 2**63 - 1
_COST_MAX = Decimal(10) ** 8  # DecimalField(max_digits=14, decimal_places=6)
_COST_QUANTUM = Decimal("0.000001")
_OUTCOMES = frozenset(Outcome.values)
# Keeps each ``__in`` list under SQLite's bound-parameter limit on old builds.
_IN_CHUNK = 500
# Per batch, so a flood of bad events cannot flood the log.
_LOG_SAMPLE = 5

StreamEntry = tuple[Any, Mapping[Any, Any] | None]


# Upper case as the key is a constant; a function so it follows the (test) prefix setting.
def STREAM() -> str:
    return settings.REDIS_KEY_PREFIX + "usage"


class _Malformed(ValueError):
    pass


# ---- validation ------------------------------------------------------------------------


def _int(raw: Mapping[str, Any], name: str, *, low: int = 0, high: int = _INT_MAX,
         nullable: bool = False, default: int | None = None) -> int | None:
    value = raw.get(name, default)
    if value is None:
        if nullable:
            return None
        raise _Malformed(f"{name} missing")
    # bool is an int to Python, never to the gateway.
    if isinstance(value, bool):
        raise _Malformed(f"{name} is a boolean")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if not isinstance(value, int):
        raise _Malformed(f"{name} is not an integer")
    if not low <= value <= high:
        raise _Malformed(f"{name} out of range")
    return value


def _cost(raw: Mapping[str, Any]) -> Decimal:
    value = raw.get("cost", 0)
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise _Malformed("cost is not a number")
    try:
        # str() first: Decimal(0.1) would carry the float's binary noise.
        cost = Decimal(str(value)).quantize(_COST_QUANTUM)
    except (InvalidOperation, ValueError) as exc:
        raise _Malformed("cost is not a number") from exc
    if not cost.is_finite() or cost < 0 or cost >= _COST_MAX:
        raise _Malformed("cost out of range")
    return cost


def _float(raw: Mapping[str, Any], name: str, *, low: float = 0.0,
           high: float = 1e9) -> float | None:
    """An optional measurement: absent or null is None; anything else must be a number
    in range (a row with a wrong one is malformed, as for the other fields)."""
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Malformed(f"{name} is not a number")
    if not math.isfinite(value) or not low <= value <= high:
        raise _Malformed(f"{name} out of range")
    return float(value)


def _occurred_at(raw: Mapping[str, Any]) -> datetime:
    value = raw.get("occurred_at")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Malformed("occurred_at is not epoch seconds")
    if not math.isfinite(value) or value < 0:
        raise _Malformed("occurred_at out of range")
    try:
        return datetime.fromtimestamp(value, tz=UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise _Malformed("occurred_at out of range") from exc


def _event_fields(raw: Any) -> dict[str, Any]:
    """A gateway event as ``UsageEvent`` field values; raises ``_Malformed``."""
    if not isinstance(raw, Mapping):
        raise _Malformed("not an object")
    request_id = raw.get("request_id")
    # PostgreSQL refuses NUL in text: one such id would abort the whole batch.
    if (not isinstance(request_id, str) or not request_id or len(request_id) > 128
            or "\x00" in request_id):
        raise _Malformed("request_id missing or invalid")
    # The gateway's own id for the call: a caller picks its X-Request-ID, so that id
    # cannot be what makes a row unique. Events without one (older gateways) use it.
    event_id = raw.get("event_id", request_id)
    if (not isinstance(event_id, str) or not event_id or len(event_id) > 128
            or "\x00" in event_id):
        raise _Malformed("event_id invalid")
    outcome = raw.get("outcome")
    if outcome not in _OUTCOMES:
        raise _Malformed("unknown outcome")
    return {
        "event_id": event_id,
        "request_id": request_id,
        "tenant_id": _int(raw, "tenant", low=1, high=_PK_MAX),
        "agent_id": _int(raw, "agent", low=1, high=_PK_MAX, nullable=True),
        "capability_id": _int(raw, "capability", low=1, high=_PK_MAX, nullable=True),
        "instance_id": _int(raw, "instance", low=1, high=_PK_MAX, nullable=True),
        "outcome": outcome,
        "input_tokens": _int(raw, "input_tokens", default=0),
        "output_tokens": _int(raw, "output_tokens", default=0),
        "cost": _cost(raw),
        "latency_ms": _int(raw, "latency_ms", default=0),
        "occurred_at": _occurred_at(raw),
        "retries": _int(raw, "retries", default=0, high=32767),
        "route_score": _float(raw, "route_score", low=-1e6, high=1e6),
        "route_ms": _float(raw, "route_ms"),
        "upstream_ms": _float(raw, "upstream_ms"),
        "first_byte_ms": _float(raw, "first_byte_ms"),
        "tool_id": _int(raw, "tool", low=1, high=_PK_MAX, nullable=True),
        "caller_agent_id": _int(raw, "caller_agent", low=1, high=_PK_MAX, nullable=True),
        "argument_digest": _digest(raw),
        "upstream_status": _int(raw, "upstream_status", low=100, high=599, nullable=True),
    }


def _digest(raw: Mapping[str, Any]) -> str:
    value = raw.get("argument_digest") or ""
    if not isinstance(value, str) or len(value) > 64 or not all(
            c in "0123456789abcdef" for c in value):
        raise _Malformed("argument_digest is not a hex SHA-256")
    return value


def _existing(queryset: models.QuerySet, field: str, values: Iterable[Any]) -> set[Any]:
    wanted = sorted({v for v in values if v is not None})
    found: set[Any] = set()
    for start in range(0, len(wanted), _IN_CHUNK):
        chunk = wanted[start:start + _IN_CHUNK]
        found.update(queryset.filter(**{f"{field}__in": chunk}).values_list(field, flat=True))
    return found


# ---- storing ---------------------------------------------------------------------------


@transaction.atomic
def usage_events_store(events: Iterable[Any]) -> int:
    """Store gateway usage events; returns how many rows are new.

    Malformed events and events of unknown tenants are logged and skipped, never
    fail the batch; agents, capabilities and instances deleted since the call
    are stored as NULL. Events already stored (same ``event_id``) are ignored.
    """
    rows: dict[str, dict[str, Any]] = {}
    rejected: list[str] = []
    for raw in events:
        try:
            fields = _event_fields(raw)
        except _Malformed as exc:
            rid = raw.get("request_id") if isinstance(raw, Mapping) else None
            rejected.append(f"{rid!r:.80}: {exc}")  # ids may be huge
            continue
        # A duplicate inside one batch: the first copy wins, as it would across batches.
        rows.setdefault(fields["event_id"], fields)
    if rejected:
        logger.warning("usage: skipped %d malformed events, e.g. %s", len(rejected),
                       "; ".join(rejected[:_LOG_SAMPLE]))
    if not rows:
        return 0

    values = list(rows.values())
    tenants = _existing(Tenant.objects.all(), "pk", (r["tenant_id"] for r in values))
    orphans = [r["request_id"] for r in values if r["tenant_id"] not in tenants]
    if orphans:
        # A usage row needs its tenant (PROTECT); a tenant that is gone bills nobody.
        logger.warning("usage: skipped %d events of unknown tenants, e.g. %s", len(orphans),
                       ", ".join(orphans[:_LOG_SAMPLE]))
        values = [r for r in values if r["tenant_id"] in tenants]
    for model, field in ((Agent, "agent_id"), (Capability, "capability_id"),
                         (Instance, "instance_id"), (Agent, "caller_agent_id"),
                         (Tool, "tool_id")):
        alive = _existing(model.objects.all(), "pk", (r[field] for r in values))
        for row in values:
            if row[field] is not None and row[field] not in alive:
                row[field] = None

    # Counted inside the transaction; a concurrent consumer storing the same ids at
    # the same moment can make the count high, never the rows.
    known = _existing(UsageEvent.objects.all(), "event_id", (r["event_id"] for r in values))
    UsageEvent.objects.bulk_create(
        [UsageEvent(**row) for row in values], ignore_conflicts=True, batch_size=_IN_CHUNK
    )
    # In this transaction: the rollups of these hours and days are stale until rebuilt,
    # however late the events arrived, and reports read their events meanwhile.
    pending_mark(r["occurred_at"] for r in values if r["event_id"] not in known)
    return sum(1 for r in values if r["event_id"] not in known)


def usage_queue_drain(queue: Drainable, *, batch: int = 1000, max_batches: int = 100) -> int:
    """Embedded mode: move the gateway's in-process queue into rows; returns rows stored."""
    return drain_into(queue, usage_events_store, batch=batch, max_batches=max_batches)


# ---- the Redis stream ------------------------------------------------------------------


def usage_stream_append(client: redis.Redis | redis.client.Pipeline,
                        event: Mapping[str, Any]) -> Any:
    """Append one event to the usage stream (``client`` may be a pipeline).

    No MAXLEN: trimming could only drop events nobody has consumed yet; the
    consumer deletes what it has stored.
    """
    return client.xadd(STREAM(), {FIELD: orjson.dumps(event)})


def _group_ensure(client: redis.Redis, stream: str) -> None:
    try:
        # From "0": events appended before the group existed are billed too.
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _entries(reply: Any) -> list[StreamEntry]:
    """XREADGROUP's reply (RESP2 list or RESP3 dict) as ``[(id, fields), ...]``."""
    if not reply:
        return []
    if isinstance(reply, Mapping):  # RESP3: {stream: [[entry, ...]]}
        return [entry for wrapped in reply.values() for entries in wrapped for entry in entries]
    return [entry for _stream, entries in reply for entry in entries]


def _ack(client: redis.Redis, stream: str, ids: Sequence[Any]) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.xack(stream, GROUP, *ids)
    # Stored entries have no other reader: deleting them keeps the stream short.
    pipe.xdel(stream, *ids)
    pipe.execute()


def _batch_store(client: redis.Redis, stream: str, entries: Sequence[StreamEntry]) -> int:
    events: list[Any] = []
    undecodable = 0
    for _entry_id, fields in entries:
        # None: the entry was deleted while pending; it is acknowledged below.
        if not fields:
            continue
        batch = fields.get(BATCH_FIELD, fields.get(BATCH_FIELD.decode()))
        raw = fields.get(FIELD, fields.get(FIELD.decode()))
        try:
            if batch is not None:
                decoded = orjson.loads(batch)
                if not isinstance(decoded, list):
                    raise TypeError("a batch entry holds a list")
                events.extend(decoded)
            else:
                events.append(orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError):
            undecodable += 1
    if undecodable:
        logger.warning("usage: skipped %d undecodable stream entries", undecodable)
    stored = usage_events_store(events)
    # Runs right away outside a transaction, else when the outermost one commits;
    # never if it rolls back, which leaves the entries pending to be read again.
    transaction.on_commit(partial(_ack, client, stream, [eid for eid, _ in entries]))
    return stored


def usage_stream_consume(*, client: redis.Redis, consumer: str, batch: int = 500,
                         block_ms: int = 1000, max_batches: int | None = None,
                         claim_idle_ms: int = CLAIM_IDLE_MS) -> int:
    """Store usage events from the stream; returns how many rows were new.

    In order: this consumer's own pending entries (read before a crash, never
    acknowledged), entries idle longer than ``claim_idle_ms`` at other (dead)
    consumers, then new entries. Returns at the first empty read of new entries
    or after ``max_batches`` non-empty batches. ``block_ms <= 0`` does not block.
    """
    stream = STREAM()
    _group_ensure(client, stream)
    stored = 0
    done = 0

    def more() -> bool:
        return max_batches is None or done < max_batches

    # Paged by the last id seen, not "0" again: inside an outer transaction the
    # acknowledgements wait for its commit and "0" would return the same entries.
    last: Any = "0"
    while more():
        entries = _entries(client.xreadgroup(GROUP, consumer, {stream: last}, count=batch))
        if not entries:
            break
        stored += _batch_store(client, stream, entries)
        done += 1
        last = entries[-1][0]

    start: Any = "0-0"
    while more():
        reply = client.xautoclaim(stream, GROUP, consumer, min_idle_time=claim_idle_ms,
                                  start_id=start, count=batch)
        start, claimed = reply[0], [e for e in reply[1] if e]
        if claimed:
            stored += _batch_store(client, stream, claimed)
            done += 1
        if start in (b"0-0", "0-0"):
            break

    while more():
        entries = _entries(client.xreadgroup(GROUP, consumer, {stream: ">"}, count=batch,
                                             block=block_ms if block_ms > 0 else None))
        if not entries:
            break
        stored += _batch_store(client, stream, entries)
        done += 1
    return stored
