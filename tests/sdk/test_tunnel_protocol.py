"""A tunnelled agent that breaks the tunnel's protocol fails its own call (a 502 at once),
never the gateway (no 500) and never the tunnel's other calls."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import aiohttp
import httpx
import orjson

from agent_reach import Agent
from tests.sdk.conftest import needs_services
from tests.support.waiting import wait_for

pytestmark = needs_services

CHUNK = "z" * 60_000


async def _answer(ws, frame: dict) -> None:
    sid, mode = frame["id"], orjson.loads(frame["body"])["mode"]

    async def send(**out) -> None:
        await ws.send_str(orjson.dumps({"id": sid, **out}).decode())

    json_head = {"content-type": "application/json"}
    if mode == "ok":
        await send(t="head", status=200, headers=json_head)
        await send(t="data", data='{"ok": true}')
    elif mode == "status":
        await send(t="head", status="abc", headers=json_head)
        await send(t="data", data="{}")
    elif mode == "headers":
        await send(t="head", status=200, headers=["not", "a", "mapping"])
    elif mode == "no-head":
        await send(t="data", data='{"x": 1}')
    elif mode == "garbage":  # no JSON object: a frame of no call
        await ws.send_str("{not json")
        return
    elif mode == "flood":  # past its 256 KiB of credit, never waiting for more
        await send(t="head", status=200, headers=json_head)
        for _ in range(10):
            await send(t="data", data=CHUNK)
    await send(t="end")


def _hostile_tunnel(base: str, token: str, instance: int, ready: threading.Event,
                    closed: list, oversize: threading.Event,
                    done: threading.Event | None = None) -> None:
    done = done if done is not None else closed_ready

    async def run() -> None:
        async with aiohttp.ClientSession() as session, session.ws_connect(
                f"{base}/v1/tunnel", max_msg_size=0, headers={
                    "Authorization": f"Bearer {token}", "X-Reach-Instance": str(instance)}
        ) as ws:
            ready.set()
            sent, answering = False, set()
            while True:
                if oversize.is_set() and not sent:  # past the 4 MiB frame limit
                    await ws.send_str("x" * (5 * 1024 * 1024))
                    sent = True
                try:
                    message = await ws.receive(timeout=0.5)
                except TimeoutError:
                    continue
                if message.type != aiohttp.WSMsgType.TEXT:
                    closed.append(ws.close_code)
                    done.set()
                    return
                frame = orjson.loads(message.data)
                if frame.get("t") == "ping":
                    await ws.send_str('{"t": "pong"}')
                elif frame.get("t") == "req":
                    answering.add(asyncio.ensure_future(_answer(ws, frame)))
    try:
        asyncio.run(run())
    finally:
        done.set()


closed_ready = threading.Event()


@contextlib.contextmanager
def _hand_written_tunnel(platform, name: str, capability: str, closed: list,
                         oversize: threading.Event, done: threading.Event | None = None):
    """An SDK agent offering ``capability`` whose tunnel is replaced by ``_hostile_tunnel``;
    yields a caller of the capability (its ``mode``) once the tunnel is routable."""
    agent = Agent(name, description="replaced by a hand-written tunnel client")

    @agent.capability(capability)
    def call(input, ctx):
        return {"from": "the SDK"}

    running = agent.start(platform=platform.base, key=platform.manage_key, reach="tunnel",
                          heartbeat_s=1.0)
    ready = threading.Event()
    try:
        assert running.tunnel.connected.wait(10)
        running._loop.call_soon_threadsafe(running.tunnel.stop)  # the SDK's tunnel leaves
        wait_for(lambda: not running.tunnel.connected.is_set(), timeout=10)
        threading.Thread(target=_hostile_tunnel, daemon=True, args=(
            platform.base, running.registration.agent_token,
            running.registration.instance_id, ready, closed, oversize, done)).start()
        assert ready.wait(10)
        headers = {"Authorization": f"Bearer {platform.key}"}

        def invoke(mode: str) -> httpx.Response:
            return httpx.post(f"{platform.base}/v1/invoke", headers=headers, timeout=30,
                              json={"capability": capability, "input": {"mode": mode}})
        wait_for(lambda: invoke("ok").status_code == 200, timeout=15,
                 message="the hand-written tunnel to be routable")
        yield invoke
    finally:
        oversize.set()
        running.stop()


def test_protocol_breaches_fail_their_call_as_a_bad_response(platform):
    oversize, closed = threading.Event(), []
    with _hand_written_tunnel(platform, "sdk-hostile", "hostile.call", closed,
                              oversize) as invoke:
        answers = {mode: invoke(mode) for mode in ("status", "headers", "no-head", "flood")}
        after = invoke("ok")
        oversize.set()
        assert closed_ready.wait(15)

    for mode, answer in answers.items():
        assert answer.status_code == 502, (mode, answer.text)
        error = answer.json()["error"]
        # A breach in the body (after the head was relayed) is the agent's error there.
        assert error["code"] == "upstream_bad_response" or (
            mode == "flood" and "flow-control credit" in error["message"]), (mode, error)
        assert answer.elapsed.total_seconds() < 5, mode  # at once, not at the deadline
    assert after.status_code == 200 and after.json()["output"] == {"ok": True}
    assert closed == [1009]  # a frame over 4 MiB closes the tunnel


def test_a_frame_that_is_no_json_object_fails_the_tunnels_calls_at_once(platform):
    """helper-53: a frame that is not JSON was skipped, its call left waiting; the agent
    does not speak the protocol: the tunnel is closed (1007) and its calls fail as the
    agent's bad response (not retryable), at once."""
    never, done, closed = threading.Event(), threading.Event(), []
    with _hand_written_tunnel(platform, "sdk-garbage", "garbage.call", closed, never,
                              done) as invoke:
        answer = invoke("garbage")
        assert done.wait(15)
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "upstream_bad_response", answer.text
    assert answer.json()["error"]["retryable"] is False
    assert answer.elapsed.total_seconds() < 5  # at once, not at the deadline
    assert closed == [1007]
