"""Smooth weighted round robin (nginx's), deterministic: exact shares over every cycle.

Each pick adds every candidate's weight to its running total, takes the
largest total, and subtracts the sum of weights from the winner. Over any
window of ``sum(weights)`` picks each candidate is chosen exactly ``weight``
times, spread out rather than in bursts; weighted random gets the shares
only on average.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence


class SmoothWeightedRoundRobin:
    """Keeps one running state per key (e.g. a capability id and its candidate set)."""

    def __init__(self, max_keys: int = 50_000) -> None:
        self._state: dict[Hashable, dict[Hashable, int]] = {}
        self._lock = threading.Lock()
        self._max_keys = max_keys

    def pick(self, key: Hashable, candidates: Sequence[tuple[Hashable, int]]) -> Hashable:
        """Pick one candidate id from ``(id, weight)`` pairs; weights are positive ints."""
        if len(candidates) == 1:
            return candidates[0][0]
        total = 0
        with self._lock:
            current = self._state.get(key)
            if current is None:
                if len(self._state) >= self._max_keys:
                    # Candidate sets churn with the table; an unbounded map would grow
                    # forever. Starting a cycle afresh only shifts where it begins.
                    self._state.clear()
                current = self._state[key] = {}
            best_id, best_value = None, None
            for cid, weight in candidates:
                value = current.get(cid, 0) + weight
                current[cid] = value
                total += weight
                if best_value is None or value > best_value:
                    best_id, best_value = cid, value
            current[best_id] -= total
            return best_id
