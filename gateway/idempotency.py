"""Idempotency keys: a call runs at most once per (tenant, ``Idempotency-Key``).

- The first call *claims* the key with a short lease (about its deadline plus a
  margin), refreshed while it runs. A gateway that crashes mid-call leaves a lease
  that lapses within seconds, after which the same key runs again: never a key
  poisoned for a day.
- When the call ends with a result of its own (a 2xx, or a 4xx the request caused:
  invalid input) the reply is stored for 24 h and replayed to every duplicate
  (``Idempotent-Replayed: true``). Anything that decided nothing about the request
  (a 5xx, a time-out, the caller going away) drops the claim, so a retry runs.
- A duplicate arriving while the first runs waits for it (then gets its reply, or
  runs itself if the first gave up) or gets 409 ``idempotency_in_progress``.
- The same key with a different body gets 422 ``idempotency_key_reused``.

Each claim carries an owner token: only its owner refreshes, finishes or drops it,
so a call whose lease lapsed cannot overwrite the record of the call that took the
key over. Keys are stored hashed. Redis holds the records when configured (shared
by every gateway process); otherwise a dict in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import orjson

TTL_SECONDS = 24 * 3600
POLL_SECONDS = 0.02
# Replies of the call itself, worth replaying: what the request caused.
STORED_ERRORS = frozenset({"invalid_input", "malformed_json", "payload_too_large"})


@dataclass(frozen=True)
class Stored:
    status: int
    body: bytes
    # What the reply said besides its body that a replay must say too: an intent call's
    # routing (``X-Reach-Capability`` ...), which an OpenAI-shaped body has no place for.
    headers: tuple[tuple[bytes, bytes], ...] = ()


def _packed(headers: tuple[tuple[bytes, bytes], ...]) -> bytes:
    return orjson.dumps([[name.decode("latin-1"), value.decode("latin-1")]
                         for name, value in headers])


def _unpacked(raw: bytes | None) -> tuple[tuple[bytes, bytes], ...]:
    # A record stored before replies kept their headers has none.
    if not raw:
        return ()
    return tuple((name.encode("latin-1"), value.encode("latin-1"))
                 for name, value in orjson.loads(raw))


class Outcome(StrEnum):
    NEW = "new"  # claimed: this call runs
    REPLAY = "replay"
    MISMATCH = "mismatch"
    BUSY = "busy"


def fingerprint(body: bytes, intent: str | None = None) -> str:
    """What makes two requests under one key the same request: their JSON value, not
    its spelling (a client that serialises again on retry may order keys or space them
    differently), and the intent a header gave (the chat door's ``X-Reach-Intent``: a
    re-test replayed a call under the same key with another intent). A body that is not
    JSON is taken byte for byte."""
    with contextlib.suppress(orjson.JSONDecodeError, orjson.JSONEncodeError):
        body = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(body)
    if intent is not None:  # (none: the same hash as before the header counted)
        digest.update(b"\0intent:" + intent.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def record_key(tenant_pk: int, key: str) -> str:
    return f"idem:{tenant_pk}:{hashlib.sha256(key.encode()).hexdigest()}"


def new_owner() -> str:
    return os.urandom(12).hex()


def _judge(stored_hash: str, done: Stored | None, body_hash: str) -> tuple[Outcome, Stored | None]:
    if stored_hash != body_hash:
        return Outcome.MISMATCH, None
    if done is None:
        return Outcome.BUSY, None
    return Outcome.REPLAY, done


class MemoryStore:
    """The records in this process (the embedded mode). Expired ones are swept when the
    count doubles (a sweep on every claim past a fixed count made each keyed call scan
    every record); past ``MAX_RECORDS`` live ones, the oldest finished replies go first,
    so memory stays bounded — a replay older than that many later keyed calls is
    forgotten, where Redis keeps it its whole day."""

    MAX_RECORDS = 100_000
    SWEEP_ABOVE = 10_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._records: dict[str, dict] = {}
        self._clock = clock
        self._sweep_above = self.SWEEP_ABOVE

    def _sweep(self) -> None:
        now = self._clock()
        self._records = {k: r for k, r in self._records.items() if r["expires"] > now}
        if len(self._records) > self.MAX_RECORDS:
            finished = [k for k, r in self._records.items() if r["done"] is not None]
            for k in finished[:len(self._records) - self.MAX_RECORDS]:
                del self._records[k]
        self._sweep_above = max(self.SWEEP_ABOVE, min(2 * len(self._records),
                                                      self.MAX_RECORDS))

    def _live(self, key: str) -> dict | None:
        record = self._records.get(key)
        if record is not None and record["expires"] <= self._clock():
            del self._records[key]
            return None
        return record

    async def claim(self, key: str, body_hash: str, owner: str,
                    lease_s: float) -> tuple[Outcome, Stored | None]:
        if len(self._records) > self._sweep_above:
            self._sweep()
        record = self._live(key)
        if record is None:
            self._records[key] = {"hash": body_hash, "owner": owner, "done": None,
                                  "expires": self._clock() + lease_s}
            return Outcome.NEW, None
        return _judge(record["hash"], record["done"], body_hash)

    async def refresh(self, key: str, owner: str, lease_s: float) -> None:
        record = self._live(key)
        if record is not None and record["owner"] == owner and record["done"] is None:
            record["expires"] = self._clock() + lease_s

    async def finish(self, key: str, owner: str, stored: Stored, body_hash: str = "") -> None:
        record = self._live(key)
        if record is None or record["owner"] == owner:
            self._records[key] = {"hash": body_hash, "owner": owner, "done": stored,
                                  "expires": self._clock() + TTL_SECONDS}

    async def forget(self, key: str, owner: str) -> None:
        record = self._live(key)
        if record is not None and record["owner"] == owner and record["done"] is None:
            del self._records[key]


# KEYS[1] the record (a hash: hash, owner, and status + body once done).
_CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('HMGET', KEYS[1], 'hash', 'status', 'body', 'headers')
end
redis.call('HSET', KEYS[1], 'hash', ARGV[1], 'owner', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""
_REFRESH = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1]
   and redis.call('HEXISTS', KEYS[1], 'status') == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
"""
_FINISH = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'hash', ARGV[2], 'status', ARGV[3],
           'body', ARGV[4], 'headers', ARGV[6])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""
