"""Rate limiter: token buckets on a real Redis (unique key prefix) and in process."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.limits import ALLOWED, InProcessLimiter, Limit, RedisLimiter, Verdict
from tests.servers import free_port

REDIS_URL = "redis://127.0.0.1:6379/0"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of this test alone; every key under it is deleted afterwards."""
    pfx = f"test:limits:{uuid.uuid4().hex}:"
    yield pfx
    with redis.Redis.from_url(REDIS_URL) as sync:
        keys = list(sync.scan_iter(match=pfx + "*", count=1000))
        if keys:
            sync.delete(*keys)


def with_limiters(n: int, prefix: str,
                  body: Callable[..., Awaitable[None]]) -> None:
    """Run ``body(*limiters)`` with ``n`` RedisLimiters on separate clients ("processes")."""

    async def main() -> None:
        clients = [redis.asyncio.Redis.from_url(REDIS_URL) for _ in range(n)]
        try:
            await body(*(RedisLimiter(c, prefix=prefix) for c in clients))
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
        clock.now += 0.2  # 0.4 token: 0.6 missing at 2/s
        assert await lim.check(limits) == Verdict(False, 0.3, "tenant:7")
        clock.now += 0.3
        assert await lim.check(limits) == ALLOWED
        assert not (await lim.check(limits)).allowed
        clock.now += 100  # refill stops at burst
        assert await count_allowed(lim, limits) == 3
        # cost > 1 needs that many tokens; retry-after is ceiled to the millisecond
        clock.now += 1 / 3
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
        clock.now += 0.5
        hot = Limit("hot", 0.1, 5)  # refill time 50 s: kept, its 1 token must survive
        await lim.check([hot], cost=4)
        assert len(lim) == cap  # not past the cap yet: nothing swept
        clock.now += 1.0  # the idle buckets are now idle past their refill time
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
    limits = [Limit("tenant:7", rate_per_s=50.0, burst=5)]

    async def body(lim: RedisLimiter) -> None:
        assert await count_allowed(lim, limits) == 5
        refused = await lim.check(limits)
        assert not refused.allowed and refused.limit_key == "tenant:7"
        assert 0.001 <= refused.retry_after_s <= 0.02  # one token at 50/s
        assert refused.retry_after_s == round(refused.retry_after_s, 3)
        start = time.monotonic()
        while not (await lim.check(limits)).allowed:
            assert time.monotonic() - start < 2.0, "bucket never refilled"
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.2)  # 10 tokens' worth: capped at the burst
        assert await count_allowed(lim, limits) == 5

    with_limiters(1, prefix, body)
    with redis.Redis.from_url(REDIS_URL) as sync:
        stored = sync.hgetall(prefix + "rl:tenant:7")
        assert set(stored) == {b"tokens", b"ts"}
        assert 1000 < sync.pttl(prefix + "rl:tenant:7") <= 2000  # ceil(5 / 50) * 2 s


def test_redis_all_or_nothing(prefix: str) -> None:
    a, b = Limit("tenant:1", 0.001, 5), Limit("tenant:1:agent:2", 0.001, 2)

    async def body(lim: RedisLimiter) -> None:
        assert await count_allowed(lim, [a, b]) == 2
        refused = await lim.check([a, b])
        assert (refused.allowed, refused.limit_key) == (False, b.key)
        assert 999 < refused.retry_after_s <= 1000  # one token at 0.001/s
        assert await count_allowed(lim, [a]) == 3  # the refusals did not debit a
        assert (await lim.check([a, b])).limit_key == a.key  # the first refusing one

    with_limiters(1, prefix, body)
    with redis.Redis.from_url(REDIS_URL) as sync:
        ttl = sync.pttl(prefix + "rl:" + a.key)
        assert 9_000_000 < ttl <= math.ceil(5 / 0.001) * 2000


def test_two_processes_share_one_bucket(prefix: str) -> None:
    rate, burst = 10.0, 10
    limits = [Limit("capability:12", rate, burst)]

    async def fire(limiters: tuple[RedisLimiter, ...], n: int,
                   limits: list[Limit] = limits) -> list[int]:
        """n requests per limiter, interleaved and concurrent; allowed count per limiter."""
        calls = [lim.check(limits) for _ in range(n) for lim in limiters]
        verdicts = await asyncio.gather(*calls)
        return [sum(v.allowed for v in verdicts[i::len(limiters)])
                for i in range(len(limiters))]

    async def body(*limiters: RedisLimiter) -> None:
        # Open the pools' connections and load the script first: otherwise the first fire
        # reaches Redis only ~0.2 s after the clock starts and the window looks 2 tokens short.
        await fire(limiters, 100, [Limit("warm-up", rate, burst)])
        start = time.monotonic()
        first = await fire(limiters, 100)
        assert burst <= sum(first) <= burst + 2, first  # not 2 x burst: one shared bucket
        per_limiter = first
        for _ in range(1000):  # bounded; ends on time long before
            if time.monotonic() - start >= 2.0:
                break
            await asyncio.sleep(0.02)
            per_limiter = [x + y for x, y in zip(per_limiter, await fire(limiters, 5),
                                                 strict=True)]
        elapsed = time.monotonic() - start
        expected = rate * elapsed + burst
        assert abs(sum(per_limiter) - expected) <= 0.1 * expected, (per_limiter, elapsed)
        assert all(per_limiter), per_limiter

    with_limiters(2, prefix, body)


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
