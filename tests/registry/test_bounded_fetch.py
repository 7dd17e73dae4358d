"""Probes and Agent Card fetches against real loopback HTTP servers: bounded reads, one
deadline, no redirects, and connections pinned to the address that was checked."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reach_core.endpoints import EndpointPolicy, EndpointRefused
from reach_platform.outbound import FetchFailed, bounded_get
from registry.cards import MAX_CARD_BYTES, fetch_agent_card
from registry.probe import PROBE_MAX_BYTES, probe_one
from registry.spec import DescriptorError
from tests import factories

FIFTY_MIB = 50 * 1024 * 1024
CHUNK = b"x" * 65536
POLICY = EndpointPolicy.from_setting(["127.0.0.0/8", "agent.test"], own_ports=[8000])


class Agent:
    """A loopback HTTP server; ``routes`` maps a path to a handler(request)."""

    def __init__(self) -> None:
        self.hits: list[tuple[str, str]] = []  # (path, Host header)
        self.sent = 0  # body bytes the streaming route managed to write
        self.finished = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                outer.hits.append((self.path, self.headers.get("Host", "")))
                getattr(outer, "route_" + self.path.strip("/").replace("/", "_").replace(
                    "-", "_").replace(".", "_") or "root", outer.route_missing)(self)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _answer(h, status: int, body: bytes, **headers) -> None:
        h.send_response(status)
        h.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            h.send_header(k.replace("_", "-"), v)
        h.end_headers()
        h.wfile.write(body)

    def route_missing(self, h):
        self._answer(h, 404, b"")

    def route_healthz(self, h):
        self._answer(h, 200, b'{"ok": true}')

    def route_huge(self, h):
        """50 MiB of 200 OK, written as fast as the client takes it."""
        h.send_response(200)
        h.send_header("Content-Length", str(FIFTY_MIB))
        h.end_headers()
        try:
            while self.sent < FIFTY_MIB:
                h.wfile.write(CHUNK)
                self.sent += len(CHUNK)
        except OSError:
            pass  # the client hung up, as it should
        finally:
            self.finished.set()

    def route_drip(self, h):
        """Never finishes: one byte every 0.2 s, always under any per-read timeout."""
        h.send_response(200)
        h.send_header("Content-Length", "100000")
        h.end_headers()
        try:
            for _ in range(100000):
                h.wfile.write(b"x")
                h.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def route_moved(self, h):
        self._answer(h, 302, b"", Location=f"{self.base}/healthz")

    def route_card_json(self, h):
        self._answer(h, 200, b'{"name": "x"}', Content_Type="application/json")

    def route_big_card_json(self, h):
        self._answer(h, 200, b'{"pad": "' + b"y" * MAX_CARD_BYTES + b'"}')


@pytest.fixture
def upstream():
    server = Agent()
    yield server
    server.close()


def get(url: str, **kw):
    kw = {"max_bytes": PROBE_MAX_BYTES, "deadline_s": 2.0, "connect_timeout_s": 1.0, **kw}
    return bounded_get(url, POLICY, **kw)


# ---- bounded_get -----------------------------------------------------------------------


def test_a_50_mib_answer_is_read_only_up_to_the_cap(upstream):
    started = time.monotonic()
    response = get(f"{upstream.base}/huge")
    assert response.status == 200 and not response.complete
    assert len(response.body) == PROBE_MAX_BYTES
    # What came off the socket: the cap plus at most one read's worth, not 50 MiB.
    assert response.received < PROBE_MAX_BYTES + 128 * 1024
    assert upstream.finished.wait(10)
    # The server could only push what the kernel buffers absorbed before the hang-up.
    assert upstream.sent < FIFTY_MIB // 4
    assert time.monotonic() - started < 5


def test_a_small_answer_is_complete(upstream):
    response = get(f"{upstream.base}/healthz")
    assert (response.status, response.body, response.complete) == (200, b'{"ok": true}', True)


def test_redirects_are_not_followed(upstream):
    response = get(f"{upstream.base}/moved")
    assert response.status == 302
    assert [path for path, _ in upstream.hits] == ["/moved"]


def test_the_deadline_covers_the_whole_call_not_each_read(upstream):
    started = time.monotonic()
    with pytest.raises(FetchFailed, match=r"within 0\.6s"):
        get(f"{upstream.base}/drip", deadline_s=0.6, max_bytes=1_000_000)
    assert time.monotonic() - started < 2


def test_the_connection_goes_to_the_checked_address_with_the_original_host(upstream):
    calls = []

    def resolver(host, port):
        calls.append((host, port))
        return ["127.0.0.1"]

    response = get(f"http://agent.test:{upstream.port}/healthz", resolver=resolver)
    assert response.status == 200
    assert calls == [("agent.test", upstream.port)]  # resolved once, by us
    assert upstream.hits == [("/healthz", f"agent.test:{upstream.port}")]


@pytest.mark.parametrize("answer", [["203.0.113.9"], ["127.0.0.1", "10.1.2.3"],
                                    ["169.254.169.254"]])
def test_an_allowed_name_resolving_outside_the_allowed_ranges_is_refused(upstream, answer):
    with pytest.raises(EndpointRefused, match=r"agent\.test resolved to"):
        get(f"http://agent.test:{upstream.port}/healthz", resolver=lambda h, p: answer)
    assert upstream.hits == []


# ---- probes ----------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("probe_path", "healthy"),
    [("/healthz", True), ("/huge", False), ("/moved", False), ("/missing", False)],
)
def test_probe_verdicts(world, upstream, probe_path, healthy):
    world.agent_a.probe_path = probe_path
    world.agent_a.save()
    instance = factories.instance(agent=world.agent_a, endpoint=f"{upstream.base}/")
    assert probe_one(instance) is healthy
    if probe_path == "/moved":
        assert [path for path, _ in upstream.hits] == ["/moved"]


@pytest.mark.django_db
def test_a_probe_of_a_name_resolving_to_a_refused_address_is_refused(world, upstream,
                                                                     settings):
    settings.UPSTREAM_ALLOW = ["127.0.0.0/8", "agent.test"]
    world.agent_a.probe_path = "/healthz"
    world.agent_a.save()
    instance = factories.instance(agent=world.agent_a,
                                  endpoint=f"http://agent.test:{upstream.port}/")
    assert probe_one(instance, resolver=lambda h, p: ["127.0.0.1"]) is True
    assert probe_one(instance, resolver=lambda h, p: ["198.51.100.4"]) is False
    assert len(upstream.hits) == 1


# ---- Agent Cards -----------------------------------------------------------------------


def test_a_card_is_fetched(upstream):
    assert fetch_agent_card(f"{upstream.base}/card.json", POLICY) == {"name": "x"}


@pytest.mark.parametrize(
    ("path", "match"),
    [("/big-card.json", "larger than"), ("/moved", "redirects are not followed"),
     ("/missing", "HTTP 404")],
)
def test_card_fetch_refusals(upstream, path, match):
    with pytest.raises(DescriptorError) as info:
        fetch_agent_card(f"{upstream.base}{path}", POLICY)
    assert match in info.value.problems["card_url"][0]


def test_a_card_from_a_name_resolving_to_a_refused_address_is_refused(upstream):
    url = f"http://agent.test:{upstream.port}/card.json"
    assert fetch_agent_card(url, POLICY, resolver=lambda h, p: ["127.0.0.1"]) == {"name": "x"}
    with pytest.raises(DescriptorError) as info:
        fetch_agent_card(url, POLICY, resolver=lambda h, p: ["203.0.113.1"])
    assert "in no allowed CIDR" in info.value.problems["card_url"][0]
