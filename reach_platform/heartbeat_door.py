"""The steady-heartbeat door: ``POST /api/v1/instances/<id>/heartbeat`` answered before
Django when nothing about the instance changes (``registry.heartbeats``).

Per steady beat: a cached agent-token check, a cached instance lookup, a strict body
parse and one Redis script; no database, no DRF, no route-table delta. Anything the
door is not sure of goes to the Django view with the request intact, which is then
the one place that judges it and words its errors: tenant keys, unknown or
uncached tokens and instances (the door looks them up once, then caches them),
bodies that are not exactly well-formed, a tier or capability change, a lapsed
lease, Redis away.

Caching trades freshness for speed within bounds: a revoked agent token or a
disabled tenant still renews leases for up to ``TOKEN_CACHE_S``; an agent's changed
lease TTL or interval applies after ``INSTANCE_CACHE_S``. Drains, deregistrations and
the sweep take effect at the next beat (they delete the instance's steady record).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from asgiref.sync import sync_to_async
from django.conf import settings
from rest_framework.fields import DateTimeField

from reach_core import requestid
from registry import health, heartbeats
from registry.choices import InstanceState
from routing.table import LoadReport, load_to_wire

logger = logging.getLogger(__name__)

PATH = re.compile(r"^/api/v1/instances/(\d{1,18})/heartbeat/?$")
TOKEN_CACHE_S = 10.0
INSTANCE_CACHE_S = 30.0
MAX_BODY = 64 * 1024
_INT_MAX = 2**31 - 1  # the columns' range
_FLOATS = ("cpu", "memory")
_INTS = ("queue_depth", "in_flight", "processed_recent", "errors_recent")
_KNOWN = frozenset((*_FLOATS, *_INTS, "capabilities_available"))
_datetime = DateTimeField()

App = Callable[[dict, Callable, Callable], Awaitable[None]]


@dataclass(frozen=True)
class InstanceFacts:
    agent_pk: int
    lease_ttl_s: int
    interval_s: int


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
    if available is not None and not _capability_list(available):
        return None
    load = health.Load(cpu=float(data.get("cpu", 0.0)), memory=float(data.get("memory", 0.0)),
                       **{name: data.get(name, 0) for name in _INTS})
    return load, available


def _capability_list(value) -> bool:
    return type(value) is list and len(value) <= 1000 and all(
        type(c) is str and c and len(c) <= 128 and c == c.strip() for c in value)


class HeartbeatDoor:
    def __init__(self, fallback: App, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._fallback = fallback
        self._clock = clock
        self._monotonic = monotonic
        self._tokens: dict[str, tuple[int, float]] = {}  # sha256 -> (agent pk, until)
        self._instances: dict[int, tuple[InstanceFacts, float]] = {}
        self._client = self._script = None
        self._channel = f"{settings.REDIS_KEY_PREFIX}routes"
        self.steady = 0  # beats answered here
        self.passed = 0  # beats handed to the view

    async def __call__(self, scope, receive, send) -> None:
        match = PATH.match(scope["path"]) if scope["method"] == "POST" else None
        if match is None:
            await self._fallback(scope, receive, send)
            return
        messages, complete = await _read(receive)
        replay = _replayer(messages, receive)
        reply = None
        if complete:
            try:
                reply = await self._steady(scope, int(match.group(1)), _body(messages))
            except Exception as exc:
                # Redis or the database away, or anything unforeseen: the view decides.
                logger.debug("heartbeat door: passing on (%s)", type(exc).__name__)
        if reply is None:
            self.passed += 1
            await self._fallback(scope, replay, send)
            return
        self.steady += 1
        request_id = requestid.accept_or_new(_header(scope, b"x-request-id"))
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"x-content-type-options", b"nosniff"),
            (requestid.HEADER.lower().encode(), request_id.encode()),
        ]})
        await send({"type": "http.response.body", "body": reply})

    async def _steady(self, scope, pk: int, body: bytes) -> bytes | None:
        agent_pk = await self._agent_of(_header(scope, b"authorization"))
        if agent_pk is None:
            return None
        facts = await self._facts(pk)
        if facts is None or facts.agent_pk != agent_pk:
            return None
        parsed = parse(body)
        if parsed is None:
            return None
        load, available = parsed
        now = self._clock()
        lease = now + facts.lease_ttl_s
        tier = health.tier_from_load(load)
        message = orjson.dumps(load_to_wire(LoadReport(
            agent_pk=agent_pk, instance_pk=pk, cpu=load.cpu, memory=load.memory,
            queue_depth=load.queue_depth, in_flight=load.in_flight, lease_expires_at=lease)))
        script = self._script or self._register()
        done = await script(keys=[heartbeats.key(pk), heartbeats.dirty_key()], args=[
            repr(now), repr(lease), str(tier), heartbeats.capabilities_digest(available),
            heartbeats.hash_ttl_ms(lease, now), pk, message, self._channel,
            repr(load.cpu), repr(load.memory), load.queue_depth, load.in_flight,
            load.processed_recent, load.errors_recent,
        ])
        if done != 1:
            return None
        return orjson.dumps({
            "state": InstanceState.HEALTHY.value, "health_tier": str(tier),
            "lease_expires_at": _datetime.to_representation(
                dt.datetime.fromtimestamp(lease, dt.UTC)),
            "heartbeat_interval_seconds": facts.interval_s,
        })

    def _register(self):
        # Built on first use: the client belongs to the event loop serving the door.
        import redis.asyncio as aioredis

        self._client = aioredis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1,
            health_check_interval=10)
        self._script = self._client.register_script(heartbeats.BEAT_SCRIPT)
        return self._script

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = self._script = None

    async def _agent_of(self, authorization: str | None) -> int | None:
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token.startswith("rat_"):
            return None  # tenant keys: the view
        digest = hashlib.sha256(token.encode()).hexdigest()
        cached = self._tokens.get(digest)
        now = self._monotonic()
        if cached is not None and cached[1] > now:
            return cached[0]
        agent_pk = await sync_to_async(_agent_for_token)(token)
        if agent_pk is not None:
            if len(self._tokens) > 100_000:
                self._tokens.clear()  # bounded: a flood of tokens cannot grow it
            self._tokens[digest] = (agent_pk, now + TOKEN_CACHE_S)
        return agent_pk

    async def _facts(self, pk: int) -> InstanceFacts | None:
        cached = self._instances.get(pk)
        now = self._monotonic()
        if cached is not None and cached[1] > now:
            return cached[0]
        facts = await sync_to_async(_facts_for_instance)(pk)
        if facts is not None:
            if len(self._instances) > 1_000_000:
                self._instances.clear()
            self._instances[pk] = (facts, now + INSTANCE_CACHE_S)
        return facts


def _agent_for_token(token: str) -> int | None:
    from registry.services import agent_token_authenticate

    result = agent_token_authenticate(plaintext=token)
    return None if isinstance(result, str) else result.agent_id


def _facts_for_instance(pk: int) -> InstanceFacts | None:
    from registry.models import Instance

    row = (Instance.objects.filter(pk=pk)
           .values_list("agent_id", "agent__lease_ttl_seconds",
                        "agent__heartbeat_interval_seconds").first())
    return None if row is None else InstanceFacts(*row)


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
