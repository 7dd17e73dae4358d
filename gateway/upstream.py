"""The gateway's one choke point for calls to agents: aiohttp sessions per agent.

aiohttp rather than httpx: as a pass-through it forwards several times more
requests per second on this hardware (``bench/upstream_clients.py``). One
``ClientSession`` per agent, its connector sized from the agent's pool
settings (``pool_max_connections``, ``pool_idle_seconds``), DNS cached 30 s.
Every connection's addresses go through the endpoint policy after
resolution (``SafeResolver``), so a name re-pointed at a refused address is
refused at connect time. Redirects are never followed.

Errors are translated here into ``UpstreamFailure`` with a ``delivered``
flag: False means the request provably never reached the agent in full, which is
what makes a retry safe for a non-idempotent call. Recognised as not delivered:

- no connection: refused, a refused address, a connect timeout;
- a connection the agent reset (ECONNRESET, EPIPE) while the gateway was still
  sending the request: aiohttp's ``UploadTracker`` (aiohttp >= 3.14) reports the body
  was not fully handed to the socket, and a reset connection drops whatever was still
  queued, so the agent never had the whole request (it closed after reading only the
  headers, say). See ``reset_before_sent``.

Everything else counts as delivered, because the gateway cannot tell: a reset
after the whole request was written (even if the agent never read its tail from
its socket), a clean close (EOF: a half-closed agent may still read what was
flushed after it), any time-out once connected, and every reset when the
tracker is unavailable (older aiohttp).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Callable

import aiohttp
from aiohttp.abc import AbstractResolver

from gateway.h1 import ConnectFailed, H1Session, MalformedReply, ResetBeforeSent
from gateway.tunnel import TunnelBadFrame, TunnelDown
from reach_core.endpoints import EndpointPolicy, EndpointRefused, check_resolved
from reach_core.errors import ReachError

logger = logging.getLogger(__name__)


class UpstreamFailure(Exception):
    def __init__(self, code: str, message: str, *, delivered: bool) -> None:
        super().__init__(message)
        self.code = code  # a gateway error code: upstream_error, upstream_timeout, ...
        self.message = message
        self.delivered = delivered


class SafeResolver(AbstractResolver):
    """Resolves like the default, then refuses any address the endpoint policy refuses."""

    def __init__(self, policy: EndpointPolicy) -> None:
        self._policy = policy
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET):
        infos = await self._inner.resolve(host, port, family)
        try:
            check_resolved(host, port, [i["host"] for i in infos], self._policy)
        except EndpointRefused as exc:
            # aiohttp turns a resolver's OSError into ClientConnectorError: the request
            # was never sent, which keeps a retry safe.
            raise OSError(f"refused by the endpoint policy: {exc}") from exc
        return infos

    async def close(self) -> None:
        await self._inner.close()


class _IdleBoundedConnector(aiohttp.TCPConnector):
    """A connector that keeps idle connections for at most ``max_idle_hosts`` upstreams:
    past that, a connection to one more upstream is closed when its call is done instead of
    kept. A gateway calling every agent of a large fleet would otherwise hold an idle
    connection (a socket and its buffers) per agent for the whole keep-alive time
    (a break test: 10,000 agents called once, 10,021 open files, 158 -> 341 MB)."""

    def __init__(self, *, max_idle_hosts: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self._max_idle_hosts = max_idle_hosts

    def _release(self, key, protocol, *, should_close: bool = False) -> None:
        if not should_close and key not in self._conns \
                and len(self._conns) >= self._max_idle_hosts:
            should_close = True
        super()._release(key, protocol, should_close=should_close)


class _IdentityResponse(aiohttp.ClientResponse):
    """A reply that must come unencoded: asked for identity, one with a Content-Encoding
    would be relayed as bytes its reader cannot use, or, decoded, be any size."""

    async def start(self, connection):
        await super().start(connection)
        encoding = self.headers.get("Content-Encoding")
        if encoding is not None and encoding.strip().lower() != "identity":
            self.close()
            raise MalformedReply(f"the reply is encoded (Content-Encoding: {encoding[:40]}) "
                                 "though the gateway asked for identity")
        return self


class UpstreamPools:
    """Connections to agents: one session (one connection pool) per keep-alive setting,
    shared by every agent with it, so a large fleet costs no session per agent; each
    agent's ``pool_max_connections`` is held by a semaphore of its own (``slot``). Idle
    connections are kept for ``MAX_IDLE_HOSTS`` agents at most, and the slots of agents not
    called for ``SLOT_IDLE_S`` are forgotten (``close_idle``)."""

    SWEEP_EVERY_S = 30.0
    SLOT_IDLE_S = 600.0
    MAX_IDLE_HOSTS = 512

    def __init__(self, policy: EndpointPolicy, *, connect_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._connect_timeout_s = connect_timeout_s
        self._clock = clock
        self._sessions: dict[int, aiohttp.ClientSession] = {}
        self._h1: dict[int, H1Session] = {}
        self._slots: dict[tuple[int, int], asyncio.Semaphore] = {}
        self._used: dict[tuple[int, int], float] = {}

    async def slot(self, agent_pk: int, max_connections: int, wait_s: float) -> asyncio.Semaphore:
        """Take one of the agent's ``max_connections`` slots, waiting at most ``wait_s``;
        the caller releases the returned semaphore when the reply is done. Raises
        ``TimeoutError`` when none frees up in time: the caller answers at once rather
        than queue behind a saturated pool into everyone's deadlines."""
        key = (agent_pk, max_connections)
        self._used[key] = self._clock()
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = asyncio.Semaphore(max_connections)
        if not slots.locked():
            await slots.acquire()  # free: no timer, no task on the hot path
        else:
            await asyncio.wait_for(slots.acquire(), wait_s)
        return slots

    def session(self, agent_pk: int, max_connections: int, idle_seconds: int) -> H1Session:
        """The calls' client: plain HTTP on ``gateway.h1``, ``https://`` through aiohttp."""
        session = self._h1.get(idle_seconds)
        if session is None or session.closed:
            session = self._h1[idle_seconds] = H1Session(
                self._policy, idle_seconds=idle_seconds, max_idle_hosts=self.MAX_IDLE_HOSTS,
                fallback=lambda: self.aiohttp_session(idle_seconds))
        return session

    def aiohttp_session(self, idle_seconds: int) -> aiohttp.ClientSession:
        """aiohttp's client, for TLS and for tool calls (any method, any URL)."""
        session = self._sessions.get(idle_seconds)
        if session is None or session.closed:
            connector = _IdleBoundedConnector(
                max_idle_hosts=self.MAX_IDLE_HOSTS, limit=0, limit_per_host=0,
                keepalive_timeout=idle_seconds, ttl_dns_cache=30,
                resolver=SafeResolver(self._policy),
            )
            # Identity asked for, and nothing decoded: a body's limit is on the bytes
            # that arrive (helper-53: 200 KB of gzip, under the 4 MiB limit as sent, was
            # inflated to 200 MB by the client, three calls stalling the gateway 15 s).
            session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s),
                skip_auto_headers=("User-Agent",), headers={"Accept-Encoding": "identity"},
                response_class=_IdentityResponse,
            )
            self._sessions[idle_seconds] = session
        return session

    async def close_idle(self) -> int:
        """Forget the slots of agents not called for ``SLOT_IDLE_S`` and with no call in
        flight (a long stream holds its slot); returns how many were forgotten."""
        now = self._clock()
        idle = [key for key, used in self._used.items()
                if now - used > self.SLOT_IDLE_S and not self._busy(key)]
        for key in idle:
            del self._used[key]
            self._slots.pop(key, None)
        return len(idle)

    def _busy(self, key: tuple[int, int]) -> bool:
        slots = self._slots.get(key)
        return slots is not None and slots._value < key[1]

    async def close_idle_forever(self) -> None:
        """The gateway's background job: ``close_idle`` every ``SWEEP_EVERY_S``."""
        while True:
            await asyncio.sleep(self.SWEEP_EVERY_S)
            try:
                await self.close_idle()
            except Exception:  # a failed sweep must not stop the sweeps
                logger.exception("forgetting idle upstream slots failed")

    def idle_connections(self) -> int:
        """Connections kept open for the next call, over every session."""
        return sum(len(kept) for session in self._sessions.values()
                   for kept in session.connector._conns.values()) \
            + sum(session.idle_connections() for session in self._h1.values())

    async def close(self) -> int:
        """Close every session (and its connections); returns how many were open."""
        sessions = [*self._sessions.values(), *self._h1.values()]
        self._sessions, self._h1 = {}, {}
        for session in sessions:
            await session.close()
        return sum(1 for s in sessions if s.closed)


