"""The HTTP framing around every door, on a real gateway process
(reach_platform.http_protocol): request heads have a deadline — a connection that sends
nothing, or drips its head, is closed, with 408 request_timeout when a head had begun —
while a kept-alive connection idle between requests and a request whose head is in are
not touched; and bytes that are no HTTP request (smuggling attempts) get 400 in the one
error shape, the connection closed, nothing of them reaching an agent."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time

import pytest

from tests.support.metrics import scrape
from tests.support.waiting import wait_for

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
    # RFC 9112 3.2: exactly one Host (helper-50: two, or none, were served).
    "Host: elsewhere\r\nContent-Length: 2\r\n\r\n{}",
    "no host",
    # A WebSocket handshake that is not a GET (helper-50: a plain-text 400).
    "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nContent-Length: 2\r\n\r\n{}",
])
def test_bytes_that_are_no_request_get_400_in_the_one_error_shape(gateway, framing):
    head = HEAD
    if framing == "no host":
        head, framing = HEAD.replace("Host: gw\r\n", ""), "Content-Length: 2\r\n\r\n{}"
    with connect(gateway) as sock:
        sock.sendall(f"{head}Authorization: Bearer {gateway.key}\r\n{framing}".encode())
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


@pytest.mark.parametrize("host", ["gw /v1/admin", "gw/v1", "user@gw", "gw:80:81", "[::1",
                                  "gw:port", "gw:123456"])
def test_a_host_that_is_no_host_name_gets_400(gateway, host):
    """RFC 9112 3.2: a Host that is not ``host[:port]`` is a 400 (helper-52: a Host with a
    path and spaces was served); ordinary names, addresses and ports are served."""
    with connect(gateway) as sock:
        sock.sendall(call(gateway, "echo.all").replace(b"Host: gw\r\n",
                                                       f"Host: {host}\r\n".encode()))
        reply = read_all(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply[:300]
    assert json.loads(body)["error"]["code"] == "bad_request"
    assert not [s for s in gateway.seen() if s["path"] == "/echo"]
    for good in ("127.0.0.1:8000", "[::1]:80", "gw.example-1.internal", "GW"):
        with connect(gateway) as sock:
            sock.sendall(call(gateway, "echo.all").replace(b"Host: gw\r\n",
                                                           f"Host: {good}\r\n".encode()))
            assert read_reply(sock).startswith(b"HTTP/1.1 200"), good


@pytest.mark.parametrize("version", ["2.0", "3.0", "0.9"])
def test_a_request_line_of_another_http_version_gets_505(gateway, version):
    """helper-53: "POST /v1/invoke HTTP/2.0" was served (and its agent called)."""
    with connect(gateway) as sock:
        sock.sendall(call(gateway, "echo.all").replace(b"HTTP/1.1", f"HTTP/{version}".encode(),
                                                       1))
        reply = read_all(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    if version == "2.0":
        assert head.startswith(b"HTTP/1.1 505"), reply[:300]
    elif not head.startswith(b"HTTP/1.1 505"):  # llhttp may refuse it first
        assert head.startswith(b"HTTP/1.1 400"), reply[:300]
    assert json.loads(body)["error"]["code"] == "bad_request"
    assert not [s for s in gateway.seen() if s["path"] == "/echo"]


TUNNEL = (b"GET /v1/tunnel HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\n"
          b"Connection: Upgrade\r\nX-Reach-Instance: 1\r\n")


@pytest.mark.parametrize("handshake, status", [
    (b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n", b"426"),
    (b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", b"426"),
    (b"Sec-WebSocket-Version: 13\r\n", b"400"),
    (b"Sec-WebSocket-Key: not base64!\r\nSec-WebSocket-Version: 13\r\n", b"400"),
    (b"Sec-WebSocket-Key: c2hvcnQ=\r\nSec-WebSocket-Version: 13\r\n", b"400"),
    (b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="
     b"\r\nSec-WebSocket-Version: 13\r\n", b"400"),
])
def test_a_malformed_websocket_handshake_is_answered_in_the_one_shape(gateway, handshake,
                                                                       status):
    """helper-52: a tunnel handshake with a version other than 13, or without a valid
    key, got the WebSocket protocol's plain-text 400. RFC 6455 4.2.2: an unsupported
    version is 426 naming the version spoken."""
    with connect(gateway) as sock:
        sock.sendall(TUNNEL + handshake + b"\r\n")
        reply = read_all(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status), reply[:300]
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request"
    assert f"x-request-id: {error['request_id']}".encode() in head.lower()
    assert (b"sec-websocket-version: 13" in head.lower()) == (status == b"426")


@pytest.mark.parametrize("auth, status, code", [
    ("", b"401", "unauthorized"),
    ("Authorization: Bearer rt_not_a_token\r\n", b"401", "unauthorized"),
])
def test_a_tunnel_handshake_refused_is_answered_in_the_one_shape(gateway, auth, status, code):
    """helper-50: a tunnel handshake without a token got a bare 403, no body, no id."""
    with connect(gateway) as sock:
        sock.sendall(b"GET /v1/tunnel HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Sec-WebSocket-Version: 13\r\nX-Reach-Instance: 1\r\n"
                     + auth.encode() + b"\r\n")
        reply = read_reply(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status), reply[:300]
    error = json.loads(body)["error"]
    assert error["code"] == code
    assert f"x-request-id: {error['request_id']}".encode() in head.lower()


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


def read_reply(sock: socket.socket) -> bytes:
    """One sized reply: its head and its Content-Length's worth of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.mark.gateway_env(REACH_HEADER_TIMEOUT_S="0.5")
