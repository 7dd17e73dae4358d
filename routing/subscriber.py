"""Keeps a process's route table current: deltas in order, full reload on a gap.

The subscriber owns the one mutable reference in the data plane: ``table``.
Readers take the reference once per call and use that immutable snapshot for
the whole call, so a swap never tears a call in half.

Failure modes it is built for:
- a lost or reordered message: the next delta's version is not current + 1,
  so the whole table is reloaded;
- the database (the loader) unreachable: the last good table keeps serving and
  the reload is retried at the next check;
- a cold start with the database down: the table persisted to
  ``snapshot_path`` is loaded instead, but only a file written for the same
  database (``identity``): a table left by another database's run would route
  callers to agents this one never registered.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson

from routing.table import (
    Delta,
    RouteTable,
    delta_from_wire,
    load_from_wire,
    table_from_wire,
    table_to_json,
)

logger = logging.getLogger(__name__)


class RouteTableSubscriber:
    def __init__(
        self,
        *,
        loader: Callable[[], RouteTable],
        current_version: Callable[[], int] | None = None,
        changes_since: Callable[[int], tuple[int, list[Delta]] | None] | None = None,
        snapshot_path: Path | None = None,
        identity: str = "",
        snapshot_every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``loader`` builds the whole table (from the database); ``current_version`` asks
        only for the latest version, cheaply, for the periodic check; ``changes_since(v)``
        gives the current version and the rows changed after ``v`` as deltas (None when it
        cannot), so a subscriber that missed some versions catches up in proportion to
        what it missed rather than reloading everything. ``identity`` names
        the database the table comes from; it is written into the snapshot file and a
        file with another (or none) is refused."""
        self._loader = loader
        self._current_version = current_version
        self._changes_since = changes_since
        self._snapshot_path = snapshot_path
        self._identity = identity
        # The file is a fallback for a cold start with the database down: a table up to
        # half a minute old will do, and writing it after every change of a busy fleet
        # would cost every gateway a full serialisation each time.
        self._snapshot_every_s = snapshot_every_s
        self._clock = clock
        self._persisted_at = -math.inf
        self._lock = threading.RLock()
        self._dirty = False
        self.table = RouteTable()
        self.reloads = 0
        self.catch_ups = 0  # gaps closed with the changed rows alone
        self.failures = 0  # reloads that failed (source of truth unreachable)
        self.stale = True  # True until a load from the source of truth succeeded
        # Since when this process has been cut off from the source of truth or the bus
        # (epoch seconds), None while both answer. Leases are judged as of that moment:
        # heartbeats that cannot reach us are no proof that agents died, so an outage of
        # ours never empties the table (see ``lease_clock``).
        self.cut_off_since: float | None = None
        self._cut: set[str] = set()  # which of "source", "bus" are not answering
        self._listeners: list[Callable[[RouteTable], None]] = []
        # Told how long each delta took from its publisher to being applied here (s).
        self.on_propagated: Callable[[float], None] | None = None

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> RouteTable:
        """Load the table: from the loader, else from the snapshot file. Never raises."""
        if not self.reload() and self._snapshot_path is not None:
            cold = self._read_snapshot()
            if cold is not None:
                self._swap(cold)
                # Its leases are as fresh as the file: judge them as of its writing.
                self.cut_off(since=self._snapshot_path.stat().st_mtime)
                logger.warning("route table: cold start from %s (v%s)", self._snapshot_path,
                               cold.version)
        return self.table

    @property
    def serving(self) -> bool:
        """Whether there is a table to serve from: loaded from the source (even empty), or
        a snapshot's while the source is away. False only before any of either."""
        return not self.stale or self.table.version > 0

    def on_change(self, listener: Callable[[RouteTable], None]) -> None:
        """Call ``listener(table)`` after every swap (the gateway rebuilds pools from it)."""
        self._listeners.append(listener)

    # ---- messages ----------------------------------------------------------------------

    def handle(self, message: dict) -> None:
        """Apply one bus message. Safe to call from any thread."""
        kind = message.get("type")
        with self._lock:
            if kind == "load":
                self.table.apply_load(load_from_wire(message))  # O(1), no swap
                return
            if kind != "delta":
                return
            version = int(message["version"])
            if version <= self.table.version:
                return  # already folded in (e.g. by a reload that overtook it)
            if version != self.table.version + 1 or self.stale:
                logger.info("route table: gap (have v%s, got v%s); catching up",
                            self.table.version, version)
                self.catch_up()
                return
            self._swap(self.table.apply(delta_from_wire(message)))
            published = message.get("published_at")
            if self.on_propagated is not None and isinstance(published, int | float):
                self.on_propagated(max(0.0, time.time() - published))

    def cut_off(self, what: str = "source", since: float | None = None) -> None:
        """``what`` ("source" or "bus") stopped answering; idempotent."""
        self._cut.add(what)
        moment = since if since is not None else time.time()
        if self.cut_off_since is None or moment < self.cut_off_since:
            self.cut_off_since = moment

    def reconnected(self, what: str = "source") -> None:
        self._cut.discard(what)
        if not self._cut:
            self.cut_off_since = None

    def bus_connected(self) -> None:
        """The bus (re)connected. Load reports sent while it was away are lost, and with
        them the leases their heartbeats renewed; the source of truth heard those
        heartbeats. So after an outage the table is reloaded *before* leases are judged
        by the clock again: otherwise every instance would look lapsed until its next
        heartbeat, and the whole fleet would be refused for up to an interval."""
        if "bus" in self._cut:
            self.reload()
        self.reconnected("bus")
        self.check()

    def lease_clock(self) -> float:
        """The time leases are judged by: now, or the moment this process was cut off."""
        now = time.time()
        since = self.cut_off_since
        return now if since is None else min(now, since)

    def check(self) -> None:
        """Periodic reconciliation: reload if behind; persist if changed since last write.

        Catches the last message of a burst being lost, which no later delta would reveal.
        """
        behind = self.stale
        if not behind and self._current_version is not None:
            try:
                behind = self._current_version() > self.table.version
            except Exception as exc:
                logger.warning("route table: version check failed (%s)", type(exc).__name__)
                self.cut_off()
            else:
                self.reconnected()
        if behind:
            self.catch_up()
        self._persist_when_due()

    def catch_up(self) -> bool:
        """Bring the table up to the latest version: the rows changed since its own if the
        source can tell, else a whole reload. Returns False when the source failed."""
        if self.stale or self._changes_since is None:
            return self.reload()
        try:
            caught = self._changes_since(self.table.version)
        except Exception as exc:
            logger.warning("route table: catching up failed (%s); reloading",
                           type(exc).__name__)
            return self.reload()
        if caught is None:
            return self.reload()
        version, deltas = caught
        with self._lock:
            if version <= self.table.version:
                return True  # a delta or a reload got there first
            table = self.table
            for delta in deltas:
                table = table.apply(delta)
            changed = frozenset(d.pk for d in deltas if d.kind == "agent")
            self._swap(replace(table, version=version, changed_agents=changed))
            self.catch_ups += 1
        self.reconnected()
        return True

    def reload(self) -> bool:
        """Replace the table from the loader. Returns False (keeping the old one) on failure."""
        try:
            table = self._loader()
        except Exception as exc:
            # A reload is only asked for when the table is behind (or at start),
            # so after a failure it is known to be stale until one succeeds.
            self.stale = True
            self.failures += 1
            self.cut_off()
            logger.warning(
                "route table: reload failed (%s); serving v%s", type(exc).__name__,
                self.table.version,
            )
            return False
        with self._lock:
            self.reloads += 1
            self.stale = False
            self._swap(table)
            # Forget instances that are gone (the only place the live map shrinks).
            present = {i.pk for a in table.agents.values() for i in a.instances}
            for pk in [pk for pk in self.table.live if pk not in present]:
                del self.table.live[pk]
        self.reconnected()
        self._persist_when_due()
        return True

    # ---- persistence -------------------------------------------------------------------

    def _persist_when_due(self) -> None:
        if self._clock() - self._persisted_at >= self._snapshot_every_s:
            self.persist_if_dirty()

    def persist_if_dirty(self) -> None:
        if self._snapshot_path is None or not self._dirty:
            return
        self._persisted_at = self._clock()
        with self._lock:
            table, self._dirty = self.table, False
        # The identity first, then the table as serialised by orjson: no dict per entry.
        data = b'{"identity":' + orjson.dumps(self._identity) + b',"table":' + \
            table_to_json(table) + b"}"
        directory = self._snapshot_path.parent
        directory.mkdir(parents=True, exist_ok=True)
        # Write then rename: a crash mid-write never leaves a torn snapshot behind.
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".routes-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, self._snapshot_path)
        except OSError:
            logger.exception("route table: could not persist the snapshot")
            with self._lock:
                self._dirty = True
            Path(tmp).unlink(missing_ok=True)

    def _read_snapshot(self) -> RouteTable | None:
        try:
            data = orjson.loads(self._snapshot_path.read_bytes())
            if not isinstance(data, dict) or data.get("identity") != self._identity:
                logger.warning("route table: %s belongs to another database; not serving it",
                               self._snapshot_path)
                return None
            return table_from_wire(data["table"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("route table: snapshot file unusable (%s)", exc)
            return None

    def _swap(self, table: RouteTable, *, persist: bool = True) -> None:
        if table.live is not self.table.live:
            # One live map for every version: heartbeats since the last version still count.
            table = replace(table, live=self.table.live)
        self.table = table
        if persist:
            self._dirty = True
        for listener in self._listeners:
            try:
                listener(table)
            except Exception:
                logger.exception("route table listener failed")
