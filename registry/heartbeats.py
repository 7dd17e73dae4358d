"""Steady heartbeats: renewed in Redis, written to PostgreSQL in batches.

A heartbeat that changes nothing structural is a *steady beat*: the instance is
healthy, its lease has not lapsed, its tier and served capabilities are what they
were, and no flap is due to be forgiven. One Redis script checks the agent token,
renews the lease in a hash per instance, marks the instance for the next flush and
publishes the load report (unversioned, applied in O(1) by every gateway). Nothing
else runs, in any process, whatever the fleet size: no database, no cache to warm.

Every other heartbeat goes to the view (``registry.services.instance_heartbeat``):
PostgreSQL is updated, a versioned delta goes out if the state changed, and the
hash is seeded again from the row, with the token the view accepted. The hash thus
mirrors a healthy row as the last judged heartbeat left it; any other write to the
row or its agent (drain, deregistration, the sweep, a probe's recovery, a
registration) deletes it, and revoking a token or disabling its tenant deletes the
token's key, so the next beat is judged by the database again.

``flush`` (run by the lease sweep, every 2 s) writes the steady beats' leases and
load to PostgreSQL, one statement per batch, and only to rows still healthy; a row
found not healthy loses its hash. Without ``REDIS_URL`` there is no script and every
heartbeat goes to the view (the embedded mode has one process).

Lost to a Redis restart: at most the beats since the last flush, which only sends
the next beat to the view. With Redis unreachable, heartbeats go to the view.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from django.conf import settings
from django.db import connection, transaction

from reach_core import outage

logger = logging.getLogger(__name__)

FLUSH_BATCH = 1000
# A hash outlives its lease by this much, so the flush still finds the figures.
HASH_GRACE_S = 60.0
# How long an agent token, once accepted by the view, is honoured by the script while
# the agent keeps beating. Revocation and tenant deactivation delete it at once.
TOKEN_TTL_MS = 3600 * 1000
# How long after revocation the sweep keeps deleting a token's key (see
# forget_refused_tokens): far longer than any Redis outage it has to outlast.
REFUSED_TOKENS_KEPT = dt.timedelta(days=1)
LOAD_FIELDS = ("cpu", "memory", "queue_depth", "in_flight", "processed_recent",
               "errors_recent")

# KEYS: the instance's hash, the dirty set, the presented agent token's key.
# ARGV: now, the tiers the load gives from each current tier (",healthy=…,overloaded=…,
# sub_healthy=…,", see tier_changes), capabilities digest ("" = unchanged), instance pk, the bus
# channel, then the load figures in LOAD_FIELDS order.
# Returns {1, lease, interval, tier} for a steady beat (done), 0 when the view must
# judge it.
BEAT_SCRIPT = """
local cur = redis.call('HMGET', KEYS[1], 'lease', 'tier', 'caps', 'review', 'agent',
                       'ttl', 'interval')
if not cur[1] then return 0 end
if redis.call('GET', KEYS[3]) ~= cur[5] then return 0 end
local now = tonumber(ARGV[1])
if tonumber(cur[1]) <= now then return 0 end
if not string.find(ARGV[2], ',' .. cur[2] .. '=' .. cur[2] .. ',', 1, true) then return 0 end
if ARGV[3] ~= '' and cur[3] ~= ARGV[3] then return 0 end
local review = tonumber(cur[4])
if review > 0 and review < now then return 0 end
local lease = now + tonumber(cur[6])
local lease_text = string.format('%.6f', lease)
redis.call('HSET', KEYS[1], 'lease', lease_text, 'beat', ARGV[1],
  'cpu', ARGV[6], 'memory', ARGV[7], 'queue_depth', ARGV[8], 'in_flight', ARGV[9],
  'processed_recent', ARGV[10], 'errors_recent', ARGV[11])
