"""Learning from use: route feedback in, per-tenant learned phrases out.

The gateway reports which capability an intent should have reached (a caller's
``POST /v1/route/feedback``, or inferred from an explicit capability call made soon
after a dry run or a failed intent call by the same key). The events travel as usage
events do: a bounded in-process queue, shipped to a Redis stream in production (read
here through a consumer group, acknowledged after the commit) or drained in process in
embedded mode; ``event_id`` is unique, so a re-delivered event is a no-op.

A periodic fold (``route_feedback_learn``) turns the *misses* (the router chose another
capability, or none) into ``LearnedPhrase`` rows: the intent normalised, per tenant and
capability, with the feedback counted as support. A phrase is **routable** (shipped in
the route table, matched by the router) when all of these hold:

- it has at least one explicit feedback, or ``MIN_INFERRED_SUPPORT`` (2) in all: one
  inference alone may be a caller changing its mind, a caller's own word is enough;
- an operator has not deactivated it (``active``);
- it is the best supported capability for that phrase in its tenant (feedback that
  contradicts itself never makes one phrase pull towards two capabilities);
- it is among the ``MAX_PHRASES_PER_CAPABILITY`` (50) best supported phrases of its
  tenant and capability.

Ties go to the more explicit, then the more recent. Confirmations (``routed_to`` equal
to ``capability_id``) are kept for the record and teach nothing. Learned phrases are
per tenant from end to end: rows, route-table entries (``learned_by_tenant``) and the
router's lookup are keyed by the tenant whose key sent the feedback.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import Any

import orjson
import redis
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from reach_core.queues import Drainable, drain_into
from registry import routes
from registry.choices import FeedbackSource
from registry.models import LearnedPhrase, RouteFeedback
from routing.text import asks_for_something, phrase_of
from tenants.models import Tenant

logger = logging.getLogger(__name__)

MIN_INFERRED_SUPPORT = 2
MAX_PHRASES_PER_CAPABILITY = 50
MAX_INTENT_CHARS = 1000
FEEDBACK_KEEP = dt.timedelta(days=90)

GROUP = "learning"
BATCH_FIELD = b"b"  # the gateway ships a JSON list per stream entry (``ship_to_redis``)
CLAIM_IDLE_MS = 60_000
_SOURCES = frozenset(FeedbackSource.values)
_LOG_SAMPLE = 5
# Trimmed from a phrase's ends: "translate this!" and "translate this" are one phrase.


# Upper case as the key is a constant; a function so it follows the (test) prefix setting.
def STREAM() -> str:
    return settings.REDIS_KEY_PREFIX + "route_feedback"


# ---- phrases -------------------------------------------------------------------------------


def phrase_normalise(text: str) -> str:
    """An intent as a learned phrase (``routing.text.phrase_of``, which the matcher
    compares requests in too), at most ``MAX_INTENT_CHARS``. Empty when nothing is left."""
    return phrase_of(text)[:MAX_INTENT_CHARS]


def phrase_hash(phrase: str) -> str:
    return hashlib.sha256(phrase.encode()).hexdigest()


# ---- storing events ------------------------------------------------------------------------


class _Malformed(ValueError):
    pass


def _text(raw: Mapping, name: str, *, high: int, low: int = 1) -> str:
    value = raw.get(name, "" if low == 0 else None)
    # PostgreSQL refuses NUL in text: one such value would abort the whole batch.
    if not isinstance(value, str) or not low <= len(value) <= high or "\x00" in value:
        raise _Malformed(f"{name} missing or invalid")
    return value


def _event_fields(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _Malformed("not an object")
    tenant = raw.get("tenant")
    if isinstance(tenant, bool) or not isinstance(tenant, int) or tenant < 1:
        raise _Malformed("tenant invalid")
    source = raw.get("source")
    if source not in _SOURCES:
        raise _Malformed("unknown source")
    occurred = raw.get("occurred_at")
    if isinstance(occurred, bool) or not isinstance(occurred, int | float) \
            or not math.isfinite(occurred) or not 0 <= occurred < 2**33:
        raise _Malformed("occurred_at invalid")
    return {
        "event_id": _text(raw, "event_id", high=64),
        "request_id": _text(raw, "request_id", high=128, low=0),
        "tenant_id": tenant,
        "intent": _text(raw, "intent", high=MAX_INTENT_CHARS),
        "capability_id": _text(raw, "capability", high=128),
        "routed_to": _text(raw, "routed_to", high=128, low=0),
        "source": source,
        "created_at": dt.datetime.fromtimestamp(occurred, tz=dt.UTC),
    }


@transaction.atomic
def route_feedback_store(events: Iterable[Any]) -> int:
    """Store the gateway's feedback events; returns how many are new. Malformed events and
    those of unknown tenants are logged and skipped, never fail the batch; an event stored
    before (same ``event_id``) is ignored."""
    rows: dict[str, dict[str, Any]] = {}
    rejected: list[str] = []
    for raw in events:
        try:
            fields = _event_fields(raw)
        except _Malformed as exc:
            rejected.append(str(exc))
            continue
        rows.setdefault(fields["event_id"], fields)
    if rejected:
        logger.warning("route feedback: skipped %d malformed events, e.g. %s", len(rejected),
                       "; ".join(rejected[:_LOG_SAMPLE]))
    if not rows:
        return 0
    tenants = set(Tenant.objects.filter(pk__in={r["tenant_id"] for r in rows.values()})
                  .values_list("pk", flat=True))
    values = [r for r in rows.values() if r["tenant_id"] in tenants]
    known = set(RouteFeedback.objects.filter(event_id__in=[r["event_id"] for r in values])
                .values_list("event_id", flat=True))
    RouteFeedback.objects.bulk_create([RouteFeedback(**r) for r in values],
                                      ignore_conflicts=True, batch_size=500)
    return sum(1 for r in values if r["event_id"] not in known)


def route_feedback_queue_drain(queue: Drainable, *, batch: int = 1000,
                               max_batches: int = 20) -> int:
    """Embedded mode: the gateway's in-process feedback queue into rows."""
    return drain_into(queue, route_feedback_store, batch=batch, max_batches=max_batches)


