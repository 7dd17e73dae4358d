"""The SSE framer cuts events at any byte boundary, and bounds an event that never ends."""

from __future__ import annotations

import random

import pytest

from gateway.sse import EventFramer, EventTooLarge

STREAM = b"".join(b'data: {"n":%d}\n\n' % i for i in range(200)) \
    + b"event: x\r\ndata: y\r\n\r\n" + b"data: tail"


@pytest.mark.parametrize("seed", range(20))
def test_events_come_out_whole_however_the_bytes_are_cut(seed):
    rng = random.Random(seed)
    framer, events, at = EventFramer(), [], 0
    while at < len(STREAM):
        step = rng.randint(1, 9)
        events += framer.feed(STREAM[at:at + step])
        at += step
    assert events == [b'data: {"n":%d}\n\n' % i for i in range(200)] + [b"event: x\ndata: y\n\n"]
    assert framer.pending == b"data: tail"


def test_an_event_that_never_ends_is_refused_at_the_limit():
    framer = EventFramer(max_event_bytes=1024 * 1024)
    framer.feed(b"data: ok\n\n")
    fed = 0
    with pytest.raises(EventTooLarge):
        for _ in range(800):  # 50 MiB offered in 64 KiB pieces
            framer.feed(b"data: " if fed == 0 else b"a" * 65536)
            fed += 1
    assert fed <= 1024 * 1024 // 65536 + 2  # refused as it passed the limit, not at the end


def test_a_whole_stream_is_framed_with_the_loop_given_turns():
    """helper-52: an http agent answering 10 MB of SSE comment lines (read whole, as its
    reply) held the event loop 2.8 s while the stream was framed in one go. It is framed
    a slice at a time now: the loop gets a turn at least once per slice, even while no
    event ends (counted in loop turns, not in time)."""
    import asyncio

    from gateway.protocols import PROTOCOLS
    from gateway.sse import COLLECT_SLICE, collected

    body = b":" * (5 * 1024 * 1024) + b'\n\ndata: {"x": 1}\n\n'

    async def go():
        turns, done = [0], asyncio.Event()

        async def tick():
            while not done.is_set():
                turns[0] += 1
                await asyncio.sleep(0)

        ticker = asyncio.ensure_future(tick())
        await asyncio.sleep(0)
        before = turns[0]
        reply = await collected(body, PROTOCOLS["http"].stream_meter())
        during = turns[0] - before
        done.set()
        await ticker
        return reply, during

    reply, during = asyncio.run(go())
    assert reply["events"] == [{"x": 1}]
    assert during >= len(body) // COLLECT_SLICE
