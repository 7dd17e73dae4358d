"""Rate limiter: token buckets on a real Redis (unique key prefix) and in process."""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import multiprocessing.connection
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.limits import ALLOWED, InProcessLimiter, Limit, RedisLimiter, Verdict
from tests.support.clock import FakeClock
from tests.support.servers import free_port

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of this test alone; every key under it is deleted afterwards."""
    pfx = f"test:limits:{uuid.uuid4().hex}:"
    yield pfx
    with redis.Redis.from_url(REDIS_URL) as sync:
        keys = list(sync.scan_iter(match=pfx + "*", count=1000))
        if keys:
            sync.delete(*keys)


def with_limiters(n: int, prefix: str, body: Callable[..., Awaitable[None]],
                  clock: Callable[[], float] | None = None) -> None:
    """Run ``body(*limiters)`` with ``n`` RedisLimiters on separate clients, all on
    ``clock`` if given, else on Redis's TIME."""

    async def main() -> None:
        clients = [redis.asyncio.Redis.from_url(REDIS_URL) for _ in range(n)]
        try:
            await body(*(RedisLimiter(c, prefix=prefix, clock=clock) for c in clients))
        finally:
            for c in clients:
                await c.aclose()

    asyncio.run(main())


async def count_allowed(limiter: RedisLimiter | InProcessLimiter, limits: list[Limit],
                        at_most: int = 100) -> int:
    n = 0
    while n < at_most and (await limiter.check(limits)).allowed:
        n += 1
    return n


# --- in process -------------------------------------------------------------------------


def test_in_process_burst_refusal_and_refill() -> None:
    clock = FakeClock()
    lim = InProcessLimiter(clock)
    limits = [Limit("tenant:7", rate_per_s=2.0, burst=3)]

    async def main() -> None:
        assert await lim.check([]) == ALLOWED
        assert [(await lim.check(limits)).allowed for _ in range(3)] == [True] * 3
        assert await lim.check(limits) == Verdict(False, 0.5, "tenant:7")
        clock.advance(0.2)  # 0.4 token: 0.6 missing at 2/s
        assert await lim.check(limits) == Verdict(False, 0.3, "tenant:7")
        clock.advance(0.3)
        assert await lim.check(limits) == ALLOWED
        assert not (await lim.check(limits)).allowed
        clock.advance(100)  # refill stops at burst
        assert await count_allowed(lim, limits) == 3
        # cost > 1 needs that many tokens; retry-after is ceiled to the millisecond
        clock.advance(1 / 3)
        assert await lim.check(limits, cost=2) == Verdict(False, 0.667, "tenant:7")

    asyncio.run(main())


def test_in_process_all_or_nothing() -> None:
    clock = FakeClock()
    lim = InProcessLimiter(clock)
    a, b = Limit("tenant:1", 0.001, 5), Limit("tenant:1:agent:2", 0.001, 2)

    async def main() -> None:
        assert await count_allowed(lim, [a, b]) == 2
        assert (await lim.check([a, b])).limit_key == b.key
        assert await count_allowed(lim, [a]) == 3  # the refusals did not debit a
        assert (await lim.check([a, b])).limit_key == a.key  # the first refusing one

    asyncio.run(main())


def test_in_process_memory_is_bounded() -> None:
    clock = FakeClock()
    lim = InProcessLimiter(clock)
    cap = InProcessLimiter.MAX_BUCKETS

    async def main() -> None:
        for i in range(cap - 1):  # refill time 1 s each
            await lim.check([Limit(f"idle:{i}", 1.0, 1)])
        clock.advance(0.5)
        hot = Limit("hot", 0.1, 5)  # refill time 50 s: kept, its 1 token must survive
        await lim.check([hot], cost=4)
        assert len(lim) == cap  # not past the cap yet: nothing swept
        clock.advance(1.0)  # the idle buckets are now idle past their refill time
        await lim.check([Limit("new", 1.0, 1)])
        assert len(lim) == 2
        assert await count_allowed(lim, [hot]) == 1

    asyncio.run(main())


def test_invalid_limits_and_costs_are_rejected() -> None:
    with pytest.raises(ValueError, match="rate_per_s"):
        Limit("x", 0, 1)
    with pytest.raises(ValueError, match="burst"):
        Limit("x", 1, 0)
    with pytest.raises(ValueError, match="cost"):
        asyncio.run(InProcessLimiter().check([Limit("x", 1, 2)], cost=3))


# --- Redis ------------------------------------------------------------------------------


