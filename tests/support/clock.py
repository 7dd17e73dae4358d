"""A fake clock for code that takes ``clock: Callable[[], float]``."""

from __future__ import annotations


class FakeClock:
    """Time that moves only when a test says so.

    Calling the clock returns ``now`` in seconds (any origin: the code under test must only
    compare readings). ``advance(seconds)`` moves it forward and returns the new reading;
    going backwards is refused, since no monotonic clock does that. ``now`` may also be set
    directly by a test that computes absolute times.
    """

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        self.now += seconds
        return self.now