# ---- the Redis stream ----------------------------------------------------------------------


def _entries(reply: Any) -> list[tuple[Any, Mapping | None]]:
    """XREADGROUP's reply (RESP2 list or RESP3 dict) as ``[(id, fields), ...]``."""
    if not reply:
        return []
    if isinstance(reply, Mapping):
        return [entry for wrapped in reply.values() for entries in wrapped for entry in entries]
    return [entry for _stream, entries in reply for entry in entries]


def _ack(client: redis.Redis, stream: str, ids: Sequence[Any]) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.xack(stream, GROUP, *ids)
    pipe.xdel(stream, *ids)
    pipe.execute()


def _store_entries(client: redis.Redis, stream: str,
                   entries: Sequence[tuple[Any, Mapping | None]]) -> int:
    events: list[Any] = []
    for _entry_id, fields in entries:
        if not fields:  # deleted while pending: acknowledged below
            continue
        batch = fields.get(BATCH_FIELD, fields.get(BATCH_FIELD.decode()))
        try:
            decoded = orjson.loads(batch)
        except (orjson.JSONDecodeError, TypeError):
            logger.warning("route feedback: skipped an undecodable stream entry")
            continue
        events.extend(decoded if isinstance(decoded, list) else ())
    with transaction.atomic():
        stored = route_feedback_store(events)
        # Acknowledged once the rows are committed; a rollback leaves them pending.
        transaction.on_commit(partial(_ack, client, stream, [eid for eid, _ in entries]))
    return stored