def test_redis_burst_refusal_and_refill(prefix: str) -> None:
    clock = FakeClock()
    limits = [Limit("tenant:7", rate_per_s=50.0, burst=5)]
    timed: dict[str, float] = {}

    async def body(lim: RedisLimiter) -> None:
        assert await count_allowed(lim, limits) == 5
        assert await lim.check(limits) == Verdict(False, 0.02, "tenant:7")  # 1 token at 50/s
        clock.advance(0.01)  # half a token
        assert await lim.check(limits) == Verdict(False, 0.01, "tenant:7")
        clock.advance(0.01)
        assert await lim.check(limits) == ALLOWED
        assert not (await lim.check(limits)).allowed
        clock.advance(100)  # refill stops at the burst
        timed["started"] = time.monotonic()
        assert await count_allowed(lim, limits) == 5

    with_limiters(1, prefix, body, clock=clock)
    with redis.Redis.from_url(REDIS_URL) as sync:
        stored = sync.hgetall(prefix + "rl:tenant:7")
        ttl = sync.pttl(prefix + "rl:tenant:7")
    elapsed_ms = (time.monotonic() - timed["started"]) * 1000
    assert stored == {b"tokens": b"0", b"ts": b"%d" % round(clock() * 1_000_000)}
    # Expiry runs on Redis's clock: ceil(5 / 50) * 2 s from the last debit, less the real
    # time since, which is measured rather than assumed small.
    assert 2000 - elapsed_ms - 1 <= ttl <= 2000


def test_redis_refills_on_its_own_clock_when_none_is_injected(prefix: str) -> None:
    limits = [Limit("tenant:7", rate_per_s=50.0, burst=5)]

    async def body(lim: RedisLimiter) -> None:
        # At least the burst: more only if tokens refilled while counting.
        assert await count_allowed(lim, limits) >= 5
        start = time.monotonic()
        while not (await lim.check(limits)).allowed:  # 20 ms at 50/s; 10 s only bounds a hang
            assert time.monotonic() - start < 10.0, "the bucket never refilled"
            await asyncio.sleep(0.005)

    with redis.Redis.from_url(REDIS_URL) as sync:
        before = sync.time()
        with_limiters(1, prefix, body)
        after = sync.time()
        ts = int(sync.hget(prefix + "rl:tenant:7", "ts"))
    # The last debit was stamped with Redis's TIME, taken between our two readings of it.
    assert before[0] * 1_000_000 + before[1] <= ts <= after[0] * 1_000_000 + after[1]


def test_redis_all_or_nothing(prefix: str) -> None:
    a, b = Limit("tenant:1", 0.001, 5), Limit("tenant:1:agent:2", 0.001, 2)

    async def body(lim: RedisLimiter) -> None:
        assert await count_allowed(lim, [a, b]) == 2
        assert await lim.check([a, b]) == Verdict(False, 1000.0, b.key)  # 1 token at 0.001/s
        assert await count_allowed(lim, [a]) == 3  # the refusals did not debit a
        assert (await lim.check([a, b])).limit_key == a.key  # the first refusing one

    with_limiters(1, prefix, body, clock=FakeClock())
    with redis.Redis.from_url(REDIS_URL) as sync:
        ttl = sync.pttl(prefix + "rl:" + a.key)
        assert 9_000_000 < ttl <= math.ceil(5 / 0.001) * 2000


def _bucket_process(conn: multiprocessing.connection.Connection, prefix: str,
                    limit: Limit) -> None:
    """One gateway-like process: its own Redis client, RedisLimiter and FakeClock.

    Sends "ready", then answers commands from ``conn`` until it receives ``None``:
    ``("advance", seconds)`` moves its clock and answers the new reading; ``("take", n)``
    makes ``n`` concurrent checks of ``limit`` and answers how many were allowed.
    """

    async def main() -> None:
        clock = FakeClock()
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        try:
            limiter = RedisLimiter(client, prefix=prefix, clock=clock)
            conn.send("ready")
            while (command := conn.recv()) is not None:
                op, arg = command
                if op == "advance":
                    conn.send(clock.advance(arg))
                else:
                    verdicts = await asyncio.gather(*(limiter.check([limit])
                                                      for _ in range(arg)))
                    conn.send(sum(v.allowed for v in verdicts))
        finally:
            await client.aclose()

    asyncio.run(main())


