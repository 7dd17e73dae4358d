"""Idempotency keys: the first response to (tenant, Idempotency-Key) is kept 24 h and replayed.

- a duplicate after the first finished gets the stored response (status and body);
- a duplicate while the first is still running waits for it, then gets its response,
  or 409 ``idempotency_in_progress`` if it does not finish within the wait;
- the same key with a different request body gets 422 ``idempotency_key_reused``;
- a first call that failed with a 5xx (or crashed) is forgotten, so a retry runs again.

So the agent runs once and the call is metered once. Non-streamed calls only.
Redis holds the records when configured (shared by every gateway process);
otherwise a dict in this process. Keys are stored hashed.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass

import orjson

TTL_SECONDS = 24 * 3600
POLL_SECONDS = 0.02


@dataclass(frozen=True)
class Stored:
    status: int
    body: bytes


def fingerprint(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def record_key(tenant_pk: int, key: str) -> str:
    return f"idem:{tenant_pk}:{hashlib.sha256(key.encode()).hexdigest()}"


class Outcome:
    NEW = "new"
    REPLAY = "replay"
    MISMATCH = "mismatch"
    BUSY = "busy"


class MemoryStore:
    def __init__(self, clock=time.monotonic) -> None:
        self._records: dict[str, dict] = {}
        self._clock = clock

    async def claim(self, key: str, body_hash: str) -> tuple[str, Stored | None]:
        self._expire()
        record = self._records.get(key)
        if record is None:
            self._records[key] = {"hash": body_hash, "done": None, "at": self._clock()}
            return Outcome.NEW, None
        return _judge(record["hash"], record["done"], body_hash)

    async def peek(self, key: str, body_hash: str) -> tuple[str, Stored | None]:
        record = self._records.get(key)
        if record is None:
            return Outcome.NEW, None
        return _judge(record["hash"], record["done"], body_hash)

    async def finish(self, key: str, stored: Stored) -> None:
        if key in self._records:
            self._records[key]["done"] = stored

    async def forget(self, key: str) -> None:
        self._records.pop(key, None)

    def _expire(self) -> None:
        if len(self._records) < 10_000:
            return
        horizon = self._clock() - TTL_SECONDS
        for key in [k for k, r in self._records.items() if r["at"] < horizon]:
            del self._records[key]


class RedisStore:
    def __init__(self, client, prefix: str) -> None:
        self._client = client
        self._prefix = prefix

    async def claim(self, key: str, body_hash: str) -> tuple[str, Stored | None]:
        pending = orjson.dumps({"hash": body_hash})
        if await self._client.set(self._prefix + key, pending, nx=True, ex=TTL_SECONDS):
            return Outcome.NEW, None
        return await self.peek(key, body_hash)

    async def peek(self, key: str, body_hash: str) -> tuple[str, Stored | None]:
        raw = await self._client.get(self._prefix + key)
        if raw is None:
            return Outcome.NEW, None
        record = orjson.loads(raw)
        done = Stored(record["status"], record["body"].encode()) if "status" in record else None
        return _judge(record["hash"], done, body_hash)

    async def finish(self, key: str, stored: Stored) -> None:
        peeked = await self._client.get(self._prefix + key)
        body_hash = orjson.loads(peeked)["hash"] if peeked else ""
        await self._client.set(self._prefix + key, orjson.dumps({
            "hash": body_hash, "status": stored.status, "body": stored.body.decode(),
        }), ex=TTL_SECONDS)

    async def forget(self, key: str) -> None:
        await self._client.delete(self._prefix + key)


def _judge(stored_hash: str, done: Stored | None, body_hash: str) -> tuple[str, Stored | None]:
    if stored_hash != body_hash:
        return Outcome.MISMATCH, None
    if done is None:
        return Outcome.BUSY, None
    return Outcome.REPLAY, done


async def wait_for_first(store, key: str, body_hash: str, seconds: float):
    """Poll until the first call finishes (or is forgotten) or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(POLL_SECONDS)
        outcome, stored = await store.peek(key, body_hash)
        if outcome != Outcome.BUSY:
            return outcome, stored
    return Outcome.BUSY, None