_FORGET = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1]
   and redis.call('HEXISTS', KEYS[1], 'status') == 0 then
  redis.call('DEL', KEYS[1])
end
return 1
"""


class RedisStore:
    """Records in Redis, shared by every gateway process. Raises ``redis.RedisError`` /
    ``OSError`` on Redis trouble: the pipeline decides what that means."""

    def __init__(self, client, prefix: str) -> None:
        self._prefix = prefix
        self._claim = client.register_script(_CLAIM)
        self._refresh = client.register_script(_REFRESH)
        self._finish = client.register_script(_FINISH)
        self._forget = client.register_script(_FORGET)

    async def claim(self, key: str, body_hash: str, owner: str,
                    lease_s: float) -> tuple[Outcome, Stored | None]:
        result = await self._claim(keys=[self._prefix + key],
                                   args=[body_hash, owner, max(1, int(lease_s * 1000))])
        if result == 1:
            return Outcome.NEW, None
        stored_hash, status, body, headers = result
        done = Stored(int(status), body, _unpacked(headers)) if status is not None else None
        return _judge((stored_hash or b"").decode(), done, body_hash)

    async def refresh(self, key: str, owner: str, lease_s: float) -> None:
        await self._refresh(keys=[self._prefix + key],
                            args=[owner, max(1, int(lease_s * 1000))])

    async def finish(self, key: str, owner: str, stored: Stored, body_hash: str = "") -> None:
        await self._finish(keys=[self._prefix + key],
                           args=[owner, body_hash, stored.status, stored.body, TTL_SECONDS,
                                 _packed(stored.headers)])

    async def forget(self, key: str, owner: str) -> None:
        await self._forget(keys=[self._prefix + key], args=[owner])


async def claim_or_wait(store, key: str, body_hash: str, owner: str, lease_s: float,
                        wait_s: float) -> tuple[Outcome, Stored | None]:
    """Claim the key; while another call holds it, wait (polling) up to ``wait_s`` for
    its reply, or for its claim to go, then claim again."""
    deadline = time.monotonic() + wait_s
    while True:
        outcome, stored = await store.claim(key, body_hash, owner, lease_s)
        if outcome != Outcome.BUSY or time.monotonic() >= deadline:
            return outcome, stored
        await asyncio.sleep(POLL_SECONDS)
