"""The shared test helpers of ``tests.support`` do what their docstrings promise."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest
import redis
from django.conf import settings

from tests.support.clock import FakeClock
from tests.support.forwarder import Forwarder
from tests.support.metrics import metric_value
from tests.support.waiting import WaitTimeout, wait_for


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address
    finally:
        server.shutdown()
        server.server_close()


def _roundtrip(port: int, payload: bytes = b"ping") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(payload)
        return sock.recv(65536)


def _closed(sock: socket.socket) -> bool:
    """True when the peer has closed ``sock`` (EOF or reset), within its timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _refused(port: int) -> bool:
    """True when a new connection to ``port`` is turned away: the reset may even arrive
    before ``connect`` returns."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            return _closed(sock)
    except ConnectionError:
        return True


def test_a_forwarder_relays_then_cuts_then_restores(echo_server) -> None:
    with Forwarder(*echo_server) as fwd:
        assert _roundtrip(fwd.port) == b"ping"
        held = socket.create_connection(("127.0.0.1", fwd.port), timeout=5)
        try:
            held.sendall(b"x")
            assert held.recv(1) == b"x"
            assert fwd.accepted == 2
            fwd.cut()
            assert _closed(held)  # open connections end...
        finally:
            held.close()
        assert _refused(fwd.port)  # ...and new ones are turned away at once
        assert fwd.accepted == 2
        fwd.restore()
        assert _roundtrip(fwd.port, b"back") == b"back"
        with fwd.outage():
            assert _refused(fwd.port)
        assert _roundtrip(fwd.port) == b"ping"


def test_a_forwarder_urls_keep_user_and_path() -> None:
    with Forwarder.for_url("postgres://postgres@db.example:5433/reach") as fwd:
        assert fwd.target == ("db.example", 5433)
        assert fwd.url("postgres://postgres@db.example:5433/reach") == (
            f"postgres://postgres@127.0.0.1:{fwd.port}/reach")
    with Forwarder.for_url("redis://localhost/0") as fwd:
        assert fwd.target == ("localhost", 6379)
        assert fwd.url("redis://localhost/0") == f"redis://127.0.0.1:{fwd.port}/0"


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (.ci/run sets REDIS_URL)")
def test_a_cut_forwarder_takes_redis_away_from_its_clients_only() -> None:
    url = settings.REDIS_URL
    with Forwarder.for_url(url) as fwd, redis.Redis.from_url(
            fwd.url(url), socket_timeout=5, socket_connect_timeout=5) as via, \
            redis.Redis.from_url(url) as direct:
        assert via.ping()
        with fwd.outage(), pytest.raises(redis.ConnectionError):
            via.ping()
        assert direct.ping()  # the shared server never noticed
        assert via.ping()  # reconnects once restored


def test_wait_for_returns_the_first_truthy_value_or_raises_clearly() -> None:
    values = iter([0, None, [], "done"])
    assert wait_for(lambda: next(values), timeout=5, interval=0) == "done"
    with pytest.raises(WaitTimeout, match=r"timed out after 0.05s waiting for nothing .*0"):
        wait_for(lambda: 0, timeout=0.05, interval=0.01, message="nothing")


def test_the_fake_clock_moves_only_forward_and_only_when_told() -> None:
    clock = FakeClock()
    assert clock() == clock() == 1000.0
    assert clock.advance(2.5) == clock() == 1002.5
    with pytest.raises(ValueError, match="back"):
        clock.advance(-1)


def test_metric_value_matches_name_and_exact_labels() -> None:
    page = (
        "# HELP reach_calls_total Calls.\n# TYPE reach_calls_total counter\n"
        'reach_calls_total{endpoint="invoke",outcome="success"} 3.0\n'
        'reach_calls_total{endpoint="chat",outcome="success"} 1.0\n'
        "# TYPE reach_retries_total counter\nreach_retries_total 2.0\n"
    )
    assert metric_value(page, "reach_calls_total", {"endpoint": "invoke",
                                                    "outcome": "success"}) == 3.0
    assert metric_value(page, "reach_calls_total", {"endpoint": "invoke"}) is None
    assert metric_value(page, "reach_retries_total") == 2.0
    assert metric_value(page, "reach_missing_total") is None
