"""Usage events survive a gateway killed with SIGKILL (``gateway.usage_spool``).

Spools in a test-owned directory, written by real processes that are then killed: the
kernel's own release of their locks is what tells an orphan from a live process's file.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import signal
import subprocess
import sys
import textwrap
import threading
import uuid

import httpx
import orjson
import pytest
import redis
from django.conf import settings

from gateway.usage import UsageQueue
from gateway.usage_spool import UsageSpool
from tests.gateway.conftest import another_gateway, gateway_env
from tests.support.clock import FakeClock
from tests.support.forwarder import Forwarder
from tests.support.loopback import LoopbackService
from tests.support.servers import ROOT, free_port, uvicorn_args, wait_until_serving
from tests.support.waiting import WaitTimeout, wait_for

needs_redis = pytest.mark.skipif(not settings.REDIS_URL,
                                 reason="needs the machine's Redis (.ci/run sets REDIS_URL)")

WRITER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from gateway.usage import UsageQueue
    from gateway.usage_spool import UsageSpool

    directory, events, run, shipped, then = sys.argv[1:]
    queue = UsageQueue(spool=UsageSpool(Path(directory)))
    for i in range(int(events)):
        queue.emit({"event_id": f"{run}-{i}", "n": i})
    drained = queue.drain(int(shipped) or 1)  # recovers any orphans, then takes some
    if int(shipped):
        queue.shipped(len(drained))
    print("READY", len(queue) + len(drained), flush=True)
    if then == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()  # alive until its stdin closes
""")


def writer(directory, events: int, run: str, *, shipped: int = 0, die: bool = True):
    """A process that queues ``events`` usage events (recovering orphans first), ships
    ``shipped`` of them, and is killed with SIGKILL (or lives until its stdin closes)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(events), run, str(shipped),
         "die" if die else "live"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready, queued = proc.stdout.readline().split()
    assert ready == "READY"
    proc.queued = int(queued)
    if die:
        assert proc.wait(timeout=30) == -signal.SIGKILL
        proc.stdin.close()
        proc.stdout.close()
    return proc


def recovered(directory) -> list[str]:
    out: list[dict] = []
    spool = UsageSpool(directory)
    spool.recover(out.append)
    spool.close()
    return sorted(event["event_id"] for event in out)


def ids(run: str, count: int) -> list[str]:
    return sorted(f"{run}-{i}" for i in range(count))


def test_a_killed_process_events_are_recovered_once(tmp_path):
    run = uuid.uuid4().hex
    writer(tmp_path, 5, run)
    assert recovered(tmp_path) == ids(run, 5)
    assert recovered(tmp_path) == []  # the orphan is gone


def test_files_wholly_shipped_are_deleted_and_only_the_rest_recovered(tmp_path):
    run = uuid.uuid4().hex
    writer(tmp_path, 5, run, shipped=5)  # all in one file, all shipped: deleted...
    assert recovered(tmp_path) == []
    queue = UsageQueue(spool=UsageSpool(tmp_path))
    for i in range(3):
        queue.emit({"event_id": f"a-{i}"})
    first = queue.drain(10)  # rolls over: the next events go to a new file
    for i in range(2):
        queue.emit({"event_id": f"b-{i}"})
    assert len(list(tmp_path.glob("usage-*.jsonl"))) == 2
    queue.shipped(len(first))
    assert len(list(tmp_path.glob("usage-*.jsonl"))) == 1
    queue.close()  # two not shipped: their file stays for the next process
    assert recovered(tmp_path) == ["b-0", "b-1"]


def test_a_live_process_files_are_never_taken(tmp_path):
    run = uuid.uuid4().hex
    live = writer(tmp_path, 3, run, die=False)
    try:
        assert recovered(tmp_path) == []
    finally:
        live.stdin.close()
        live.wait(timeout=30)
        live.stdout.close()
    assert recovered(tmp_path) == ids(run, 3)  # it left without shipping: an orphan now


def test_recovered_events_are_spooled_anew_until_shipped(tmp_path):
    """A successor killed after recovering a predecessor's events, before shipping them,
    hands them on in turn."""
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    writer(tmp_path, 4, first)
    assert writer(tmp_path, 2, second).queued == 6  # recovered the first's four
    assert recovered(tmp_path) == sorted(ids(first, 4) + ids(second, 2))


def test_recovery_looks_at_most_every_30_s(tmp_path):
    clock = FakeClock()
    queue = UsageQueue(spool=UsageSpool(tmp_path, clock=clock))
    assert queue.drain() == []
    run = uuid.uuid4().hex
    writer(tmp_path, 4, run)
    assert queue.drain() == []  # it looked less than 30 s ago
    clock.advance(30)
    assert sorted(e["event_id"] for e in queue.drain()) == ids(run, 4)
    queue.close()


def test_a_torn_last_line_is_skipped(tmp_path):
    (tmp_path / "usage-1-x.jsonl").write_bytes(b'{"event_id":"whole"}\n{"event_id":"to')
    assert recovered(tmp_path) == ["whole"]


@contextlib.contextmanager
def doomed_gateway(tmp_path, *, redis_url: str | None = None):
    """A gateway process the test kills with SIGKILL: yields its base URL and the
    process, serving; reaped however the test ends."""
    port = free_port()
    process = subprocess.Popen([sys.executable, *uvicorn_args(port)], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=gateway_env(tmp_path, redis_url=redis_url))
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_serving(base, process)
        yield base, process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


@needs_redis
def test_calls_answered_before_a_gateway_is_killed_are_metered_by_its_successor(
        gateway, tmp_path):
    """Break test (helper-34): SIGKILL of a gateway worker mid-burst lost the usage events
    of 0 to 13 calls answered 200 per kill. Here none can have been shipped: the doomed
    gateway's Redis is cut first, so its events wait in memory (and the spool)."""
    run = uuid.uuid4().hex
    wanted = {f"spool-{run}-{i}" for i in range(20)}
    body = {"capability": "echo.all", "input": {}}
    with Forwarder.for_url(settings.REDIS_URL) as forwarder, doomed_gateway(
            tmp_path, redis_url=forwarder.url(settings.REDIS_URL)) as (base, doomed), \
            httpx.Client(base_url=base, timeout=30, headers={
                "Authorization": f"Bearer {gateway.key}"}) as client, forwarder.outage():
        for request_id in sorted(wanted):
            response = client.post("/v1/invoke", json=body,
                                   headers={"X-Request-ID": request_id})
            assert response.status_code == 200, response.text
        kill(doomed)
    with another_gateway(tmp_path, "successor"):  # the same data directory
        assert set(_shipped(wanted)) == wanted


