"""A hung Redis is asked once, not by every call.

Redis refusing connections fails at once, and every caller of Redis on the call path
(limits, budgets, idempotency) has a policy for that. Redis hung (stopped, swapping, a
partition dropping packets) fails only after the socket time-out, a second, and again on
the retry: a break test measured calls with a 500 ms deadline answered after 3 to 4 s,
each call waiting on the hung Redis anew. So the gateway's client keeps a gate: once a
command times out, every command fails at once with a ``ConnectionError`` (what the
callers' policies already meet) for ``cooldown_s``; then one command goes through as a
probe while the others still fail at once, and its answer opens or shuts the gate again.

Per process, in memory. Only a time-out shuts the gate: a refused or dropped connection
fails fast anyway, and one dropped by a restart is retried at once by the client.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

COOLDOWN_S = 1.0


class RedisGate:
    def __init__(self, cooldown_s: float = COOLDOWN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._shut_until: float | None = None  # None: open
        self._probing = False

    @property
    def shut(self) -> bool:
        return self._shut_until is not None

    def enter(self) -> bool:
        """Whether a command may be sent: False when sent as usual, True when sent as the
        probe (tell ``leave`` either way); raises ``ConnectionError`` when it may not."""
        if self._shut_until is None:
            return False
        if self._clock() >= self._shut_until and not self._probing:
            self._probing = True
            return True
        raise RedisConnectionError("Redis did not answer in time lately; not asked again "
                                   "until a probe finds it answering")

    def leave(self, probe: bool, answered: bool | None) -> None:
        """``answered``: True, it answered; False, it timed out; None, neither is known
        (another error, or the command was cancelled)."""
        if probe:
            self._probing = False
        if answered is False:
            self._shut_until = self._clock() + self.cooldown_s
        elif answered and probe:
            self._shut_until = None


async def _through(gate: RedisGate, send: Callable[[], Awaitable[Any]]) -> Any:
    """``send()`` (one command or one pipeline) through ``gate``."""
    probe = gate.enter()
    answered = None
    try:
        result = await send()
        answered = True
        return result
    except RedisTimeoutError:
        answered = False
        raise
    finally:
        gate.leave(probe, answered)


class GatedRedis(aioredis.Redis):
    """The asyncio client, every command and pipeline through one ``RedisGate``."""

    gate: RedisGate

    async def execute_command(self, *args, **options):
        return await _through(self.gate, functools.partial(super().execute_command, *args,
                                                           **options))

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        pipe = GatedPipeline(self.connection_pool, self.response_callbacks, transaction,
                             shard_hint)
        pipe.gate = self.gate
        return pipe


class GatedPipeline(Pipeline):
    gate: RedisGate

    async def execute(self, raise_on_error: bool = True):
        return await _through(self.gate, functools.partial(super().execute, raise_on_error))


def gated(pool: aioredis.ConnectionPool, gate: RedisGate | None = None) -> GatedRedis:
    client = GatedRedis(connection_pool=pool)
    client.gate = gate or RedisGate()
    return client
