"""Bounded polling for state that another process or thread will reach eventually."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """``wait_for`` gave up. An ``AssertionError``, so pytest reports it as a failure."""


def wait_for(predicate: Callable[[], T], timeout: float = 15.0, interval: float = 0.05,
             *, message: str | None = None) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    Calls it at least once, then every ``interval`` seconds until ``timeout`` seconds have
    passed; then raises ``WaitTimeout`` naming ``message`` (or the predicate), the timeout
    and the last value seen. Exceptions from ``predicate`` propagate at once: a predicate
    that can fail transiently must catch that itself.

    The timeout only bounds how long a broken test hangs: choose it far above the expected
    wait, so a busy machine never turns a pass into a failure.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what} "
                              f"(last value: {value!r})")
        time.sleep(interval)
