"""Builds the gateway, and the whole ASGI application, from Django settings: the one
place their parts are chosen. Import it after Django is set up (``reach_platform.asgi``).

Embedded mode (no ``REDIS_URL``): in-process idempotency records, rate limits,
budget counters, usage and route-feedback queues (drained by the run command's
scheduler). Production: all of them shared through Redis by every gateway process,
usage shipped to the Redis stream the metering workers consume and route feedback to
the one the registry's learning task consumes. The app is
complete when constructed; nothing is patched in afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

import orjson
from django.conf import settings

from gateway import tracing
from gateway.app import GatewayApp
from gateway.breaker import CircuitBreakers
from gateway.budgets import MemoryBudgets, RedisBudgets
from gateway.config import GatewayConfig
from gateway.governance import Governor
from gateway.idempotency import MemoryStore, RedisStore
from gateway.limits import InProcessLimiter, LeasingLimiter, RedisLimiter
from gateway.metrics import (
    BREAKER_TRIPS,
    LIMITS_DEGRADED,
    MULTIPROCESS,
    ROUTE_FEEDBACK_DROPPED,
    ROUTE_PROPAGATION,
    USAGE_BACKLOG,
)
from gateway.observe import TransitionCounter
from gateway.route_feedback import FeedbackRecorder
from gateway.tasks import EngineSettings, TaskDoors
from gateway.tunnel import RedisDirectory, TunnelHub
from gateway.usage import UsageQueue, ship_to_redis
from gateway.usage_spool import UsageSpool
from reach_platform.endpoints import endpoint_policy
from routing.router import IntentIndexHolder, Router
from routing.table import RouteTable

logger = logging.getLogger(__name__)


# Besides /v1/: the gateway's other doors.
GATEWAY_PATHS = frozenset({"/metrics", "/mcp"})


def gateway_config() -> GatewayConfig:
    return GatewayConfig(
        policy=endpoint_policy(),
        credential_keys=tuple(settings.CREDENTIAL_KEYS),
        credential_env=tuple(settings.CREDENTIAL_ENV),
        credential_files=settings.CREDENTIAL_FILES,
        max_body_bytes=settings.GATEWAY_MAX_BODY_BYTES,
        body_timeout_s=settings.GATEWAY_BODY_TIMEOUT_S,
        stream_idle_timeout_s=settings.GATEWAY_STREAM_IDLE_S,
        internal_networks=settings.GATEWAY_INTERNAL_NETWORKS,
        metrics_networks=settings.METRICS_NETWORKS, metrics_token=settings.METRICS_TOKEN,
        max_in_flight=settings.GATEWAY_MAX_IN_FLIGHT,
        tenant_share=settings.GATEWAY_TENANT_SHARE,
        intent_cpu_ms_per_s=settings.GATEWAY_INTENT_CPU_MS_PER_S,
        intent_cpu_burst_ms=settings.GATEWAY_INTENT_CPU_BURST_MS,
        max_loop_lag_ms=settings.GATEWAY_MAX_LOOP_LAG_MS,
        upstream_wait_s=settings.GATEWAY_UPSTREAM_WAIT_S,
        # The gateway counts per process and per minute, the API per window: one limit.
        max_auth_failures_per_minute=settings.AUTH_FAILURE_LIMIT,
    )


def circuit_breakers() -> CircuitBreakers:
    return CircuitBreakers(
        window_seconds=settings.GATEWAY_BREAKER_WINDOW_S,
        failure_ratio=settings.GATEWAY_BREAKER_FAILURE_RATIO,
        min_volume=settings.GATEWAY_BREAKER_MIN_VOLUME,
        cooldown_seconds=settings.GATEWAY_BREAKER_COOLDOWN_S,
        on_open=lambda pk: BREAKER_TRIPS.labels(str(pk)).inc(),
    )


def tool_digest_key() -> bytes:
    """The key of the tool calls' argument digests (``gateway.tools.digest``): derived
    from the secret key, the same in every process, useless for anything else."""
    import hashlib

    return hashlib.sha256(b"reach tool-call argument digest\x00"
                          + settings.SECRET_KEY.encode()).digest()


def tool_breakers() -> CircuitBreakers:
    """One breaker per tool, with the agents' settings (and no instance to count)."""
    return CircuitBreakers(
        window_seconds=settings.GATEWAY_BREAKER_WINDOW_S,
        failure_ratio=settings.GATEWAY_BREAKER_FAILURE_RATIO,
        min_volume=settings.GATEWAY_BREAKER_MIN_VOLUME,
        cooldown_seconds=settings.GATEWAY_BREAKER_COOLDOWN_S,
    )