def route_feedback_consume(*, client: redis.Redis, consumer: str, batch: int = 500,
                           max_batches: int = 20, claim_idle_ms: int = CLAIM_IDLE_MS) -> int:
    """Store feedback events from the stream; returns how many rows are new. In order:
    this consumer's own pending entries (read before a crash), entries idle longer than
    ``claim_idle_ms`` at other (dead) consumers, then new ones; at most ``max_batches``
    non-empty batches, never blocking."""
    stream = STREAM()
    try:
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    stored = done = 0
    last: Any = "0"  # paged by the last id: acks may wait for an outer commit
    while done < max_batches:
        entries = _entries(client.xreadgroup(GROUP, consumer, {stream: last}, count=batch))
        if not entries:
            break
        stored += _store_entries(client, stream, entries)
        done, last = done + 1, entries[-1][0]
    start: Any = "0-0"
    while done < max_batches:
        start, claimed = client.xautoclaim(stream, GROUP, consumer, min_idle_time=claim_idle_ms,
                                           start_id=start, count=batch)[:2]
        claimed = [e for e in claimed if e]
        if claimed:
            stored += _store_entries(client, stream, claimed)
            done += 1
        if start in (b"0-0", "0-0"):
            break
    while done < max_batches:
        entries = _entries(client.xreadgroup(GROUP, consumer, {stream: ">"}, count=batch))
        if not entries:
            break
        stored += _store_entries(client, stream, entries)
        done += 1
    return stored


# ---- folding feedback into phrases ---------------------------------------------------------