@needs_redis
def test_calls_at_their_agents_when_a_gateway_is_killed_are_metered_as_lost(
        gateway, tmp_path):
    """Break test (helper-34): the calls a SIGKILL cut short, which their agent ran, had
    no usage event at all. Now each has one, ``worker_lost``, naming its agent."""
    run = uuid.uuid4().hex
    wanted = {f"lost-{run}-{i}" for i in range(8)}
    with doomed_gateway(tmp_path) as (base, doomed):

        def send(request_id: str) -> None:
            with contextlib.suppress(httpx.TransportError), httpx.Client(
                    base_url=base, timeout=30,
                    headers={"Authorization": f"Bearer {gateway.key}"}) as client:
                client.post("/v1/invoke", headers={"X-Request-ID": request_id},
                            json={"capability": "slow.op", "input": {"run": run}})

        with concurrent.futures.ThreadPoolExecutor(len(wanted)) as pool:
            sent = [pool.submit(send, request_id) for request_id in wanted]
            wait_for(lambda: sum(1 for e in gateway.seen() if run in repr(e.get("body")))
                     >= len(wanted), timeout=20, interval=0.05,
                     message="every call at the agent")
            kill(doomed)
            for future in sent:
                future.result()
    with another_gateway(tmp_path, "successor"):
        events = _shipped(wanted)
    assert set(events) == wanted
    assert {e["outcome"] for e in events.values()} == {"worker_lost"}
    assert all(e["capability"] is not None and e["agent"] is not None
               for e in events.values())


@contextlib.contextmanager
def _budgeted_behind_forwarder(gateway, tmp_path):
    """A doomed gateway reaching Redis through a test-owned forwarder, its tenant under a
    monthly budget (so every call reserves and settles in Redis): yields the forwarder,
    the process, a client with the tenant's key and a one-thread pool to call from."""
    from tenants.models import Quota

    Quota.objects.create(tenant=gateway.tenant, monthly_requests=1_000_000)
    with Forwarder.for_url(settings.REDIS_URL) as forwarder, doomed_gateway(
            tmp_path, redis_url=forwarder.url(settings.REDIS_URL)) as (base, doomed), \
            httpx.Client(base_url=base, timeout=30, headers={
                "Authorization": f"Bearer {gateway.key}"}) as client, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        yield forwarder, doomed, client, pool