def test_a_body_still_dripping_after_its_early_reply_does_not_hold_the_connection(gateway):
    """A stranger's body is never read: the 401 goes out at once. The connection must not
    then stay open for as long as the caller keeps dripping the rest of a body it
    announced (1 MB here): the gateway half-closes after the reply, discards what still
    comes for at most the head deadline, and closes."""
    with connect(gateway) as sock:
        sock.sendall(f"{HEAD}Content-Length: 1000000\r\n\r\n{{\"cap".encode())
        reply = read_reply(sock)
        assert reply.startswith(b"HTTP/1.1 401"), reply[:300]
        assert b"\r\nconnection: close\r\n" in reply.lower()  # not to be reused
        started, closed = time.monotonic(), False
        while time.monotonic() - started < 5:
            try:
                sock.sendall(b" ")
                sock.setblocking(False)
                try:
                    closed = sock.recv(65536) == b""  # the gateway's FIN, or its close
                except BlockingIOError:
                    pass
                finally:
                    sock.settimeout(10)
            except OSError:  # reset: the gateway closed while bytes kept coming
                closed = True
            if closed:
                break
            time.sleep(0.05)  # the drip's pace is what is under test
        assert closed, "the connection was held open by a body nobody reads"
    with gateway.client() as client:  # and the gateway serves on
        assert client.post("/v1/invoke", json={"capability": "echo.all",
                                               "input": {}}).status_code == 200


