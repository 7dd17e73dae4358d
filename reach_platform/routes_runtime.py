"""Wiring a process's route-table subscriber to the database, the bus and a snapshot file.

The gateway process (and ``manage.py reach_routes``) call ``start_route_subscriber``
once; it keeps the table current from then on in background threads.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading

from django.conf import settings
from django.db import close_old_connections, connections

from reach_platform.bus import route_bus
from routing.bus import RedisBus
from routing.subscriber import RouteTableSubscriber

logger = logging.getLogger(__name__)

CHECK_INTERVAL_SECONDS = 2.0
TRIM_EVERY_TICKS = 15  # 30 s


def _load():
    from registry.snapshot import build_table

    close_old_connections()
    try:
        return build_table()
    finally:
        close_old_connections()


def _changes_since(version: int):
    from registry.snapshot import changes_since

    close_old_connections()
    try:
        return changes_since(version)
    finally:
        close_old_connections()


def _version() -> int:
    from registry.snapshot import current_version

    close_old_connections()
    try:
        return current_version()
    finally:
        close_old_connections()


class BusWatch:
    """Tells the subscriber when Redis stops answering although no connection broke (a
    hung server): then, as for a refused connection, leases are judged as of that
    moment, and when it answers again the table is reloaded before the clock resumes.
    Without it a hung Redis let every lease lapse on every gateway (a break test: 16 s
    of 503s for the whole fleet during a 45 s hang)."""

    def __init__(self, bus, subscriber: RouteTableSubscriber) -> None:
        self._bus = bus
        self._subscriber = subscriber
        self.hung = False

    def check(self) -> None:
        if self._bus.answers():
            if self.hung:
                self.hung = False
                self._subscriber.bus_connected()
        elif not self.hung:
            self.hung = True
            logger.warning("route table: Redis does not answer; judging leases as of now")
            self._subscriber.cut_off("bus")


class RouteRuntime:
    def __init__(self, subscriber: RouteTableSubscriber) -> None:
        self.subscriber = subscriber
        self._stop = threading.Event()
        self._subscription = None
        self._watch: BusWatch | None = None
        self._thread = threading.Thread(target=self._tick, name="route-check", daemon=True)

    def start(self) -> RouteRuntime:
        # The first load runs in a thread of its own and is waited for: uvicorn imports
        # the application inside each worker's running event loop, where the ORM refuses
        # to run, and a worker must not serve before it has its table.
        first = threading.Thread(target=self._first_load, name="route-first-load")
        first.start()
        first.join()
        bus = route_bus()
        if isinstance(bus, RedisBus):
            subscriber = self.subscriber
            self._subscription = bus.subscribe(
                subscriber.handle, on_connect=subscriber.bus_connected,
                on_disconnect=lambda: subscriber.cut_off("bus"))
            self._watch = BusWatch(bus, subscriber)
        else:
            self._subscription = bus.subscribe(self.subscriber.handle)
        self._thread.start()
        return self

    def _first_load(self) -> None:
        try:
            self.subscriber.start()
        finally:
            connections.close_all()  # this thread's connection ends with it
            return_freed_memory()


    def stop(self) -> None:
        self._stop.set()
        if self._subscription is not None:
            self._subscription.close()
        self._thread.join(timeout=5)
        self.subscriber.persist_if_dirty()

    def _tick(self) -> None:
        ticks = 0
        while not self._stop.wait(CHECK_INTERVAL_SECONDS):
            try:
                if self._watch is not None:
                    self._watch.check()
                self.subscriber.check()
            except Exception:
                logger.exception("route table check failed")
            ticks += 1
            if ticks % TRIM_EVERY_TICKS == 0:
                # Every delta and load report leaves freed heap behind (index copies,
                # decoded messages); glibc keeps it unless asked. A few ms per call.
                return_freed_memory()


def database_identity() -> str:
    """Which database a route table comes from, known without reaching it: a snapshot
    file is a fallback for when the database is down, so the check cannot ask it."""
    db = settings.DATABASES["default"]
    parts = (db["ENGINE"], str(db.get("HOST") or ""), str(db.get("PORT") or ""),
             str(db["NAME"]))
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:32]


def start_route_subscriber(snapshot_path=None) -> RouteRuntime:
    subscriber = RouteTableSubscriber(
        loader=_load, current_version=_version, changes_since=_changes_since,
        snapshot_path=snapshot_path or settings.DATA_DIR / "routes.json",
        identity=database_identity(), snapshot_every_s=settings.ROUTES_SNAPSHOT_EVERY_S,
    )
    return RouteRuntime(subscriber).start()


@functools.cache
def _libc():
    import ctypes
    import ctypes.util

    # Looked up once: find_library forks ``ldconfig -p`` on every call, and this runs
    # every few ticks in a process that may hold a fleet's table.
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def return_freed_memory() -> None:
    """Give the C heap freed by a whole-table load (or the first intent index) back to the
    system, which glibc keeps otherwise: the rows of a large fleet are the peak, the table
    is what stays (10,000 agents x 5: 13 MB each)."""
    # Not glibc (no malloc_trim): nothing to ask.
    with contextlib.suppress(OSError, AttributeError):
        _libc().malloc_trim(0)


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 256 * 1024


def map_large_blocks() -> None:
    """Blocks of 256 KB and more get pages of their own, returned as soon as they are freed.

    glibc starts there too, but raises the threshold to the size of every such block that
    is freed: after an intent query at 10,000 capabilities (some 9 MB of score arrays, for a
    few milliseconds) the next ones come from the heap and stay with the process until the
    next trim. A fixed threshold keeps a gateway's size its tables' (measured: 10 MB less
    after one such query)."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
