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
