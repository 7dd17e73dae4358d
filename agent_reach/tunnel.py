"""The agent's end of a reverse tunnel: a WebSocket to a gateway's ``/v1/tunnel`` that
brings calls to a service that listens on no public port.

``TunnelClient`` connects with the agent token and instance id, answers each call by
sending it on to ``target`` (the agent's own server on a Unix socket, or a sidecar's
service URL) and streams the answer back in frames, within the credit the gateway grants.
It pings the gateway every 20 s (a silent gateway is dropped after 5 s), and reconnects
after any loss with exponential backoff and jitter (0.2 s doubling to 2 s). The frame
format is in ``gateway/tunnel.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time

import aiohttp
import orjson

logger = logging.getLogger(__name__)

WINDOW = 256 * 1024
MAX_FRAME = 4 * 1024 * 1024
FRAME_DATA = 64 * 1024  # the largest part of a body one frame carries
PING_S = 20.0
PONG_TIMEOUT_S = 5.0
# Capped low: a restarted gateway is found again within a couple of seconds.
BACKOFF_S = (0.2, 2.0)
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "host",
              "content-length"}


class TunnelClient:
    def __init__(self, gateway_url: str, *, token: str, instance_id: int, target: str,
                 unix_socket: str | None = None) -> None:
        base = gateway_url.rstrip("/")
        self.url = ("wss://" + base[8:] if base.startswith("https://")
                    else "ws://" + base.split("://", 1)[-1]) + "/v1/tunnel"
        self.token = token
        self.instance_id = instance_id
        self._target = target.rstrip("/")
        self._unix_socket = unix_socket
        self._stop = asyncio.Event()
        self.connected = threading.Event()
        self.connects = 0

    async def run(self) -> None:
        """Hold the tunnel until ``stop``: connect, serve, reconnect."""
        self._stop = asyncio.Event()
        delay = BACKOFF_S[0]
        connector = aiohttp.UnixConnector(path=self._unix_socket) if self._unix_socket \
            else aiohttp.TCPConnector()
        async with aiohttp.ClientSession(connector=connector) as local:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    await self._hold(local)
                except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                    logger.warning("tunnel: %s", exc)
                except Exception:  # a bug must not end the tunnel for good
                    logger.exception("tunnel: failed; reconnecting")
                self.connected.clear()
                if self._stop.is_set():
                    return
                if time.monotonic() - started > 10:
                    delay = BACKOFF_S[0]  # it held for a while: start over
                await asyncio.sleep(delay * random.uniform(0.75, 1.25))
                delay = min(BACKOFF_S[1], delay * 2)

    def stop(self) -> None:
        self._stop.set()

    async def _hold(self, local: aiohttp.ClientSession) -> None:
        headers = {"Authorization": f"Bearer {self.token}",
                   "X-Reach-Instance": str(self.instance_id)}
        async with aiohttp.ClientSession() as session, session.ws_connect(
                self.url, headers=headers, max_msg_size=MAX_FRAME, autoping=True,
                timeout=aiohttp.ClientWSTimeout(ws_close=5)) as ws:
            self.connects += 1
            self.connected.set()
            logger.info("tunnel up (%s)", self.url)
            lock = asyncio.Lock()
            calls: dict[int, _Call] = {}
            alive = {"pong": time.monotonic()}

            async def send(frame: dict) -> None:
                async with lock:
                    await ws.send_str(orjson.dumps(frame).decode())

            pinging = asyncio.ensure_future(self._ping(ws, send, alive))
            stopping = asyncio.ensure_future(self._stop.wait())
            try:
                while True:
                    receiving = asyncio.ensure_future(ws.receive())
                    done, _ = await asyncio.wait({receiving, stopping},
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if stopping in done:
                        receiving.cancel()
                        await ws.close()
                        return
                    message = receiving.result()
                    if message.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSE,
                                        aiohttp.WSMsgType.ERROR):
                        return
                    if message.type != aiohttp.WSMsgType.TEXT:
                        continue
                    frame = orjson.loads(message.data)
                    self._on_frame(frame, calls, send, local, alive)
            finally:
                pinging.cancel()
                stopping.cancel()
                for call in calls.values():
                    call.task.cancel()

    async def _ping(self, ws, send, alive: dict) -> None:
        while True:
            await asyncio.sleep(PING_S)
            asked = time.monotonic()
            await send({"t": "ping"})
            await asyncio.sleep(PONG_TIMEOUT_S)
            if alive["pong"] < asked:
                logger.warning("tunnel: the gateway did not answer a ping; reconnecting")
                await ws.close()
                return

    def _on_frame(self, frame: dict, calls: dict, send, local, alive: dict) -> None:
        kind, sid = frame.get("t"), frame.get("id")
        if kind == "ping":
            asyncio.ensure_future(send({"t": "pong"}))  # noqa: RUF006
        elif kind == "pong":
            alive["pong"] = time.monotonic()
        elif kind == "req":
            call = _Call(sid)
            calls[sid] = call
            call.task = asyncio.ensure_future(self._answer(frame, call, send, local))
            call.task.add_done_callback(lambda _: calls.pop(sid, None))
        elif kind == "credit" and sid in calls:
            calls[sid].grant(int(frame.get("bytes") or 0))
        elif kind == "cancel" and sid in calls:
            calls[sid].task.cancel()

    async def _answer(self, frame: dict, call: _Call, send, local) -> None:
        sid = frame["id"]
        headers = {k: v for k, v in (frame.get("headers") or {}).items()
                   if k.lower() not in HOP_BY_HOP}
        try:
            async with local.request(frame.get("method", "POST"),
                                     self._target + frame.get("path", "/"),
                                     data=str(frame.get("body", "")).encode(),
                                     headers=headers, allow_redirects=False) as response:
                await send({"t": "head", "id": sid, "status": response.status,
                            "headers": {str(k): v for k, v in response.headers.items()
                                        if k.lower() not in HOP_BY_HOP}})
                async for chunk in response.content.iter_any():
                    for start in range(0, len(chunk), FRAME_DATA):
                        part = chunk[start:start + FRAME_DATA]
                        await call.spend(len(part))
                        await send({"t": "data", "id": sid,
                                    "data": part.decode("utf-8", "replace")})
            await send({"t": "end", "id": sid})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.warning("tunnel: answering a call failed (%s: %s)", type(exc).__name__, exc)
            with contextlib.suppress(Exception):
                await send({"t": "error", "id": sid, "message": str(exc)[:200]})


class _Call:
    """One call the tunnel answers: its credit for body bytes."""

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.credit = WINDOW
        self._more = asyncio.Event()
        self.task: asyncio.Future | None = None

    def grant(self, size: int) -> None:
        self.credit += size
        self._more.set()

    async def spend(self, size: int) -> None:
        while self.credit < size and self.credit < WINDOW:
            self._more.clear()
            await self._more.wait()
        self.credit -= size
