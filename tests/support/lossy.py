"""A proxy that delivers each HTTP request and then loses the reply.

It reads one whole request (headers and a ``Content-Length`` body) from the client,
sends it to the target, waits for the target's answer, and then resets the client's
connection instead of relaying it: the agent has done the work, the caller never hears.
Loopback only; ``close()`` (or the ``with`` block) stops it.
"""

from __future__ import annotations

import socket
import struct
import threading


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

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
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