class BucketProcess:
    """A ``_bucket_process`` in a separate OS process, and the parent's end of its pipe."""

    def __init__(self, prefix: str, limit: Limit) -> None:
        # spawn, not fork: a fresh interpreter, as separate gateway processes would be.
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_bucket_process, args=(child, prefix, limit),
                                daemon=True)
        self.proc.start()
        child.close()

    def send(self, op: str, arg: float) -> None:
        self.conn.send((op, arg))

    def answer(self) -> object:
        # The timeout only keeps a wedged child from hanging the run; no verdict depends on it.
        if not self.conn.poll(60):
            raise TimeoutError("the limiter process did not answer within 60 s")
        return self.conn.recv()

    def ask(self, op: str, arg: float) -> object:
        self.send(op, arg)
        return self.answer()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # if it already died, the test failed on that
            self.conn.send(None)
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def test_two_processes_share_one_bucket(prefix: str) -> None:
    # One token per 64 s (exact in binary): an idle bucket expires after 2 x its refill time
    # on Redis's own clock, here 21 minutes, so no stall of this machine can reset it.
    rate, burst = 1 / 64, 10
    limit = Limit("capability:12", rate, burst)
    procs = [BucketProcess(prefix, limit) for _ in range(2)]
    a, b = procs

    def together(op: str, arg: float) -> list[object]:
        """Send to both before reading either, so their checks overlap at Redis."""
        for proc in procs:
            proc.send(op, arg)
        return [proc.answer() for proc in procs]

    def advance(seconds: float) -> None:
        assert len(set(together("advance", seconds))) == 1  # one timeline for both

    try:
        assert [proc.answer() for proc in procs] == ["ready", "ready"]
        # Time stands still: each process sees the other's debits, and the two together
        # get exactly one burst, not two.
        assert [a.ask("take", 4), b.ask("take", 4), a.ask("take", 4), b.ask("take", 4)] == [
            4, 4, 2, 0]
        assert together("take", 10) == [0, 0]  # however long that took in real time
        advance(320)  # rate x 320 s = 5 tokens, shared
        assert sum(together("take", 10)) == 5
        advance(32)  # half a token: nothing yet
        assert together("take", 10) == [0, 0]
        advance(32)  # the other half
        assert sum(together("take", 10)) == 1
        advance(100_000)  # a long idle spell refills to the burst, no further
        assert sum(together("take", 20)) == burst
    finally:
        for proc in procs:
            proc.close()


@pytest.mark.parametrize("fail_open", [True, False])
def test_redis_unreachable_degrades_without_raising(fail_open: bool) -> None:
    calls: list[None] = []

    async def main() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=free_port(),
                                     socket_connect_timeout=0.2, socket_timeout=0.2,
                                     retry=Retry(NoBackoff(), 0))
        try:
            lim = RedisLimiter(client, prefix="unused:", fail_open=fail_open,
                               on_degraded=lambda: calls.append(None))
            assert await lim.check([]) == ALLOWED  # no Redis call, no degradation
            assert not calls
            start = time.monotonic()
            verdict = await lim.check([Limit("tenant:7", 10, 10)])
            assert time.monotonic() - start < 2.0
        finally:
            await client.aclose()
        expected_retry = 0.0 if fail_open else 1.0
        assert verdict == Verdict(fail_open, expected_retry, None, degraded=True)
        assert len(calls) == 1

    asyncio.run(main())


class _FailingClient:
    """Stands in for a client whose script call fails with ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def register_script(self, _script: str) -> Callable[..., Awaitable[object]]:
        async def call(**_kw: object) -> object:
            raise self.exc

        return call


@pytest.mark.parametrize("exc", [redis.TimeoutError("t"), redis.ResponseError("busy"),
                                 TimeoutError(), ConnectionResetError()])
def test_any_redis_failure_degrades(exc: BaseException) -> None:
    def broken_hook() -> None:
        raise RuntimeError("metrics down")

    lim = RedisLimiter(_FailingClient(exc), prefix="p:", fail_open=False,  # type: ignore[arg-type]
                       on_degraded=broken_hook)
    verdict = asyncio.run(lim.check([Limit("tenant:7", 1, 1)]))
    assert verdict == Verdict(False, 1.0, None, degraded=True)


# --- leasing ------------------------------------------------------------------------------


class CountingLimiter:
    """A RedisLimiter that counts its round trips."""

    def __init__(self, inner: RedisLimiter) -> None:
        self.inner, self.calls = inner, 0

    async def check(self, limits, cost: int = 1):
        self.calls += 1
        return await self.inner.check(limits, cost)


def test_leasing_keeps_a_tight_limit_exact(prefix: str) -> None:
    from gateway.limits import LeasingLimiter

    async def body(a: RedisLimiter, b: RedisLimiter) -> None:
        limits = [Limit("tight", rate_per_s=0.01, burst=10)]
        first, second = LeasingLimiter(a), LeasingLimiter(b)
        allowed = await count_allowed(first, limits, 6) + await count_allowed(second, limits)
        assert allowed == 10  # two "processes", one burst of 10: leases of one token

    with_limiters(2, prefix, body)


def test_leasing_turns_round_trips_per_call_into_round_trips_per_lease(prefix: str) -> None:
    from gateway.limits import LeasingLimiter

    async def body(client_limiter: RedisLimiter) -> None:
        counting = CountingLimiter(client_limiter)
        leasing = LeasingLimiter(counting, clock=lambda: 0.0)  # leases never expire here
        limits = [Limit("generous", rate_per_s=100_000, burst=100_000)]
        assert await count_allowed(leasing, limits, 5000) == 5000
        assert counting.calls == 5  # leases of 1,000 tokens

    with_limiters(1, prefix, body)
