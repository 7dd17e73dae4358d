"""Usage events on disk before they leave the process: a gateway killed with SIGKILL
loses none of the calls it answered.

Events wait in memory for the shipper (every 50 ms), and a process killed meanwhile took
them along: a break test killed one gateway worker of two mid-burst five times and found
0 to 13 calls answered 200 with no usage event. So each event queued is also appended,
one JSON line, to this process's spool file, and a file is deleted once every event in
it has been shipped (to the Redis stream, or stored, in embedded mode). Files roll over
at each drain, so one holds about one batch.

Each file is held under an exclusive ``flock`` by the process that writes it, for as
long as the file exists; the kernel drops the lock when the process dies, however it
dies. A file nobody holds is an orphan: gateway processes recover orphans when they
start shipping and every ``RECOVER_EVERY_S`` (uvicorn replaces a killed worker with a
new one, which finds its predecessor's files), queueing their events again, spooled
anew, before deleting them. An event that ends up shipped twice (its process shipped
it, then died before deleting the file) is stored once: events are unique by
``event_id``.

A call on its way to an agent is spooled as *open* too (``opened``): its event as it
would read if the process died then, outcome ``worker_lost``, under the event id its
final event will carry. Recovery takes a dead process's files together and queues the
final event of each call, or its open one where none was written: a call the kill cut
short is metered once, as lost, with its agent and capability.

An append is a ``write(2)`` to the page cache, not an ``fsync``: it outlives the process,
not the machine. A failed write (a full disk) is logged and the call goes on; that event
is then as safe as it was without a spool.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson

logger = logging.getLogger(__name__)

RECOVER_EVERY_S = 30.0
PATTERN = "usage-*.jsonl"


OPEN = "open"  # the key marking an open call's line


@dataclass(eq=False)
class _File:
    path: Path
    fd: int
    left: int = 0  # events written to it and not shipped yet
    open: int = 0  # calls opened in it whose final event is not written yet


class UsageSpool:
    """This process's spool files, oldest first; the last is being written. Not
    thread-safe: the usage queue calls it under its own lock."""

    def __init__(self, directory: Path, *, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._clock = clock
        self._files: deque[_File] = deque()
        self._next_recovery = float("-inf")
        self._failing = False
        # One name per process (a pid is reused), then the files in order.
        self._owner = f"usage-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._sequence = 0
        self._open()

    def _open(self) -> None:
        self._sequence += 1
        path = self.directory / f"{self._owner}-{self._sequence:09d}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                     0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._files.append(_File(path, fd))

    def opened(self, event: dict) -> _File | None:
        """A call goes to an agent: ``event`` is what it is metered if this process dies
        before its final event is written (``write(..., opened=)`` with what this
        returns)."""
        if not self._files:  # closed: the process is stopping
            return None
        current = self._files[-1]
        current.open += 1
        self._append(current, {**event, OPEN: True})
        return current

    def write(self, event: dict, opened: _File | None = None) -> None:
        if not self._files:
            return
        current = self._files[-1]
        # Counted even if the write fails: the files' counts must stay in step with the
        # queue's order, or a file could be deleted before its events are shipped.
        current.left += 1
        self._append(current, event)
        if opened is not None:
            self.resolved(opened)

    def resolved(self, opened: _File) -> None:
        """The call whose open line is in ``opened`` ended: its final event was written,
        or a full queue dropped it."""
        opened.open -= 1
        self._delete_done()

    def _append(self, file: _File, line: dict) -> None:
        try:
            os.write(file.fd, orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
            self._failing = False
        except OSError as exc:
            if not self._failing:
                logger.error("usage spool: cannot write to %s (%s); usage events are kept "
                             "in memory only until it can", file.path, exc)
            self._failing = True

    def roll(self) -> None:
        """A new file for what is queued from now on (a drain is taking the rest)."""
        if self._files and self._files[-1].left:
            try:
                self._open()
            except OSError as exc:
                logger.error("usage spool: cannot open a new file (%s)", exc)

    def shipped(self, count: int) -> None:
        """``count`` more of the queued events have been shipped, oldest first: delete the
        files wholly shipped, their calls all ended (never the one being written)."""
        for file in self._files:
            if count <= 0:
                break
            taken = min(count, file.left)
            file.left -= taken
            count -= taken
        self._delete_done()

    def _delete_done(self) -> None:
        if not self._files:
            return
        current = self._files[-1]
        if any(f is not current and not f.left and not f.open for f in self._files):
            kept = deque()
            for file in self._files:
                if file is current or file.left or file.open:
                    kept.append(file)
                else:
                    _delete(file.path, file.fd)
            self._files = kept

    def recover(self, emit: Callable[[dict], None]) -> int:
        """Queue again (``emit``) the events of orphaned files, then delete them; returns
        how many. At most once per ``RECOVER_EVERY_S``."""
        now = self._clock()
        if now < self._next_recovery:
            return 0
        self._next_recovery = now + RECOVER_EVERY_S
        owners: dict[str, list[Path]] = {}
        for path in sorted(self.directory.glob(PATTERN)):
            owners.setdefault(path.name.rsplit("-", 1)[0], []).append(path)
        owners.pop(self._owner, None)
        recovered = 0
        for paths in owners.values():
            recovered += _recover(paths, emit)
        if recovered:
            logger.warning("usage spool: %d usage events recovered from gateway processes "
                           "that stopped before shipping them", recovered)
        return recovered

    def close(self) -> None:
        """Let go of the files (at shutdown): those still holding events or open calls are
        orphans for the next process to ship; the others are deleted."""
        while self._files:
            file = self._files.popleft()
            if file.left or file.open:
                os.close(file.fd)
            else:
                _delete(file.path, file.fd)


def _recover(paths: list[Path], emit: Callable[[dict], None]) -> int:
    """One dead process's files, taken together: each call's final event, or its open
    one where it has none. Nothing if any of them is held (its process lives, or another
    process is recovering them)."""
    held: list[tuple[Path, int]] = []
    try:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # recovered by another process meanwhile
            held.append((path, fd))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino != os.stat(path).st_ino:
                    return 0
            except (BlockingIOError, FileNotFoundError):
                return 0
        final: dict[str, dict] = {}
        lost: dict[str, dict] = {}
        for _, fd in held:
            with os.fdopen(os.dup(fd), "rb") as lines:
                data = lines.read()
            for line in data.splitlines():
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a line its process did not finish: the event never existed
                if not isinstance(event, dict) or not isinstance(event.get("event_id"), str):
                    continue
                if event.pop(OPEN, False):
                    lost[event["event_id"]] = event
                else:
                    final[event["event_id"]] = event
        events = [*final.values(), *(e for i, e in lost.items() if i not in final)]
        for event in events:
            emit(event)
        for path, _ in held:
            path.unlink(missing_ok=True)
        return len(events)
    finally:
        for _, fd in held:
            os.close(fd)


def _delete(path: Path, fd: int) -> None:
    # Unlinked while still locked: no other process can take it for an orphan meanwhile.
    with contextlib.suppress(OSError):
        path.unlink()
    os.close(fd)
