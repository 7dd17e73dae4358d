"""Loopback servers that fail HTTP calls in precise ways, and one that records them.

- ``LossyProxy`` delivers each request and then loses the reply: it reads one whole
  request (headers and a ``Content-Length`` body) from the client, sends it to the
  target, waits for the target's answer, and then resets the client's connection
  instead of relaying it: the agent has done the work, the caller never hears.
- ``ResetServer`` resets each connection once it has read the request's headers, before
  reading its body: a caller sending a body larger than the sockets' buffers is still
  sending when the reset comes, so the request provably never arrived whole.
- ``HungServer`` accepts, reads, and never answers.
- ``RelayProxy`` relays each request to a target and records when each one arrived,
  so a test can tell when a caller sent a request to a process that cannot say
  (a SIGSTOPped agent).

Loopback only; ``close()`` (or the ``with`` block) stops each.
"""

from __future__ import annotations

import socket
import struct
import threading
import time


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The request's head (up to the blank line) and whatever of its body came with it;
    the head is empty if the peer closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b"", data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body


def _reset(sock: socket.socket) -> None:
    """Close with an RST, not a FIN: the peer fails as on a connection reset."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _read_request(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class _Server:
    """Accepts connections on a free loopback port, each handed to ``_one`` in a thread."""

    def __init__(self, *, receive_buffer: int | None = None) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        if receive_buffer is not None:  # inherited by the accepted connections
            self._server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.port = self._server.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(client,), daemon=True).start()

    def _one(self, client: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._server.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LossyProxy(_Server):
    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self.delivered = 0  # requests the target answered (and the client never saw)
        super().__init__()

    def _one(self, client: socket.socket) -> None:
        with client:
            request = _read_request(client)
            if request:
                with socket.create_connection(self._target, timeout=10) as upstream:
                    upstream.sendall(request.replace(b"Connection: keep-alive",
                                                     b"Connection: close"))
                    if upstream.recv(65536):
                        self.delivered += 1
            # RST, not FIN: the caller's read fails as on a connection reset.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class ResetServer(_Server):
    """Reads each request's headers, then resets the connection without reading the body.

    ``heads`` counts the request heads read; ``complete`` counts requests whose whole
    body had arrived by then (zero when callers send more than fits in the socket
    buffers: the agent never saw a complete request)."""

    def __init__(self) -> None:
        self.heads = 0
        self.complete = 0
        # A small window: what the caller has sent beyond it waits in the caller's buffers.
        super().__init__(receive_buffer=4096)

    def _one(self, client: socket.socket) -> None:
        head, body = _read_head(client)
        if head:
            self.heads += 1
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            self.complete += len(body) >= length
        _reset(client)


class RelayProxy(_Server):
    """Relays each request to ``target_port`` (one connection per request, ``Connection:
    close``) and the target's whole answer back. ``arrivals`` holds, per request, the
    wall-clock time (``time.time()``) its last byte arrived here, whether or not the
    target ever answers it."""

    def __init__(self, target_port: int) -> None:
        self._target = ("127.0.0.1", target_port)
        self.arrivals: list[float] = []
        self._lock = threading.Lock()
        super().__init__()

    def _one(self, client: socket.socket) -> None:
        with client:
            request = _read_request(client)
            if not request:
                return
            with self._lock:
                self.arrivals.append(time.time())
            head, _, body = request.partition(b"\r\n\r\n")
            lines = [line for line in head.split(b"\r\n")
                     if not line.lower().startswith(b"connection:")]
            request = b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + body
            try:
                with socket.create_connection(self._target, timeout=60) as upstream:
                    upstream.sendall(request)
                    while chunk := upstream.recv(65536):
                        client.sendall(chunk)
            except OSError:
                pass  # the caller gave up, or the target is gone: nothing to relay

    def since(self, moment: float) -> list[float]:
        with self._lock:
            return [t for t in self.arrivals if t > moment]


class HungServer(_Server):
    """Accepts connections, reads what is sent, and never answers (an agent that hangs)."""

    def __init__(self) -> None:
        self._open: list[socket.socket] = []
        super().__init__()

    def _one(self, client: socket.socket) -> None:
        self._open.append(client)  # held open, never answered

    def close(self) -> None:
        super().close()
        for client in self._open:
            client.close()