RESET_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})


def upload_tracker():
    """A tracker of one request's body upload, or None where aiohttp has none (< 3.14).
    Must be created in the running loop, one per request."""
    tracker = getattr(aiohttp, "UploadTracker", None)
    return tracker() if tracker is not None else None


async def reset_before_sent(exc: BaseException, tracker) -> bool:
    """Whether ``exc`` proves the agent never had the whole request: the connection was
    reset while its body was still being written. False whenever in doubt.

    After the failure aiohttp cancels a body write still in progress; its tracker then
    settles at once (UploadAbortedError, or the write's own OSError). A tracker that
    finished means every byte was handed to the kernel: delivered, as far as we know."""
    if isinstance(exc, ResetBeforeSent):
        return True
    if tracker is None or getattr(exc, "errno", None) not in RESET_ERRNOS:
        return False
    upload = tracker.upload_complete
    if not upload.done():
        # Settles on the cancelled writer's next step; the bound only guards the
        # unexpected, and then the call counts as delivered.
        await asyncio.wait({upload}, timeout=1.0)
        if not upload.done():
            return False
    return upload.cancelled() or upload.exception() is not None


def translate_error(exc: BaseException) -> UpstreamFailure:
    """An aiohttp / asyncio failure as an ``UpstreamFailure`` (see the module docstring)."""
    if isinstance(exc, TunnelDown):
        return UpstreamFailure("upstream_error", f"the agent's tunnel is down ({exc})",
                               delivered=False)
    if isinstance(exc, MalformedReply):
        return UpstreamFailure("upstream_bad_response", str(exc), delivered=True)
    if isinstance(exc, TunnelBadFrame):
        return UpstreamFailure("upstream_bad_response", str(exc), delivered=True)
    if isinstance(exc, ConnectFailed | aiohttp.ClientConnectorError):
        return UpstreamFailure("upstream_error", f"cannot connect to the agent ({exc.os_error})",
                               delivered=False)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamFailure("upstream_timeout", "connecting to the agent timed out",
                               delivered=False)
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamFailure("upstream_timeout", "the agent did not answer in time",
                               delivered=True)
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError
                  | aiohttp.ClientOSError):
        return UpstreamFailure("upstream_error", "the agent broke the connection",
                               delivered=True)
    return UpstreamFailure("upstream_error", f"calling the agent failed ({type(exc).__name__})",
                           delivered=True)


async def read_limited(response, limit: int, too_large: str) -> bytes:
    """A reply's whole body, refused (``upstream_bad_response``, ``too_large``) past
    ``limit`` bytes: a declared length before anything is read, else as the body arrives
    (``read(n)`` alone returns what has arrived so far, which cut long answers short)."""
    if response.content_length is not None:
        if response.content_length > limit:
            raise ReachError("upstream_bad_response", too_large)
        return await response.read()  # the common case: one await, no loop
    parts, size = [], 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise ReachError("upstream_bad_response", too_large)
        parts.append(chunk)
    return b"".join(parts)
