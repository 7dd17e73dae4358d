"""A stream this gateway cuts because it is stopping (past its drain time) is the
platform's doing: the caller is told so, and the call is metered so, not as a caller
that went away (which would hide the gateway's own restarts from its success rate)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid

import httpx
import orjson
import pytest
import redis
from django.conf import settings

from tests.gateway.conftest import gateway_env
from tests.support.servers import ROOT, free_port, uvicorn_args, wait_until_serving
from tests.support.waiting import wait_for


@pytest.mark.skipif(not settings.REDIS_URL, reason="reads the usage stream in Redis")
def test_a_stream_cut_by_its_gateway_stopping_is_told_and_metered_so(gateway, tmp_path):
    # Its own key prefix: its usage stream holds this test's events only.
    prefix = f"reach-test-stop-{uuid.uuid4().hex[:8]}:"
    env = gateway_env(tmp_path) | {"REACH_REDIS_KEY_PREFIX": prefix}
    port = free_port()
    with (tmp_path / "stopping.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, *uvicorn_args(port),
                                 "--timeout-graceful-shutdown", "1"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base, proc)
        headers = {"Authorization": f"Bearer {gateway.key}"}
        slow_calls = len([s for s in gateway.seen() if s.get("path") == "/slow"])
        answered: dict[str, httpx.Response] = {}

        def slow(name: str, **extra: str) -> None:
            answered[name] = httpx.post(
                f"{base}/v1/invoke", json={"capability": "slow.op", "input": {}},
                headers=headers | {"X-Request-ID": f"stop-{name}", **extra}, timeout=30)

        # Calls that are not streamed, in flight too (their agent takes 2 s): one with an
        # Idempotency-Key (its cleanup takes a Redis round trip after the cut: it must
        # still be metered before the gateway stops shipping usage).
        pending = [threading.Thread(target=slow, args=("plain",)),
                   threading.Thread(target=slow, args=("keyed",),
                                    kwargs={"Idempotency-Key": f"stop-{uuid.uuid4().hex}"})]
        for thread in pending:
            thread.start()
        wait_for(lambda: len([s for s in gateway.seen() if s.get("path") == "/slow"])
                 >= slow_calls + 2, timeout=15, message="the slow calls to reach their agent")
        words = " ".join(f"w{i}" for i in range(400))  # 0.05 s a word: 20 s
        with httpx.stream("POST", f"{base}/v1/invoke", timeout=30, json={
                "capability": "chat.scripted", "stream": True,
                "input": {"text": f"slowly {words}"}}, headers=headers) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            chunks = response.iter_bytes()
            streamed = next(chunks)
            proc.send_signal(signal.SIGTERM)
            for chunk in chunks:  # a complete reply: its last event says why it ended
                streamed += chunk
        proc.wait(timeout=30)  # (uvicorn re-raises the signal once it has stopped)
        for thread in pending:
            thread.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"event: error" in streamed and b'"service_unavailable"' in streamed
    # The calls that were not streamed get the one error shape, not uvicorn's bare 500.
    for reply in answered.values():
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "service_unavailable"
        assert reply.headers["x-should-retry"] == "true"
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        shipped = [event for _, entry in client.xrange(f"{prefix}usage")
                   for event in orjson.loads(entry[b"b"])]
        client.delete(f"{prefix}usage")
    finally:
        client.close()
    # Shipped as the process stopped: the call, metered as the platform's failure.
    for call in (request_id, "stop-plain", "stop-keyed"):
        assert [e["outcome"] for e in shipped if e["request_id"] == call] == [
            "service_unavailable"], call