redis.call('PEXPIRE', KEYS[1], math.floor((tonumber(cur[6]) + GRACE) * 1000))
redis.call('PEXPIRE', KEYS[3], TOKEN_TTL_MS)
redis.call('SADD', KEYS[2], ARGV[4])
redis.call('PUBLISH', ARGV[5], cjson.encode({type = 'load', agent_pk = tonumber(cur[5]),
  instance_pk = tonumber(ARGV[4]), cpu = tonumber(ARGV[6]), memory = tonumber(ARGV[7]),
  queue_depth = tonumber(ARGV[8]), in_flight = tonumber(ARGV[9]),
  lease_expires_at = lease}))
return {1, lease_text, cur[7], cur[2]}
""".replace("GRACE", repr(HASH_GRACE_S)).replace("TOKEN_TTL_MS", str(TOKEN_TTL_MS))


TIERS = ("healthy", "overloaded", "sub_healthy")


def tier_changes(tier_from: Callable[[str], str]) -> str:
    """For the script: the tier the load gives from each current tier, so it can tell
    whether this beat leaves the instance's tier as it is (hysteresis depends on it)."""
    return "," + "".join(f"{t}={tier_from(t)}," for t in TIERS)


def capabilities_digest(capabilities: list[str] | None) -> str:
    """What the hash keeps of an instance's served capabilities ("" = not given)."""
    if capabilities is None:
        return ""
    joined = "\x00".join(sorted(set(capabilities)))
    return "c" + hashlib.sha256(joined.encode()).hexdigest()[:24]


def key(pk: int) -> str:
    return f"{settings.REDIS_KEY_PREFIX}hb:{pk}"


def token_key(key_hash: str) -> str:
    """Keyed by the token's SHA-256, as stored in the database: never the token."""
    return f"{settings.REDIS_KEY_PREFIX}hbtok:{key_hash}"


def dirty_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}hb:dirty"


def _client():
    return _client_for(settings.REDIS_URL)


@cache
def _client_for(url: str):
    import redis

    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1,
                                health_check_interval=10)


def enabled() -> bool:
    return bool(settings.REDIS_URL)


# ---- what the view writes -------------------------------------------------------------


@dataclass(frozen=True)
class Steady:
    """A healthy row as a slow heartbeat left it: what later beats are compared with."""

    pk: int
    agent_pk: int
    lease: float
    lease_ttl_s: int
    interval_s: int
    tier: str
    capabilities: list[str]
    # Epoch seconds after which the view must look again (a flap to forgive); 0 never.
    review: float


def seed(steady: Steady, *, now: float) -> None:
    """After a slow heartbeat of a healthy instance, committed."""
    if not enabled() or outage.REDIS.away():
        return
    try:
        pipe = _client().pipeline(transaction=True)
        _seed_into(pipe, steady, now=now)
        pipe.execute()
    except Exception as exc:
        outage.REDIS.failed()
        # The next beat then goes to the view again; nothing is lost.
        logger.warning("heartbeats: could not seed instance %s (%s)", steady.pk,
                       type(exc).__name__)


def _seed_into(pipe, steady: Steady, *, now: float) -> None:
    pipe.hset(key(steady.pk), mapping={
        "lease": repr(steady.lease), "tier": steady.tier, "agent": str(steady.agent_pk),
        "caps": capabilities_digest(steady.capabilities), "review": repr(steady.review),
        "ttl": str(steady.lease_ttl_s), "interval": str(steady.interval_s),
    })
    pipe.pexpire(key(steady.pk), int((steady.lease - now + HASH_GRACE_S) * 1000))


def seed_token(key_hash: str, agent_pk: int) -> None:
    """The view accepted this agent token for a heartbeat: the script may too."""
    if not enabled() or outage.REDIS.away():
        return
    try:
        _client().set(token_key(key_hash), str(agent_pk), px=TOKEN_TTL_MS)
    except Exception as exc:
        outage.REDIS.failed()
        logger.warning("heartbeats: could not seed a token (%s)", type(exc).__name__)


def forget(*pks: int) -> None:
    """The rows changed otherwise: the next beat of each is judged by the database.

    Skipped while Redis is away: a hash left behind is bounded by the next flush, which
    writes only to healthy rows and deletes the others' hashes."""
    if not outage.REDIS.away():
        _delete([key(pk) for pk in pks])