@needs_redis
def test_a_call_answered_while_its_settlement_waits_is_metered_as_answered(
        gateway, tmp_path):
    """helper-54: of 100 calls answered 200 before a gateway worker was killed, 30 to 70
    were metered worker_lost (at no cost): the final usage event was written after the
    reply, and after the budget settlement's round trip to Redis. Here Redis hangs once
    the agent has the call: the caller gets its 200, the gateway is killed at once, and
    the call is metered success (its event is on disk before its reply goes out)."""
    run = uuid.uuid4().hex
    request_id = f"settle-{run}"
    with _budgeted_behind_forwarder(gateway, tmp_path) as (forwarder, doomed, client, pool):
        answer = pool.submit(client.post, "/v1/invoke", headers={"X-Request-ID": request_id},
                             json={"capability": "slow.op", "input": {"run": run}})
        wait_for(lambda: any(run in repr(e.get("body")) for e in gateway.seen()),
                 timeout=20, interval=0.05, message="the call at its agent")
        with forwarder.freeze():  # reserved already; the settlement will hang
            assert answer.result(timeout=30).status_code == 200
            kill(doomed)
    with another_gateway(tmp_path, "successor"):
        events = _shipped({request_id})
    assert events[request_id]["outcome"] == "success", events


@needs_redis
def test_a_call_killed_while_its_budget_is_reserved_is_metered_as_lost(gateway, tmp_path):
    """helper-54: a gateway killed while Redis was taking a call's reservation left a
    reservation (lapsing as one request used) and no usage event: the budget counter
    ran ahead of the usage report. A call's open line is on disk before its
    reservation is asked for, so it is metered worker_lost."""
    request_id = f"reserving-{uuid.uuid4().hex}"
    with _budgeted_behind_forwarder(gateway, tmp_path) as (forwarder, doomed, client, pool):
        with forwarder.freeze():  # the reservation hangs
            sent = pool.submit(client.post, "/v1/invoke", headers={"X-Request-ID": request_id},
                               json={"capability": "echo.all", "input": {}})
            spool = tmp_path / "usage-spool"
            wait_for(lambda: any(request_id in p.read_text() for p in spool.glob("*.jsonl")),
                     timeout=20, interval=0.05, message="the call's open line")
            kill(doomed)
        with contextlib.suppress(httpx.TransportError):
            sent.result(timeout=30)
    with another_gateway(tmp_path, "successor"):
        events = _shipped({request_id})
    assert events[request_id]["outcome"] == "worker_lost", events


