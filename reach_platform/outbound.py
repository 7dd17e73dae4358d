"""The control plane's outbound HTTP: health probes, Agent Card fetches and task callbacks.

Every call goes through ``bounded_request``:

* the host is resolved once and every address checked against the endpoint
  policy; the connection goes to a checked address, never to a second lookup
  (the ``Host`` header and the TLS server name stay the URL's host), so a name
  re-pointed at a refused address between the check and the call is refused;
* redirects are never followed (a 3xx is an answer like any other);
* at most ``max_bytes`` of the answer are read, and the whole call (connect, TLS,
  request, headers, body) has one deadline.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass

import httpcore

from reach_core.endpoints import (
    BlockingResolver,
    EndpointPolicy,
    resolve_and_check_target,
)

USER_AGENT = b"agent-reach-control-plane"


class FetchFailed(Exception):
    """The call did not produce an answer: connection, TLS, protocol or deadline trouble."""


@dataclass(frozen=True)
class BoundedResponse:
    status: int
    body: bytes  # at most max_bytes
    complete: bool  # False: the body was longer than max_bytes and was cut off there
    received: int  # bytes read off the socket, headers included


class _DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every operation is bounded by one overall deadline."""

    def __init__(self, inner: httpcore.NetworkStream, fetch: _Fetch) -> None:
        self._inner = inner
        self._fetch = fetch

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._inner.read(max_bytes, self._fetch.left(timeout))
        self._fetch.received += len(data)
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._fetch.left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, self._fetch.left(timeout))
        return _DeadlineStream(inner, self._fetch)

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _Fetch(httpcore.SyncBackend):
    """The network backend of one call: connects only to the checked addresses."""

    def __init__(self, addresses: tuple[str, ...], deadline_s: float,
                 connect_timeout_s: float) -> None:
        self._addresses = addresses
        self._deadline = time.monotonic() + deadline_s
        self._connect_timeout_s = connect_timeout_s
        self.received = 0

    def left(self, timeout: float | None) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ReadTimeout("the call's deadline passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        # ``host`` is the URL's name: it was resolved and checked once already, and
        # resolving it again here is exactly what DNS rebinding would exploit.
        error: Exception | None = None
        for address in self._addresses:
            try:
                stream = super().connect_tcp(
                    address, port, timeout=self.left(min(timeout or self._connect_timeout_s,
                                                         self._connect_timeout_s)),
                    local_address=local_address, socket_options=socket_options)
            except httpcore.ConnectError as exc:
                error = exc
                continue
            return _DeadlineStream(stream, self)
        raise error or httpcore.ConnectError("no address to connect to")

    def connect_unix_socket(self, *args, **kwargs):  # pragma: no cover - never asked for
        raise httpcore.ConnectError("unix sockets are not agent endpoints")


def bounded_request(
    method: str,
    url: str,
    policy: EndpointPolicy,
    *,
    max_bytes: int,
    deadline_s: float,
    connect_timeout_s: float,
    headers: tuple[tuple[bytes, bytes], ...] = (),
    body: bytes = b"",
    resolver: BlockingResolver | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> BoundedResponse:
    """``method`` ``url`` under the endpoint policy, pinned to the checked addresses,
    reading at most ``max_bytes`` of the answer within ``deadline_s`` overall; no
    redirects.

    Raises ``EndpointRefused`` (policy), ``OSError`` (resolution) or ``FetchFailed``."""
    target = resolve_and_check_target(url, policy, resolver)
    fetch = _Fetch(target.addresses, deadline_s, connect_timeout_s)
    request_headers = [(b"Host", target.host_header.encode()), (b"User-Agent", USER_AGENT),
                       (b"Accept-Encoding", b"identity"), *headers]
    timeouts = {"connect": connect_timeout_s, "read": deadline_s, "write": deadline_s,
                "pool": deadline_s}
    try:
        with httpcore.ConnectionPool(ssl_context=ssl_context, network_backend=fetch,
                                     max_connections=1, retries=0) as pool, \
                pool.stream(method, target.url, headers=request_headers, content=body or None,
                            extensions={"timeout": timeouts}) as response:
            body = bytearray()
            for chunk in response.iter_stream():
                body += chunk
                if len(body) > max_bytes:
                    # Leaving the block closes the connection: the rest is never read.
                    return BoundedResponse(response.status, bytes(body[:max_bytes]), False,
                                           fetch.received)
            return BoundedResponse(response.status, bytes(body), True, fetch.received)
    except httpcore.TimeoutException as exc:
        raise FetchFailed(f"no complete answer within {deadline_s:g}s") from exc
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol,
            OSError) as exc:
        raise FetchFailed(f"{type(exc).__name__}: {exc}") from exc


def bounded_get(url: str, policy: EndpointPolicy, **kwargs) -> BoundedResponse:
    """``bounded_request`` with GET."""
    return bounded_request("GET", url, policy, **kwargs)