def forget_tokens(*key_hashes: str) -> None:
    """Revoked or their tenant disabled: the next beat with each goes to the view.
    Always tried, Redis away or not: nothing else would delete a revoked token's key."""
    _delete([token_key(h) for h in key_hashes])


def _delete(keys: list[str]) -> None:
    if not enabled() or not keys:
        return
    try:
        _client().delete(*keys)
    except Exception as exc:
        outage.REDIS.failed()
        # Logged loudly; a revoked token's key left behind is deleted by the next sweep
        # that reaches Redis (forget_refused_tokens).
        logger.error("heartbeats: could not delete %d key(s) (%s)", len(keys),
                     type(exc).__name__)


def forget_on_commit(*pks: int) -> None:
    if enabled() and pks:
        transaction.on_commit(lambda: forget(*pks))


def forget_tokens_on_commit(*key_hashes: str) -> None:
    if enabled() and key_hashes:
        transaction.on_commit(lambda: forget_tokens(*key_hashes))


def forget_refused_tokens(*, now: dt.datetime) -> int:
    """Delete the keys of the tokens the view would refuse: revoked in the last day, or
    of a disabled tenant. Run by every sweep, so a delete that failed at revocation time
    (Redis away) is retried until it succeeds. Returns the tokens looked at."""
    if not enabled() or outage.REDIS.away():
        return 0
    from django.db.models import Q

    from registry.models import AgentToken

    hashes = list(AgentToken.objects.filter(
        Q(revoked_at__gte=now - REFUSED_TOKENS_KEPT) | Q(agent__owner_tenant__is_active=False)
    ).values_list("key_hash", flat=True))
    for start in range(0, len(hashes), 1000):
        _delete([token_key(h) for h in hashes[start:start + 1000]])
    return len(hashes)


def renewed_lease(pk: int) -> dt.datetime | None:
    """The lease a steady beat renewed that the database may not have yet."""
    if not enabled() or outage.REDIS.away():
        return None
    try:
        value = _client().hget(key(pk), "lease")
    except Exception:
        outage.REDIS.failed()
        return None
    return None if value is None else dt.datetime.fromtimestamp(float(value), dt.UTC)


# ---- the flush ------------------------------------------------------------------------


def memory_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}hb:memory"


def reseed_if_forgotten(*, now: dt.datetime) -> int:
    """After Redis lost its data (a restart without persistence, a failover), every
    instance's next beat would go to the view at once: a 10,000-agent fleet is ten times
    what the view can judge per second, and leases would lapse while it queued. So when
    the marker this writes is gone, the steady records of every healthy instance with a
    live lease, and the keys of the agent tokens the view would accept, are written again
    from the database, as the view would write them. Returns the instances seeded."""
    if not enabled():
        return 0
    client = _client()
    if client.exists(memory_key()):
        return 0
    from registry.choices import InstanceState
    from registry.models import AgentToken, Instance

    seeded = 0
    pipe = client.pipeline(transaction=False)
    rows = (Instance.objects.filter(state=InstanceState.HEALTHY, lease_expires_at__gt=now,
                                    agent__owner_tenant__is_active=True)
            .values_list("pk", "agent_id", "lease_expires_at", "health_tier",
                         "capabilities_available", "flaps", "last_flap_at",
                         "agent__lease_ttl_seconds", "agent__heartbeat_interval_seconds"))
    # Fetched whole: through a server-side cursor PostgreSQL plans this join for the
    # first rows, and it took 28 s at 50,000 instances (the whole reseed 1.8 s so).
    for (pk, agent_pk, lease, tier, available, flaps, last_flap_at, ttl_s,
         interval_s) in list(rows):
        review = (last_flap_at + 2 * dt.timedelta(seconds=ttl_s)).timestamp() \
            if flaps and last_flap_at else 0.0
        _seed_into(pipe, Steady(pk=pk, agent_pk=agent_pk, lease=lease.timestamp(),
                                lease_ttl_s=ttl_s, interval_s=interval_s, tier=tier,
                                capabilities=list(available), review=review),
                   now=now.timestamp())
        seeded += 1
        if seeded % 5000 == 0:
            pipe.execute()
    tokens = AgentToken.objects.filter(revoked_at__isnull=True,
                                       agent__owner_tenant__is_active=True)
    for key_hash, agent_pk in list(tokens.values_list("key_hash", "agent_id")):
        pipe.set(token_key(key_hash), str(agent_pk), px=TOKEN_TTL_MS)
    pipe.set(memory_key(), "1")
    pipe.execute()
    if seeded:
        logger.warning("heartbeats: Redis had forgotten the steady records; %d reseeded "
                       "from the database", seeded)
    return seeded