def test_an_early_reply_to_a_body_all_in_keeps_the_connection(gateway):
    """The lingering close is for bodies still coming: a refused request whose body is
    all in leaves its connection kept alive for the next request."""
    with connect(gateway) as sock:
        body = b'{"capability": "echo.all", "input": {}}'
        sock.sendall(f"{HEAD}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert read_reply(sock).startswith(b"HTTP/1.1 401")
        sock.sendall(call(gateway, "echo.all"))
        assert read_reply(sock).startswith(b"HTTP/1.1 200")


def drip_until_reply(sock: socket.socket, seconds: float) -> bytes:
    """Send a space every 50 ms until the gateway answers (or ``seconds`` pass)."""
    started, reply = time.monotonic(), b""
    while not reply and time.monotonic() - started < seconds:
        try:
            sock.sendall(b" ")
        except OSError:
            break
        time.sleep(0.05)  # the drip's pace is what is under test
        sock.setblocking(False)
        try:
            reply = sock.recv(65536)
        except BlockingIOError:
            pass
        finally:
            sock.settimeout(10)
    return reply


@pytest.mark.gateway_env(REACH_GATEWAY_BODY_TIMEOUT_S="0.5", REACH_HEADER_TIMEOUT_S="0.5")
def test_the_control_plane_bounds_a_dripped_body_in_time(gateway):
    """The API (Django) reads a body before any view runs, and would wait on a dripped
    one for ever: it has the gateway's body deadline, answered 408 request_timeout."""
    with connect(gateway) as sock:
        sock.sendall(b"POST /api/v1/agents/register HTTP/1.1\r\nHost: gw\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
        reply = drip_until_reply(sock, 5)
        reply += read_all(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply[:300]
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout"
    assert f"x-request-id: {error['request_id']}".encode() in head.lower()


def test_the_control_plane_refuses_a_declared_oversized_body_before_reading_it(gateway):
    """A declared length over the API's limit is refused at once: the body is not read
    (nor spooled to disk, as Django's handler would) to find out."""
    with connect(gateway) as sock:
        sock.sendall(b"POST /api/v1/agents/register HTTP/1.1\r\nHost: gw\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
        reply = read_reply(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), reply[:300]
    assert json.loads(body)["error"]["code"] == "payload_too_large"


def test_a_malformed_request_pipelined_behind_a_call_gets_its_400_after_the_calls_reply(
        gateway):
    """Replies go out in request order: a 400 for bytes that follow a call on the same
    connection must not overtake (and cut off) the call's own reply."""
    with connect(gateway) as sock:
        sock.sendall(call(gateway, "slow.op") + call(gateway, "echo.all")
                     + b"GET /v1/models HTTP/1.1\r\nHost: gw\r\nContent-Length: -1\r\n\r\n")
        replies = read_all(sock)
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", replies)
    assert statuses == [b"200", b"200", b"400"], replies[:600]
    assert len([s for s in gateway.seen() if s["path"] in ("/echo", "/slow")]) == 2


@pytest.mark.gateway_env(REACH_HEADER_TIMEOUT_S="0.5")
def test_a_slow_head_pipelined_behind_a_slow_call_gets_its_408_after_the_calls_reply(
        gateway):
    with connect(gateway) as sock:
        # The call takes 2 s; the next request's head begins at once and never ends.
        sock.sendall(call(gateway, "slow.op") + b"POST /v1/invoke HTTP/1.1\r\nHost: gw\r\n")
        replies = read_all(sock)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", replies) == [b"200", b"408"], replies[:600]
    assert b'"request_timeout"' in replies


def statuses(replies: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", replies)


@pytest.mark.parametrize("upgrade", [
    "Connection: Upgrade\r\nUpgrade: h2c",
    "Connection: upgrade\r\nConnection: keep-alive\r\nUpgrade: websocket\r\nUpgrade: h2c",
    "Connection: keep-alive\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nUpgrade: websocket",
])
def test_an_upgrade_other_than_websocket_is_refused_and_smuggles_nothing(gateway, upgrade):
    """The parser hands what follows an Upgrade head to the new protocol: the body was
    dropped, or — arriving later — run as a request of its own (a smuggled call)."""
    smuggled = call(gateway, "echo.all")
    with connect(gateway) as sock:
        sock.sendall(f"{HEAD}Authorization: Bearer {gateway.key}\r\n{upgrade}\r\n"
                     f"Content-Length: {len(smuggled)}\r\n\r\n".encode())
        time.sleep(0.2)  # the body in a later segment: how the smuggling worked
        with contextlib.suppress(OSError):  # closed already: nothing was smuggled
            sock.sendall(smuggled)
        replies = read_all(sock)
    assert statuses(replies) == [b"400"], replies[:600]
    assert b'"bad_request"' in replies and b"h2c" in replies
    assert not [s for s in gateway.seen() if s["path"] == "/echo"]


@pytest.mark.parametrize("path", ["/v1/invoke", "/api/v1/agents"])
def test_a_head_that_never_ends_is_bounded_in_size(gateway, path):
    """Before the head is whole, the parser holds it: 431 once it passes 64 KiB,
    without waiting for its end (the API has no limit of its own on heads)."""
    with connect(gateway) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: gw\r\nX-Big: ".encode())
        try:
            for _ in range(40):  # 640 KiB at most, never a line end
                sock.sendall(b"a" * 16384)
        except OSError:
            pass  # refused and closed while sending
        replies = read_all(sock)
    assert statuses(replies) == [b"431"], replies[:300]
    assert b'"headers_too_large"' in replies


@pytest.mark.parametrize("path", ["/v1/invoke", "/api/v1/agents"])
def test_a_whole_head_over_the_bound_is_refused_too(gateway, path):
    """A head that arrives complete in one read (the parser takes up to 256 KiB at once)
    is held to the same 64 KiB: 431, not served."""
    pad = "".join(f"X-Pad-{i}: {'p' * 1000}\r\n" for i in range(100))
    with connect(gateway) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: gw\r\n{pad}\r\n".encode())
        replies = read_all(sock)
    assert statuses(replies) == [b"431"], replies[:300]
    assert b'"headers_too_large"' in replies
    assert b"x-should-retry: false" in replies  # as every gateway error says


@pytest.mark.gateway_env(REACH_HEADER_TIMEOUT_S="0.5")
def test_a_lone_crlf_does_not_keep_a_kept_alive_connection_open(gateway):
    with connect(gateway) as sock:
        sock.sendall(call(gateway, "echo.all"))
        assert read_reply(sock).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        sock.sendall(b"\r\n")
        assert read_all(sock) == b""  # closed, with nothing said: no request had begun
        assert time.monotonic() - started < 5  # the head deadline, not the keep-alive's


def test_a_broken_body_pipelined_behind_a_call_does_not_cut_its_reply(gateway):
    with connect(gateway) as sock:
        sock.sendall(call(gateway, "slow.op") + f"{HEAD}Authorization: Bearer {gateway.key}"
                     "\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".encode())
        replies = read_all(sock)
    assert statuses(replies) == [b"200", b"400"], replies[:600]
    assert not [s for s in gateway.seen() if s["path"] == "/echo"]


def test_an_early_reply_pipelined_behind_a_call_is_sent(gateway):
    with connect(gateway) as sock:
        sock.sendall(call(gateway, "slow.op")
                     + f"{HEAD}Content-Length: 1000000\r\n\r\n{{\"cap".encode())
        replies = read_all(sock)
    assert statuses(replies) == [b"200", b"401"], replies[:600]


def _calls_to(gateway, path: str) -> int:
    return len([s for s in gateway.seen() if s["path"] == path and "body" in s])


def _gone(gateway) -> int:
    return len([s for s in gateway.seen() if s.get("caller_gone")])


def _cancelled(gateway) -> float:
    return scrape(gateway.base, "reach_calls_total",
                  {"endpoint": "invoke", "outcome": "client_cancelled"}) or 0


def test_a_caller_gone_before_its_reply_cancels_the_call(gateway):
    """A caller that closes its connection (its own time-out, say) while the agent works
    is gone: the call is cancelled (the agent's connection dropped, its work stopped) and
    metered client_cancelled, not success (nginx answers 499 here, Go cancels)."""
    before, calls, gone = _cancelled(gateway), _calls_to(gateway, "/slow"), _gone(gateway)
    with connect(gateway) as sock:
        sock.sendall(call(gateway, "slow.op"))
        wait_for(lambda: _calls_to(gateway, "/slow") == calls + 1, timeout=10)
    wait_for(lambda: _gone(gateway) == gone + 1, timeout=10,
             message="the agent to find its caller gone")
    assert wait_for(lambda: _cancelled(gateway) == before + 1, timeout=10)


def test_a_half_close_is_the_caller_gone_too(gateway):
    """A FIN after the request cannot be told from a caller that closed and left: the call
    is cancelled, and nothing pipelined after it is run."""
    calls, gone, echoes = _calls_to(gateway, "/slow"), _gone(gateway), _calls_to(gateway, "/echo")
    with connect(gateway) as sock:
        sock.sendall(call(gateway, "slow.op") + call(gateway, "echo.all"))
        wait_for(lambda: _calls_to(gateway, "/slow") == calls + 1, timeout=10)
        sock.shutdown(socket.SHUT_WR)
        replies = read_all(sock)
    assert statuses(replies) == [], replies[:600]
    wait_for(lambda: _gone(gateway) == gone + 1, timeout=10)
    assert _calls_to(gateway, "/echo") == echoes


def test_a_keyed_call_runs_on_when_its_caller_goes_and_its_retry_is_replayed(gateway):
    """A call with an Idempotency-Key is not cancelled: its result is stored, and the
    retry that follows a lost reply gets it without a second agent call."""
    keyed = call(gateway, "slow.op").replace(
        b"Authorization:", b"Idempotency-Key: gone-then-back-1\r\nAuthorization:", 1)
    calls, gone = _calls_to(gateway, "/slow"), _gone(gateway)
    with connect(gateway) as sock:
        sock.sendall(keyed)
        wait_for(lambda: _calls_to(gateway, "/slow") == calls + 1, timeout=10)
    with connect(gateway) as sock:
        sock.sendall(keyed)
        reply = read_reply(sock)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
    assert (_calls_to(gateway, "/slow"), _gone(gateway)) == (calls + 1, gone)


@pytest.mark.gateway_env(REACH_GATEWAY_BODY_TIMEOUT_S="0.5")
def test_a_call_whose_own_body_breaks_is_answered_once(gateway, tmp_path):
    """The 400 is the call's answer: its handler is told the caller is gone, not left
    waiting for the rest of the body to answer 408 across the refusal (an error in the
    server's log, and a call slot held meanwhile)."""
    with connect(gateway) as sock:
        sock.sendall(f"{HEAD}Authorization: Bearer {gateway.key}\r\n"
                     "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".encode())
        reply = read_reply(sock)
        time.sleep(1.5)  # the connection kept open past the body deadline: under test
        rest = read_all(sock)
    assert statuses(reply + rest) == [b"400"], (reply + rest)[:600]
    log = (tmp_path / "gw.log").read_text()
    assert "Exception in ASGI application" not in log, log[-2000:]


@pytest.mark.gateway_env(REACH_HEADER_TIMEOUT_S="1")
def test_the_head_clock_runs_from_a_requests_first_byte_even_a_crlf(gateway):
    with connect(gateway) as sock:
        sock.sendall(call(gateway, "echo.all"))
        assert read_reply(sock).startswith(b"HTTP/1.1 200")
        line, rest = call(gateway, "echo.all").split(b"\r\n", 1)
        sock.sendall(b"\r\n")
        time.sleep(0.5)  # the pace of the head's bytes is what is under test
        sock.sendall(line + b"\r\n")
        # The rest 1.3 s after the CRLF: past its deadline, within one counted from the
        # request line (which would serve the call).
        time.sleep(0.8)
        with contextlib.suppress(OSError):
            sock.sendall(rest)
        replies = read_all(sock)
    assert statuses(replies) == [b"408"], replies[:300]


def test_a_control_plane_caller_gone_mid_body_ends_its_request_quietly(gateway, tmp_path):
    """The API's body reader is the gateway's: a caller that leaves while sending ends
    its request without an answer or an error in the log, and the API serves on."""
    with connect(gateway) as sock:
        sock.sendall(b"POST /api/v1/agents/register HTTP/1.1\r\nHost: gw\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"na")
    host = gateway.base.removeprefix("http://").encode()
    with connect(gateway) as sock:
        sock.sendall(b"POST /api/v1/agents/register HTTP/1.1\r\nHost: " + host + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 2\r\n"
                     b"Connection: close\r\n\r\n{}")
        reply = read_all(sock)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:300]
    log = (tmp_path / "gw.log").read_text()
    assert "Exception in ASGI application" not in log, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