def build_gateway(*, table: Callable[[], RouteTable], router: Router,
                  governed: bool = True, run_tasks: bool | None = None,
                  ready: Callable[[], bool] = lambda: True) -> GatewayApp:
    """The gateway for this process's settings. ``governed=False`` leaves out admission
    and metering, to measure what they cost (``bench/metering.py``); never in production.
    ``run_tasks``: this process runs asynchronous tasks too (by default only the embedded
    mode does: in production the task workers do, ``reach_platform.task_worker``).
    """
    from reach_platform.task_store import DjangoTaskStore

    tracing.configure_from_environment()
    usage = UsageQueue(spool=usage_spool()) if governed else None
    if usage is not None and not MULTIPROCESS:
        USAGE_BACKLOG.set_function(usage.__len__)  # else each worker sets it (refresh_gauges)
    # Smaller than usage's: an event holds up to 1,000 characters of intent.
    route_feedback = FeedbackRecorder(UsageQueue(10_000, on_drop=ROUTE_FEEDBACK_DROPPED.inc))
    if run_tasks is None:
        run_tasks = not settings.REDIS_URL
    tasks = TaskDoors(DjangoTaskStore())
    if not settings.REDIS_URL:
        governor = Governor(limiter=InProcessLimiter(), ledger=MemoryBudgets(),
                            on_degraded=LIMITS_DEGRADED.inc)
        return GatewayApp(table=table, router=router, config=gateway_config(),
                          breakers=circuit_breakers(), governor=governor if governed else None,
                          usage=usage, idempotency=MemoryStore(), tasks=tasks,
                          engine=engine_settings(None) if run_tasks else None,
                          tunnels=TunnelHub(table=table, authenticate=agent_of_token),
                          route_feedback=route_feedback, ready=ready,
                          tool_breakers=tool_breakers(), authenticate_agent=agent_of_token,
                          tool_digest_key=tool_digest_key())

    prefix = settings.REDIS_KEY_PREFIX
    client = redis_client(settings.REDIS_URL)
    governor = Governor(
        limiter=LeasingLimiter(RedisLimiter(client, prefix=prefix,
                                            fail_open=settings.RATE_LIMIT_FAIL_OPEN)),
        ledger=RedisBudgets(client, prefix),
        # Redis away: each process keeps the limit with a bucket of its own, so a limit
        # admits at most its rate x the number of gateway processes.
        fallback=InProcessLimiter() if settings.RATE_LIMIT_FAIL_OPEN else None,
        on_degraded=LIMITS_DEGRADED.inc,
    )
    background = []
    if usage is not None:
        background.append(lambda: ship_to_redis(usage, client, prefix + "usage"))
    background.append(lambda: ship_to_redis(route_feedback.queue, client,
                                            prefix + "route_feedback", what="route feedback"))
    breakers = circuit_breakers()
    background.append(lambda: publish_breakers(breakers, client, prefix))
    channel = prefix + "tasks"

    async def ring() -> None:
        await client.publish(channel, b"1")

    tasks.rings.append(ring)
    return GatewayApp(table=table, router=router, config=gateway_config(),
                      breakers=breakers, governor=governor if governed else None,
                      usage=usage, idempotency=RedisStore(client, prefix),
                      idempotency_fail_open=settings.IDEMPOTENCY_FAIL_OPEN,
                      background=background, closers=[client.aclose], tasks=tasks,
                      engine=engine_settings(lambda: wakeups(client, channel))
                      if run_tasks else None,
                      tunnels=TunnelHub(table=table, authenticate=agent_of_token,
                                        directory=RedisDirectory(client, prefix),
                                        relay=channel_layer()),
                      route_feedback=route_feedback, ready=ready,
                          tool_breakers=tool_breakers(), authenticate_agent=agent_of_token,
                          tool_digest_key=tool_digest_key())


BREAKERS_TTL_S = 10


async def publish_breakers(breakers: CircuitBreakers, client, prefix: str,
                           every_s: float = 2.0) -> None:
    """Forever: this process's breakers that are not closed, in Redis for the console
    (``<prefix>breakers:<host>-<pid>``, expiring unless renewed, so a gone process's
    vanish). Redis away: tried again at the next turn."""
    key = f"{prefix}breakers:{socket.gethostname()}-{os.getpid()}"
    while True:
        states = {str(pk): str(state) for pk, state in breakers.states().items()}
        try:
            await client.set(key, orjson.dumps(states), ex=BREAKERS_TTL_S)
        except Exception as exc:  # Redis away: the console shows no breakers meanwhile
            logger.debug("breakers not published (%s)", type(exc).__name__)
        await asyncio.sleep(every_s)


