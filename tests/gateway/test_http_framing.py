"""The HTTP framing around every door, on a real gateway process
(reach_platform.http_protocol): request heads have a deadline — a connection that sends
nothing, or drips its head, is closed, with 408 request_timeout when a head had begun —
while a kept-alive connection idle between requests and a request whose head is in are
not touched; and bytes that are no HTTP request (smuggling attempts) get 400 in the one
error shape, the connection closed, nothing of them reaching an agent."""

from __future__ import annotations

import json
import socket
import time

import pytest

HEAD = "POST /v1/invoke HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"


def connect(gateway) -> socket.socket:
    host, port = gateway.base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def read_all(sock: socket.socket) -> bytes:
    """Everything until the gateway closes the connection (10 s at most per read)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def call(gateway, capability: str) -> bytes:
    body = json.dumps({"capability": capability, "input": {}}).encode()
    return (f"{HEAD}Authorization: Bearer {gateway.key}\r\nContent-Length: {len(body)}"
            "\r\n\r\n").encode() + body


@pytest.mark.gateway_env(REACH_HEADER_TIMEOUT_S="0.5")
def test_a_dripped_head_gets_408_and_a_silent_connection_is_closed(gateway):
    with connect(gateway) as silent, connect(gateway) as dripping:
        sent = 0
        # One byte at a time, never the end of the head: under a second's worth of
        # bytes per half second, for longer than the deadline.
        started = time.monotonic()
        reply = b""
        for byte in HEAD.encode():
            try:
                dripping.sendall(bytes([byte]))
            except OSError:
                break
            sent += 1
            time.sleep(0.05)  # the drip's pace is what is under test
            dripping.setblocking(False)
            try:
                reply = dripping.recv(65536)
            except BlockingIOError:
                reply = b""
            finally:
                dripping.settimeout(10)
            if reply:
                break
        reply += read_all(dripping)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert b'"request_timeout"' in reply
        assert sent < len(HEAD), "the whole drip went in: no deadline"
        assert time.monotonic() - started < 10
        assert read_all(silent) == b""  # closed without a word: it never began a request


@pytest.mark.gateway_env(REACH_HEADER_TIMEOUT_S="0.5")
def test_idle_kept_alive_connections_and_slow_calls_are_not_cut(gateway):
    with connect(gateway) as sock:
        sock.sendall(call(gateway, "echo.all"))
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        # Idle between requests for longer than the head deadline (within keep-alive),
        # then a call whose agent takes 2 s, far past it: both are served.
        time.sleep(1.0)  # the idle time is what is under test
        sock.sendall(call(gateway, "slow.op"))
        second = sock.recv(65536)
        assert second.startswith(b"HTTP/1.1 200"), second[:300]


@pytest.mark.parametrize("framing", [
    "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "Content-Length: 5\r\nContent-Length: 7\r\n\r\n{}",
    "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "Content-Length: -1\r\n\r\n",
    "X-Request-ID: a\x00b\r\nContent-Length: 2\r\n\r\n{}",
    "Transfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
])
def test_bytes_that_are_no_request_get_400_in_the_one_error_shape(gateway, framing):
    with connect(gateway) as sock:
        sock.sendall(f"{HEAD}Authorization: Bearer {gateway.key}\r\n{framing}".encode())
        reply = read_all(sock)  # and the connection is closed
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply[:300]
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request" and error["retryable"] is False
    assert f"x-request-id: {error['request_id']}".encode() in head.lower()
    assert not [s for s in gateway.seen() if s["path"] == "/echo"]
    with gateway.client() as client:  # and the gateway serves on
        assert client.post("/v1/invoke", json={"capability": "echo.all",
                                               "input": {}}).status_code == 200


def test_a_websocket_upgrade_anywhere_but_the_tunnel_gets_404_in_the_one_shape(gateway):
    with connect(gateway) as sock:
        sock.sendall(b"GET /v1/invoke HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Sec-WebSocket-Version: 13\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404"), reply[:300]
    error = json.loads(body)["error"]
    assert error["code"] == "not_found"
    assert f"x-request-id: {error['request_id']}".encode() in head.lower()
