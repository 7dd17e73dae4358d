"""Remembering that a dependency just failed, so that callers skip it for a while.

A hung Redis costs every call its full timeout. A request that makes several Redis calls
(a heartbeat judged by the view: the auth throttle, the lease lookup, the seed, the load
report) would then take seconds and hold its database connection all along, until the
pool ran out and healthy requests got 503s (a break test: 16 of 30 concurrent heartbeats).
After one failure, the process's other calls go without Redis for ``hold_s``: each caller
has a way to do without it (in-process counts, the view, the subscribers' version check).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Outage:
    def __init__(self, hold_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self._clock = clock
        self._until = float("-inf")

    def away(self) -> bool:
        """Whether a call failed less than ``hold_s`` ago."""
        return self._clock() < self._until

    def failed(self) -> None:
        self._until = self._clock() + self.hold_s

    def clear(self) -> None:
        self._until = float("-inf")


# The control plane's Redis, for every caller in the process.
REDIS = Outage(hold_s=5.0)