def flush(*, max_batches: int = 100) -> int:
    """Write the steady beats since the last flush to PostgreSQL. Returns rows written."""
    if not enabled():
        return 0
    client = _client()
    written = 0
    for _ in range(max_batches):
        pks = [int(pk) for pk in client.spop(dirty_key(), FLUSH_BATCH) or ()]
        if not pks:
            break
        try:
            written += _write(client, pks)
        except Exception:
            # The database is away: put them back for the next flush.
            client.sadd(dirty_key(), *pks)
            raise
        if len(pks) < FLUSH_BATCH:
            break
    return written


def _write(client, pks: list[int]) -> int:
    pipe = client.pipeline(transaction=False)
    for pk in pks:
        pipe.hmget(key(pk), "lease", "beat", *LOAD_FIELDS)
    rows = []
    for pk, values in zip(pks, pipe.execute(), strict=True):
        if values[0] is None or values[1] is None:
            continue  # forgotten meanwhile
        lease, beat = (dt.datetime.fromtimestamp(float(v), dt.UTC) for v in values[:2])
        cpu, memory = float(values[2]), float(values[3])
        rows.append((pk, lease, beat, cpu, memory, *(int(v) for v in values[4:])))
    if not rows:
        return 0
    from registry.choices import InstanceState
    from registry.models import Instance

    with transaction.atomic():
        updated = _update_healthy(rows)
    missing = {row[0] for row in rows} - updated
    if missing:
        # Not written: gone, not healthy, or already holding a later lease (a slow
        # heartbeat). The first two must stop taking the steady way.
        healthy = set(Instance.objects.filter(pk__in=missing, state=InstanceState.HEALTHY)
                      .values_list("pk", flat=True))
        forget(*(missing - healthy))
    return len(updated)


def _update_healthy(rows: list[tuple]) -> set[int]:
    from registry.models import Instance

    table = Instance._meta.db_table
    if connection.vendor == "postgresql":
        values = ", ".join(["(%s::bigint, %s::timestamptz, %s::timestamptz, %s::float8, "
                            "%s::float8, %s::int, %s::int, %s::int, %s::int)"] * len(rows))
        sets = ", ".join(f"{name} = v.{name}" for name in
                         ("lease_expires_at", "last_heartbeat_at", *LOAD_FIELDS))
        # Names come from the model, values are bound.
        sql = (f"UPDATE {table} AS i SET {sets} FROM (VALUES {values}) AS "  # noqa: S608
               f"v(id, lease_expires_at, last_heartbeat_at, {', '.join(LOAD_FIELDS)}) "
               "WHERE i.id = v.id AND i.state = 'healthy' AND "
               "(i.lease_expires_at IS NULL OR i.lease_expires_at < v.lease_expires_at) "
               "RETURNING i.id")
        with connection.cursor() as cursor:
            cursor.execute(sql, [value for row in rows for value in row])
            return {pk for (pk,) in cursor.fetchall()}
    # Another database behind Redis (unusual): one statement per row.
    from django.db.models import Q

    from registry.choices import InstanceState

    updated = set()
    for pk, lease, beat, *load in rows:
        if Instance.objects.filter(
            Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=lease),
            pk=pk, state=InstanceState.HEALTHY,
        ).update(lease_expires_at=lease, last_heartbeat_at=beat,
                 **dict(zip(LOAD_FIELDS, load, strict=True))):
            updated.add(pk)
    return updated
