"""The steady-heartbeat door: ``POST /api/v1/instances/<id>/heartbeat`` answered before
Django when nothing about the instance changes (``registry.heartbeats``).

Per steady beat: a strict body parse and one Redis script, which checks the agent
token against the one the view last accepted for the instance and renews the lease.
No database, no DRF, no route-table delta, no process-local cache. Anything the door
is not sure of goes to the Django view with the request intact, which is then the
one place that judges it and words its errors: tenant keys, a token or instance Redis
does not know (yet, or any more), a body that is not exactly well-formed, a tier or
capability change, a lapsed lease, Redis away.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import json
import logging
import math
import random
import re
import time
from collections.abc import Awaitable, Callable

import orjson
from django.conf import settings
from redis.exceptions import RedisError
from rest_framework.fields import DateTimeField

from reach_core import outage, requestid
from reach_core.errors import ReachError
from registry import health, heartbeats
from registry.choices import InstanceState

logger = logging.getLogger(__name__)

# ASCII digits, no leading zero: any other spelling of an id is the view's to judge.
PATH = re.compile(r"^/api/v1/instances/([1-9][0-9]{0,17})/heartbeat/?$")
MAX_BODY = 64 * 1024
_INT_MAX = 2**31 - 1  # the columns' range
_FLOATS = ("cpu", "memory")
_INTS = ("queue_depth", "in_flight", "processed_recent", "errors_recent")
_KNOWN = frozenset((*_FLOATS, *_INTS, "capabilities_available"))
_datetime = DateTimeField()
# What Django's middleware puts on every API answer.
_HEADERS = (
    (b"content-type", b"application/json"), (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"), (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
)

App = Callable[[dict, Callable, Callable], Awaitable[None]]


def parse(body: bytes) -> tuple[health.Load, list[str] | None] | None:
    """The heartbeat in ``body``, or None unless it is exactly what the API accepts
    (the view then answers, with its errors)."""
    if not body:
        return health.Load(), None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not data.keys() <= _KNOWN:
        return None
    if body.count(b":") > len(data) and _repeats_a_key(body):
        return None  # {"cpu": .1, "cpu": .2}: the view refuses it (malformed_json)
    for name in _FLOATS:
        value = data.get(name, 0.0)
        if type(value) not in (int, float) or not (0.0 <= value <= 1.0) or (
                type(value) is float and not math.isfinite(value)):
            return None
    for name in _INTS:
        value = data.get(name, 0)
        if type(value) is not int or not 0 <= value <= _INT_MAX:
            return None
    available = data.get("capabilities_available")
    if "capabilities_available" in data and not _capability_list(available):
        return None  # null included: the view refuses it
    load = health.Load(cpu=float(data.get("cpu", 0.0)), memory=float(data.get("memory", 0.0)),
                       **{name: data.get(name, 0) for name in _INTS})
    return load, available


def _repeats_a_key(body: bytes) -> bool:
    def pairs(items):
        keys = [key for key, _ in items]
        if len(keys) != len(set(keys)):
            raise ValueError("a repeated key")
        return dict(items)

    try:
        json.loads(body, object_pairs_hook=pairs)
    except ValueError:
        return True
    return False


def _capability_list(value) -> bool:
    return type(value) is list and len(value) <= 1000 and all(
        type(c) is str and c and len(c) <= 128 and c == c.strip() for c in value)


class HeartbeatDoor:
    # Steady beats' Redis calls at once (per process): a burst waits its turn here rather
    # than open a connection per beat and make Redis late enough to look away (a break
    # test: 256 connections of beats sent every beat to the database, 50 % 503s).
    REDIS_CONCURRENCY = 32

    def __init__(self, fallback: App, *, clock: Callable[[], float] = time.time,
                 view_concurrency: int | None = None) -> None:
        self._fallback = fallback
        self._clock = clock
        self._client = self._script = None
        self._channel = f"{settings.REDIS_KEY_PREFIX}routes"
        self._redis_turns: asyncio.Semaphore | None = None
        # Beats judged by the view at once: each holds a database connection, so past the
        # pool's size they would only queue into time-outs; they get 503 at once instead,
        # with Retry-After, and come again (their lease outlives two more intervals).
        self._view_limit = view_concurrency or settings.HEARTBEAT_VIEW_CONCURRENCY
        self._view_in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        match = PATH.match(scope["path"]) if scope["method"] == "POST" else None
        if match is None:
            await self._fallback(scope, receive, send)
            return
        messages, complete = await _read(receive)
        reply = None
        if complete:
            try:
                reply = await self._steady(scope, int(match.group(1)), _body(messages))
            except Exception as exc:
                # Redis away, or anything unforeseen: the view decides.
                if isinstance(exc, RedisError | OSError):
                    outage.REDIS.failed()
                logger.debug("heartbeat door: passing on (%s)", type(exc).__name__)
        if reply is None:
            await self._judged_by_the_view(scope, _replayer(messages, receive), send)
            return
        request_id = requestid.accept_or_new(_header(scope, b"x-request-id"))
        await send({"type": "http.response.start", "status": 200, "headers": [
            *_HEADERS, (requestid.HEADER.lower().encode(), request_id.encode())]})
        await send({"type": "http.response.body", "body": reply})

    async def _judged_by_the_view(self, scope, receive, send) -> None:
        if self._view_in_flight >= self._view_limit:
            request_id = requestid.accept_or_new(_header(scope, b"x-request-id"))
            retry = ReachError("overloaded", "Too many heartbeats are being judged at once; "
                               "send this one again shortly.", retry_after=1)
            body = orjson.dumps(retry.body(request_id))
            await send({"type": "http.response.start", "status": 503, "headers": [
                *_HEADERS, (requestid.HEADER.lower().encode(), request_id.encode()),
                (b"retry-after", str(random.randint(1, 3)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        self._view_in_flight += 1
        try:
            await self._fallback(scope, receive, send)
        finally:
            self._view_in_flight -= 1

    async def _steady(self, scope, pk: int, body: bytes) -> bytes | None:
        token = _agent_token(_header(scope, b"authorization"))
        if token is None:
            return None
        if body and not _is_json(_header(scope, b"content-type")):
            return None  # the view answers 415, as for any other API call
        parsed = parse(body)
        if parsed is None:
            return None
        load, available = parsed
        if outage.REDIS.away():
            return None  # it failed a moment ago: no second wait for its timeout
        tiers = heartbeats.tier_changes(lambda current: health.tier_from_load(load, current))
        script = self._script or self._register()
        async with self._redis_turns:
            done = await self._beat(script, pk, token, tiers, available, load)
        if not isinstance(done, list):
            return None
        _, lease, interval, tier = done
        return orjson.dumps({
            "state": InstanceState.HEALTHY.value, "health_tier": tier.decode(),
            "lease_expires_at": _datetime.to_representation(
                dt.datetime.fromtimestamp(float(lease), dt.UTC)),
            "heartbeat_interval_seconds": int(interval),
        })

    async def _beat(self, script, pk: int, token: str, tiers: str, available, load):
        return await script(keys=[
            heartbeats.key(pk), heartbeats.dirty_key(),
            heartbeats.token_key(hashlib.sha256(token.encode()).hexdigest()),
        ], args=[
            repr(self._clock()), tiers, heartbeats.capabilities_digest(available), pk,
            self._channel, repr(load.cpu), repr(load.memory), load.queue_depth,
            load.in_flight, load.processed_recent, load.errors_recent,
        ])

    def _register(self):
        # Built on first use: the client belongs to the event loop serving the door.
        import redis.asyncio as aioredis

        self._client = aioredis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1,
            health_check_interval=10)
        self._script = self._client.register_script(heartbeats.BEAT_SCRIPT)
        self._redis_turns = asyncio.Semaphore(self.REDIS_CONCURRENCY)
        return self._script

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = self._script = None


def _is_json(content_type: str | None) -> bool:
    return bool(content_type) and content_type.split(";")[0].strip().lower() == \
        "application/json"


def _agent_token(authorization: str | None) -> str | None:
    """The agent token presented, if one is (tenant keys go to the view)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith("rat_") or len(token) > 200:
        return None
    return token


def _header(scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def _read(receive) -> tuple[list[dict], bool]:
    """The request's messages up to ``MAX_BODY`` bytes; ``complete`` False if it stopped
    short (too big, or the client went away)."""
    messages, size = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, False
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            return messages, True
        if size > MAX_BODY:
            return messages, False


def _body(messages: list[dict]) -> bytes:
    return b"".join(m.get("body", b"") for m in messages)


def _replayer(messages: list[dict], receive):
    """A ``receive`` that gives the view what was read, then the rest."""
    pending = list(messages)

    async def replay():
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
