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


@dataclass
class _File:
    path: Path
    fd: int
    left: int = 0  # events written to it and not shipped yet


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
        self._open()

    def _open(self) -> None:
        path = self.directory / f"usage-{os.getpid()}-{uuid.uuid4().hex}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                     0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._files.append(_File(path, fd))

    def write(self, event: dict) -> None:
        current = self._files[-1]
        # Counted even if the write fails: the files' counts must stay in step with the
        # queue's order, or a file could be deleted before its events are shipped.
        current.left += 1
        try:
            os.write(current.fd, orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE))
            self._failing = False
        except OSError as exc:
            if not self._failing:
                logger.error("usage spool: cannot write to %s (%s); usage events are kept "
                             "in memory only until it can", current.path, exc)
            self._failing = True

    def roll(self) -> None:
        """A new file for what is queued from now on (a drain is taking the rest)."""
        if self._files[-1].left:
            try:
                self._open()
            except OSError as exc:
                logger.error("usage spool: cannot open a new file (%s)", exc)

    def shipped(self, count: int) -> None:
        """``count`` more of the queued events have been shipped, oldest first: delete the
        files wholly shipped (never the one being written)."""
        while count > 0 and self._files:
            oldest = self._files[0]
            taken = min(count, oldest.left)
            oldest.left -= taken
            count -= taken
            if oldest.left or len(self._files) == 1:
                break
            self._files.popleft()
            _delete(oldest.path, oldest.fd)

    def recover(self, emit: Callable[[dict], None]) -> int:
        """Queue again (``emit``) the events of orphaned files, then delete them; returns
        how many. At most once per ``RECOVER_EVERY_S``."""
        now = self._clock()
        if now < self._next_recovery:
            return 0
        self._next_recovery = now + RECOVER_EVERY_S
        mine = {f.path for f in self._files}
        recovered = 0
        for path in sorted(self.directory.glob(PATTERN)):
            if path not in mine:
                recovered += _recover(path, emit)
        if recovered:
            logger.warning("usage spool: %d usage events recovered from gateway processes "
                           "that stopped before shipping them", recovered)
        return recovered

    def close(self) -> None:
        """Let go of the files (at shutdown): those still holding events are orphans for
        the next process to ship; empty ones are deleted."""
        while self._files:
            file = self._files.popleft()
            if file.left:
                os.close(file.fd)
            else:
                _delete(file.path, file.fd)


def _recover(path: Path, emit: Callable[[dict], None]) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0  # another process recovered it first
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # its process is alive (or another one is recovering it)
        try:
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                return 0
        except FileNotFoundError:
            return 0  # recovered and deleted by another process meanwhile
        with os.fdopen(os.dup(fd), "rb") as lines:
            data = lines.read()
        count = 0
        for line in data.splitlines():
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a line its process did not finish: the event never existed
            if isinstance(event, dict):
                emit(event)
                count += 1
        path.unlink(missing_ok=True)
        return count
    finally:
        os.close(fd)


def _delete(path: Path, fd: int) -> None:
    # Unlinked while still locked: no other process can take it for an orphan meanwhile.
    with contextlib.suppress(OSError):
        path.unlink()
    os.close(fd)
