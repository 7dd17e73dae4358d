"""A test-owned TCP forwarder: simulate a server outage without touching the server.

Point the process under test at a ``Forwarder`` instead of the real service (for example a
``DATABASE_URL`` with the forwarder's port), then ``cut()`` it: to that process the service
has gone away, while the machine's shared PostgreSQL or Redis keeps serving everyone else,
including the test itself.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

_DEFAULT_PORTS = {"postgres": 5432, "postgresql": 5432, "redis": 6379, "rediss": 6379}


def _shut(sock: socket.socket) -> None:
    # shutdown(), unlike close(), wakes a thread blocked in recv() on this socket.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _reset(sock: socket.socket) -> None:
    """Close with an RST rather than a FIN: the peer fails at once instead of reading EOF
    later, as when connecting to a port where nothing listens."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Link:
    """One forwarded connection: the client's socket, ours to the target, and two pumps."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.pumps: list[threading.Thread] = []
        self.finished = 0  # pumps that have ended, under the forwarder's lock

    def shut(self) -> None:
        _shut(self.client)
        _shut(self.upstream)


class Forwarder:
    """Forwards TCP connections from a free port on 127.0.0.1 to ``host:port``.

    Contract:

    - Every connection accepted on ``port`` gets its own new connection to the target and
      bytes are copied both ways until either side closes or fails; then both are closed.
    - ``cut()`` closes every open connection (the client reads EOF, as when a server shuts
      down) and, until ``restore()``, resets each new connection as soon as it is accepted,
      so clients fail at once as against a stopped server. The listening port stays this
      forwarder's throughout, so no other process can take it during an outage.
    - ``restore()`` forwards new connections again; connections that were cut stay closed
      and clients must reconnect, as after a real restart.
    - ``freeze()`` (a context manager) keeps every connection open but forwards nothing,
      either way, until the block ends, as a hung server does (``SIGSTOP``, a partition
      dropping packets): clients see no error, only silence, until their own timeouts.
    - ``accepted`` counts the connections forwarded so far (refused ones excluded, counted
      in ``refused``): a test
      asserts it is non-zero to prove the process under test really goes through here.
    - ``close()`` (or leaving the ``with`` block) stops listening and closes everything.

    Threads are daemons: a forwarder the test forgot to close cannot hang the interpreter.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._cut = False
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self.accepted = 0
        self.refused = 0  # connections reset during a cut
        self._listener = socket.create_server(("127.0.0.1", 0))
        # Accept polls so close() is noticed without relying on platform-specific wake-ups.
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                          name=f"forwarder:{self.port}")
        self._acceptor.start()

    @classmethod
    def for_url(cls, url: str) -> Forwarder:
        """A forwarder to the host and port of ``url`` (scheme default port if absent)."""
        parts = urlsplit(url)
        if not parts.hostname:
            raise ValueError(f"no host in {url!r}: nothing to forward to")
        return cls(parts.hostname, parts.port or _DEFAULT_PORTS[parts.scheme])

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by this forwarder's (user, path kept)."""
        parts = urlsplit(url)
        userinfo, _, _ = parts.netloc.rpartition("@")
        netloc = f"{userinfo}@" if userinfo else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{self.port}"))

    # --- outage control -----------------------------------------------------------------

    def cut(self) -> None:
        """Close every open connection and refuse new ones until ``restore()``.

        Returns once every forwarded connection has been shut down on both sides.
        """
        with self._lock:
            self._cut = True
            links = list(self._links)
        for link in links:
            link.shut()
        for link in links:
            for pump in link.pumps:
                pump.join(timeout=5)

    def restore(self) -> None:
        """Forward new connections again."""
        with self._lock:
            self._cut = False

    @contextlib.contextmanager
    def freeze(self) -> Iterator[None]:
        """Forward nothing for the block, closing nothing; what was held flows after."""
        self._flowing.clear()
        try:
            yield
        finally:
            self._flowing.set()

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """``cut()`` for the block; ``restore()`` afterwards, even if the block failed."""
        self.cut()
        try:
            yield
        finally:
            self.restore()

    # --- lifetime -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop listening and close every connection. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._acceptor.join(timeout=5)
        self._listener.close()
        self.cut()

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                continue
            client.settimeout(None)
            if self._cut:
                _reset(client)
                self.refused += 1
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)  # the target itself is down: pass that on at once
                continue
            upstream.settimeout(None)
            with self._lock:
                # A cut may have begun while we connected to the target: honour it.
                if self._cut or self._closed.is_set():
                    _reset(client)
                    _reset(upstream)
                    continue
                link = _Link(client, upstream)
                link.pumps = [
                    threading.Thread(target=self._pump, args=(src, dst, link), daemon=True)
                    for src, dst in ((client, upstream), (upstream, client))
                ]
                self._links.add(link)
                self.accepted += 1
                # Started under the lock, so cut() never sees a link with unstarted pumps.
                for pump in link.pumps:
                    pump.start()

    def _pump(self, src: socket.socket, dst: socket.socket, link: _Link) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # One direction is over: end the other too, the protocols here never half-close.
            link.shut()
            with self._lock:
                link.finished += 1
                last = link.finished == len(link.pumps)
                if last:
                    self._links.discard(link)
            if last:
                # Closed only by the last pump: no thread can still be using either socket.
                link.client.close()
                link.upstream.close()