def _serialise() -> None:
    """Folds and rankings one at a time (a transaction-scoped advisory lock): two at once
    would both create a phrase, or rank a tenant from each other's stale reads."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)",
                           [zlib.crc32(b"registry.learning")])


def route_feedback_learn(*, batch: int = 1000, max_batches: int = 20,
                         now: dt.datetime | None = None) -> dict[str, int]:
    """Fold feedback not learned yet into learned phrases, re-rank the tenants it touched
    (publishing the phrases that became routable or stopped being so), and forget
    feedback older than ``FEEDBACK_KEEP``. Returns counts for the log."""
    now = now or timezone.now()
    totals = {"feedback": 0, "phrases": 0, "published": 0}
    for _ in range(max_batches):
        counts = _learn_batch(batch=batch, now=now)
        for name, value in counts.items():
            totals[name] += value
        if counts["feedback"] < batch:
            break
    totals["forgotten"], _ = RouteFeedback.objects.filter(
        created_at__lt=now - FEEDBACK_KEEP, learned_at__isnull=False).delete()
    return totals


@transaction.atomic
def _learn_batch(*, batch: int, now: dt.datetime) -> dict[str, int]:
    _serialise()
    rows = list(RouteFeedback.objects.filter(learned_at__isnull=True).order_by("pk")
                .values_list("pk", "tenant_id", "capability_id", "routed_to", "intent",
                             "source")[:batch])
    if not rows:
        return {"feedback": 0, "phrases": 0, "published": 0}
    groups: dict[tuple[int, str, str], list] = {}
    for pk, tenant_id, capability_id, routed_to, intent, source in rows:
        phrase = phrase_normalise(intent)
        if routed_to == capability_id or not asks_for_something(phrase):
            continue  # a confirmation, or nothing to learn ("帮我", "ok")
        group = groups.setdefault((tenant_id, capability_id, phrase), [[], 0])
        group[0].append(pk)
        group[1] += source == FeedbackSource.EXPLICIT
    RouteFeedback.objects.filter(pk__in=[r[0] for r in rows]).update(learned_at=now)
    for (tenant_id, capability_id, phrase), (pks, explicit) in sorted(groups.items()):
        learned = _phrase_add(tenant_id=tenant_id, capability_id=capability_id,
                              phrase=phrase, support=len(pks), explicit=explicit, now=now)
        RouteFeedback.objects.filter(pk__in=pks).update(learned=learned)
    published = learned_phrases_rank(tenant_ids={t for t, _, _ in groups}, lock=False)
    return {"feedback": len(rows), "phrases": len(groups), "published": published}


def _phrase_add(*, tenant_id: int, capability_id: str, phrase: str, support: int,
                explicit: int, now: dt.datetime) -> int:
    """The pk of the phrase, its support raised. Queryset writes, not ``save()``: a phrase
    reaches the route table only through ``learned_phrases_rank``, which publishes only
    what changed (a save would publish every phrase on every fold)."""
    digest = phrase_hash(phrase)
    existing = LearnedPhrase.objects.filter(tenant_id=tenant_id, capability_id=capability_id,
                                            phrase_hash=digest)
    if existing.update(support=F("support") + support,
                       explicit_support=F("explicit_support") + explicit, updated_at=now):
        return existing.values_list("pk", flat=True).get()
    try:
        with transaction.atomic():
            [row] = LearnedPhrase.objects.bulk_create([LearnedPhrase(
                tenant_id=tenant_id, capability_id=capability_id, phrase=phrase,
                phrase_hash=digest, support=support, explicit_support=explicit)])
            return row.pk
    except IntegrityError:  # made meanwhile outside the fold's lock (an operator)
        existing.update(support=F("support") + support,
                        explicit_support=F("explicit_support") + explicit, updated_at=now)
        return existing.values_list("pk", flat=True).get()


def _eligible(row: Mapping) -> bool:
    return row["active"] and (row["explicit_support"] >= 1
                              or row["support"] >= MIN_INFERRED_SUPPORT)


def _rank(row: Mapping) -> tuple:
    return (-row["support"], -row["explicit_support"], -row["updated_at"].timestamp(),
            -row["pk"])


def learned_phrases_rank(*, tenant_ids: Iterable[int], lock: bool = True) -> int:
    """Decide which of these tenants' phrases are routable (see the module docstring) and
    publish each one that changed; returns how many changed."""
    changed = 0
    with transaction.atomic():
        if lock:
            _serialise()
        for tenant_id in sorted(set(tenant_ids)):
            rows = list(LearnedPhrase.objects.filter(tenant_id=tenant_id).values(
                "pk", "capability_id", "phrase_hash", "support", "explicit_support",
                "active", "routable", "updated_at"))
            best_for_phrase: dict[str, dict] = {}
            for row in sorted(filter(_eligible, rows), key=_rank):
                best_for_phrase.setdefault(row["phrase_hash"], row)
            per_capability: dict[str, list[dict]] = {}
            for row in sorted(best_for_phrase.values(), key=_rank):
                per_capability.setdefault(row["capability_id"], []).append(row)
            wanted = {row["pk"] for kept in per_capability.values()
                      for row in kept[:MAX_PHRASES_PER_CAPABILITY]}
            on = [r["pk"] for r in rows if r["pk"] in wanted and not r["routable"]]
            off = [r["pk"] for r in rows if r["pk"] not in wanted and r["routable"]]
            LearnedPhrase.objects.filter(pk__in=on).update(routable=True)
            LearnedPhrase.objects.filter(pk__in=off).update(routable=False)
            for pk in (*on, *off):
                routes.changed("learned", pk)
            changed += len(on) + len(off)
    return changed


def learned_phrases_set_active(*, phrases: Iterable[LearnedPhrase], active: bool) -> int:
    """An operator's switch: deactivated phrases leave the route table (and the next best
    may take a place); reactivated ones compete again. Returns how many changed."""
    pks = [p.pk for p in phrases if p.active != active]
    with transaction.atomic():
        _serialise()
        rows = LearnedPhrase.objects.filter(pk__in=pks)
        tenant_ids = set(rows.values_list("tenant_id", flat=True))
        updated = rows.update(active=active)
        learned_phrases_rank(tenant_ids=tenant_ids, lock=False)
    return updated
