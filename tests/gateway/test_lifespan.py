"""The ASGI lifespan under a real uvicorn: pools closed at shutdown, WebSockets refused."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import httpx
from django.conf import settings

from tests.gateway.conftest import database_url
from tests.support.servers import ROOT, free_port, platform_env, wait_until_serving

UNCLOSED = "Unclosed client session"  # aiohttp's warning for a session never closed


def serve_until_stopped(tmp_path, key: str, lifespan: str) -> tuple[int, str, bytes]:
    """A second platform process on the gateway fixture's database: calls two agents (two
    upstream sessions, one of them a stream), tries a WebSocket upgrade, then gets SIGTERM.
    Returns its exit code, its log and the raw answer to the upgrade."""
    env = platform_env(tmp_path, DATABASE_URL=database_url(),
                       REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS))
    if settings.REDIS_URL:
        env |= {"REDIS_URL": settings.REDIS_URL,
                "REACH_REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX}
    port = free_port()
    log = tmp_path / f"lifespan-{lifespan}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-X", "dev", "-m", "uvicorn", "reach_platform.asgi:application",
             "--host", "127.0.0.1", "--port", str(port), "--lifespan", lifespan,
             "--log-level", "info", "--no-access-log"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_serving(base, proc)
        headers = {"Authorization": f"Bearer {key}"}
        echo = httpx.post(f"{base}/v1/invoke", headers=headers, timeout=10,
                          json={"capability": "echo.all", "input": {"x": 1}})
        assert echo.status_code == 200, echo.text
        stream = httpx.post(f"{base}/v1/invoke", headers=headers, timeout=10, json={
            "capability": "translate.text", "input": {"text": "hello", "dest_lang": "zh"}})
        assert stream.status_code == 200, stream.text
        upgrade = websocket_upgrade(port)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    return code, log.read_text(), upgrade


def websocket_upgrade(port: int) -> bytes:
    request = (b"GET /v1/tunnel HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
               b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               b"Sec-WebSocket-Version: 13\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer


def test_stopping_the_server_closes_every_upstream_session(gateway, tmp_path):
    code, log, upgrade = serve_until_stopped(tmp_path, gateway.key, lifespan="on")
    # uvicorn re-raises the SIGTERM it handled once it has shut down gracefully.
    assert code in (0, -signal.SIGTERM), log
    assert "Application shutdown complete" in log, log
    # Both agents were called through one shared session (one per keep-alive setting),
    # and it was closed: aiohttp would warn of an unclosed one under -X dev.
    assert " 1 upstream sessions closed" in log, log
    assert UNCLOSED not in log and "Traceback" not in log, log
    # The WebSocket route is refused cleanly (no agent token), in the one error shape,
    # not a 500.
    assert upgrade.startswith(b"HTTP/1.1 401"), upgrade
    assert b'"code":"unauthorized"' in upgrade, upgrade