def channel_layer():
    """The channel layer (channels-redis with ``REDIS_URL``): calls for a tunnel held by
    another gateway process are relayed through it."""
    from channels.layers import get_channel_layer

    return get_channel_layer()


async def agent_of_token(token: str) -> int | None:
    """The agent an agent token stands for (None when refused): asked of the database,
    once per tunnel connection, never per call."""
    from django.db import close_old_connections

    from registry.tokens import agent_token_authenticate

    def authenticate():
        close_old_connections()
        try:
            found = agent_token_authenticate(plaintext=token)
        finally:
            close_old_connections()
        return None if isinstance(found, str) else found.agent_id

    try:
        return await asyncio.to_thread(authenticate)
    except Exception as exc:  # the database away: the agent tries again later
        logger.warning("tunnel: could not check an agent token (%s)", type(exc).__name__)
        return None


def engine_settings(wakeups) -> EngineSettings:
    return EngineSettings(worker=f"{socket.gethostname()}-{os.getpid()}",
                          concurrency=settings.TASK_CONCURRENCY,
                          lease_s=settings.TASK_LEASE_S, wakeups=wakeups)


async def wakeups(client, channel: str):
    """The task doorbell's rings (Redis pub/sub), resubscribing after an outage; a ring
    missed meanwhile costs a poll interval, no more."""
    while True:
        try:
            async with client.pubsub(ignore_subscribe_messages=True) as pubsub:
                await pubsub.subscribe(channel)
                while True:
                    message = await pubsub.get_message(timeout=5.0)
                    if message is not None:
                        yield message
        except Exception as exc:  # Redis away: the engine polls the database meanwhile
            logger.warning("task doorbell: subscription lost (%s)", type(exc).__name__)
            await asyncio.sleep(1.0)


def usage_spool() -> UsageSpool | None:
    """This process's usage spool; None, said loudly, when its directory cannot be
    written: calls go on, their events only in memory until shipped, as without one."""
    try:
        return UsageSpool(settings.USAGE_SPOOL_DIR)
    except OSError as exc:
        logger.error("usage spool: %s is not usable (%s); a gateway process killed before "
                     "shipping its usage events loses them (set REACH_USAGE_SPOOL_DIR)",
                     settings.USAGE_SPOOL_DIR, exc)
        return None


def redis_client(url: str):
    """The gateway's Redis client, built to outlive Redis restarts: connections checked
    before use after 10 s idle, one quick retry on a dropped connection, a bounded
    pool whose callers wait at most a second for a connection, and a gate that stops
    asking a Redis that stopped answering (``gateway.redis_gate``)."""
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from gateway.redis_gate import gated

    # A second by default, and the retry's: a busy gateway (its event loop late to read
    # answers) must not take a working Redis for a hung one. Half a second without the
    # retry did, under a burst of 600 calls on two gateways, and the gate (below) then
    # ran the rate limits per process: 184 admitted where 60 may.
    wait_s = settings.REDIS_TIMEOUT_S
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=64, timeout=wait_s, socket_timeout=wait_s,
        socket_connect_timeout=wait_s,
        health_check_interval=10, socket_keepalive=True,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=1),
        retry_on_error=[RedisConnectionError, RedisTimeoutError, ConnectionResetError])
    return gated(pool)


def build_application(*, governed: bool = True):
    """``(asgi_application, gateway)`` for this process: a route-table subscriber kept
    current in background threads, the router over it, the gateway, and the protocol
    router that sends ``/v1/`` and ``/metrics`` to the gateway and the rest to Django."""
    from channels.routing import ProtocolTypeRouter
    from django.core.asgi import get_asgi_application

    from reach_platform.asgi_body import bounded_bodies

    django_application = get_asgi_application()
    if settings.SERVE_API:
        django_application = heartbeat_door(django_application)
    django_application = with_request_id(bounded_bodies(
        django_application, max_bytes=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
        timeout_s=settings.GATEWAY_BODY_TIMEOUT_S))
    if not settings.SERVE_GATEWAY:
        return control_plane_only(django_application), None
    gateway = following_gateway(governed=governed)

    if not settings.SERVE_API:
        django_application = _only_health_checks(django_application, gateway)

    async def http_application(scope, receive, send) -> None:
        # A prefix test rather than Channels' URLRouter: this runs for every gateway
        # call, and URL resolution plus a scope copy cost more than the test does.
        path = scope["path"]
        if path.startswith("/v1/") or path in GATEWAY_PATHS:
            await gateway(scope, receive, send)
        else:
            await django_application(scope, receive, send)

    application = ProtocolTypeRouter({
        "http": http_application, "websocket": gateway, "lifespan": gateway,
    })
    return application, gateway