def _shipped(wanted: set[str]) -> dict[str, dict]:
    """The usage events of those of ``wanted`` request ids that reached the Redis stream."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    stream = settings.REDIS_KEY_PREFIX + "usage"
    found: dict[str, dict] = {}

    def all_there() -> bool:
        for _, fields in client.xrange(stream):
            found.update((e["request_id"], e) for e in orjson.loads(fields[b"b"])
                         if e.get("request_id") in wanted)
        return set(found) == wanted

    try:
        wait_for(all_there, timeout=30, interval=0.2, message="the killed gateway's usage")
    except WaitTimeout:
        pass  # the assertion says which are missing
    finally:
        client.close()
    return found


def test_an_unusable_spool_directory_leaves_the_gateway_running_and_says_so(
        tmp_path, settings, caplog):
    from reach_platform.gateway_factory import usage_spool

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    settings.USAGE_SPOOL_DIR = blocker / "usage-spool"
    assert usage_spool() is None
    assert "REACH_USAGE_SPOOL_DIR" in caplog.text
    settings.USAGE_SPOOL_DIR = tmp_path / "usage-spool"
    spool = usage_spool()
    assert spool is not None
    spool.close()


CALLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from gateway.usage import UsageQueue
    from gateway.usage_spool import UsageSpool

    directory, run = sys.argv[1:]
    queue = UsageQueue(spool=UsageSpool(Path(directory)))
    calls = [queue.opened({"event_id": f"{run}-{i}", "outcome": "worker_lost"})
             for i in range(3)]
    queue.emit({"event_id": f"{run}-0", "outcome": "success"}, calls[0])
    queue.shipped(len(queue.drain()))  # shipped, its file kept: calls 1 and 2 are open
    queue.emit({"event_id": f"{run}-1", "outcome": "success"}, calls[1])
    print("READY", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_call_cut_short_by_the_kill_is_metered_once_as_lost(tmp_path):
    """Three calls at agents; the first ended and was shipped, the second ended and was
    not shipped, the third was running when the process was killed: recovery gives the
    second's event and the third's open one, and nothing of the first."""
    run = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-c", CALLER, str(tmp_path), run], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stdout.close()
    events: list[dict] = []
    spool = UsageSpool(tmp_path)
    spool.recover(events.append)
    spool.close()
    # The first is shipped, but its file also holds the others' open lines, so it stays
    # and comes back too: stored once all the same (events are unique by event_id).
    assert {e["event_id"]: e["outcome"] for e in events} == {
        f"{run}-0": "success", f"{run}-1": "success", f"{run}-2": "worker_lost"}
    assert all("open" not in e for e in events)
    assert list(tmp_path.glob("usage-*.jsonl")) == []


def test_a_file_goes_once_its_events_are_shipped_and_its_calls_ended(tmp_path):
    queue = UsageQueue(spool=UsageSpool(tmp_path))
    call = queue.opened({"event_id": "c", "outcome": "worker_lost"})
    queue.emit({"event_id": "a"})
    queue.shipped(len(queue.drain()))  # "a" shipped; the call still open: the file stays
    queue.emit({"event_id": "b"})  # in a new file
    assert len(list(tmp_path.glob("usage-*.jsonl"))) == 2
    queue.emit({"event_id": "c", "outcome": "success"}, call)  # the call ends
    assert len(list(tmp_path.glob("usage-*.jsonl"))) == 1
    queue.close()
    assert recovered(tmp_path) == ["b", "c"]


class HeldService(LoopbackService):
    """A tool's external service that holds every request until ``release``."""

    def __init__(self) -> None:
        self.arrived = threading.Semaphore(0)
        self.release = threading.Event()
        super().__init__(self._answer)

    def _answer(self, request, body: bytes) -> tuple[int, str, bytes]:
        self.arrived.release()
        self.release.wait(30)
        return 200, "application/json", b'{"ok": true}'

    def close(self) -> None:
        self.release.set()
        super().close()


@needs_redis
def test_tool_calls_at_their_service_when_a_gateway_is_killed_are_metered_as_lost(
        gateway, tmp_path):
    """The last note's gap: a gateway killed during tool calls left them without a usage
    event (the audit record). Now each has one, ``worker_lost``, naming its tool."""
    from tools.models import Tool
    from tools.services import tool_save

    service = HeldService()
    tool = tool_save(tool=Tool(
        owner_tenant=gateway.tenant, name="held-lookup", description="Looks one item up.",
        input_schema={"type": "object", "properties": {"id": {"type": "string"}}},
        url_template=service.url + "/item/{id}", method="GET", auth_kind="none",
        timeout_ms=30_000))
    run = uuid.uuid4().hex
    wanted = {f"tool-lost-{run}-{i}" for i in range(4)}
    with contextlib.closing(service), doomed_gateway(tmp_path) as (base, doomed):
        auth = {"Authorization": f"Bearer {gateway.key}"}
        wait_for(lambda: any(t["name"] == tool.name for t in httpx.get(
            f"{base}/v1/tools", headers=auth, timeout=5).json().get("tools", [])),
            timeout=15, interval=0.05, message="the gateway to know the tool")

        def send(request_id: str) -> None:
            with contextlib.suppress(httpx.TransportError):
                httpx.post(f"{base}/v1/tools/{tool.name}/call", timeout=30,
                           json={"arguments": {"id": request_id}},
                           headers={**auth, "X-Request-ID": request_id})

        with concurrent.futures.ThreadPoolExecutor(len(wanted)) as pool:
            sent = [pool.submit(send, request_id) for request_id in wanted]
            for _ in wanted:
                assert service.arrived.acquire(timeout=20), "every call at the service"
            kill(doomed)
            for future in sent:
                future.result()
    with another_gateway(tmp_path, "successor"):
        events = _shipped(wanted)
    assert set(events) == wanted
    assert {e["outcome"] for e in events.values()} == {"worker_lost"}
    assert {e["tool"] for e in events.values()} == {tool.pk}
    assert all(e["argument_digest"] for e in events.values())