def following_gateway(*, governed: bool = True, run_tasks: bool | None = None) -> GatewayApp:
    """A gateway over a route table this process follows from now on (threads of its own:
    the first load, the bus, the periodic check) and the intent index kept with it."""
    from reach_platform.routes_runtime import (
        map_large_blocks,
        return_freed_memory,
        start_route_subscriber,
    )
    from routing.embedders import configured_embedder

    map_large_blocks()
    runtime = start_route_subscriber()
    runtime.subscriber.on_propagated = ROUTE_PROPAGATION.observe
    counter = TransitionCounter()
    counter(runtime.subscriber.table)
    runtime.subscriber.on_change(counter)
    intents = IntentIndexHolder(embedder=configured_embedder(settings.INTENT_EMBEDDER),
                                threshold=settings.INTENT_THRESHOLD)
    intents.follow(runtime.subscriber, after_first=return_freed_memory)
    # Leases are judged as of the moment this process lost its sources, if it did: an
    # outage of ours (the database, the bus) must not look like every agent dying.
    return build_gateway(table=lambda: runtime.subscriber.table,
                         router=Router(index=intents, clock=runtime.subscriber.lease_clock),
                         governed=governed, run_tasks=run_tasks,
                         ready=lambda: runtime.subscriber.serving)


def with_request_id(application):
    """Django's requests under their request id from the first byte to the last: the lines
    Django writes after its middleware returned (``django.request``'s 4xx warnings) and
    the server's access line carry it too. ``RequestIdMiddleware`` takes it from here."""
    from reach_core import requestid

    async def wrapped(scope, receive, send) -> None:
        if scope["type"] != "http":
            await application(scope, receive, send)
            return
        request_id = requestid.accept_or_new(_header(scope, b"x-request-id"))
        scope["reach.request_id"] = request_id
        token = requestid.current.set(request_id)
        try:
            await application(scope, receive, send)
        finally:
            requestid.current.reset(token)

    return wrapped


def heartbeat_door(django_application):
    """Django behind the steady-heartbeat door when heartbeats have Redis to go to."""
    if not settings.REDIS_URL:
        return django_application
    from reach_platform.heartbeat_door import HeartbeatDoor

    return HeartbeatDoor(django_application)


def _not_here(message: str):
    """An ASGI app answering every request with a 404 that says where to go instead."""
    from reach_core import requestid
    from reach_core.errors import error_body

    async def answer(scope, receive, send) -> None:
        request_id = requestid.accept_or_new(_header(scope, b"x-request-id"))
        body = orjson.dumps(error_body(code="not_found", message=message,
                                       request_id=request_id))
        await send({"type": "http.response.start", "status": 404,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"x-request-id", request_id.encode())]})
        await send({"type": "http.response.body", "body": body})

    return answer


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _only_health_checks(django_application, gateway: GatewayApp):
    """A gateway process's Django: liveness, and a 404 for the rest. Readiness is the
    gateway's own: ready while it has a route table to serve from, whatever the database
    (a balancer must not pull every gateway out during a database outage, when they go
    on serving from their tables)."""
    elsewhere = _not_here("This process serves the gateway only (reach_platform.gateway_asgi);"
                          " call the control-plane processes for the API and the admin.")

    async def http_application(scope, receive, send) -> None:
        if scope["path"] == "/healthz":
            await django_application(scope, receive, send)
        elif scope["path"] == "/readyz":
            await gateway.readiness(scope, send)
        else:
            await elsewhere(scope, receive, send)

    return http_application


def control_plane_only(django_application):
    """The API and admin without the data plane: no route table followed, so route-table
    changes and heartbeats cost this process nothing. ``/v1/`` answers 404 saying so."""
    from channels.routing import ProtocolTypeRouter

    elsewhere = _not_here("This process serves the control plane only "
                          "(REACH_SERVE_GATEWAY=false); call the gateway processes.")

    async def http_application(scope, receive, send) -> None:
        path = scope["path"]
        if path.startswith("/v1/") or path in GATEWAY_PATHS:
            await elsewhere(scope, receive, send)
        else:
            await django_application(scope, receive, send)

    async def lifespan(scope, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def websocket(scope, receive, send) -> None:
        await send({"type": "websocket.close", "code": 4404})

    return ProtocolTypeRouter({"http": http_application, "lifespan": lifespan,
                               "websocket": websocket})
