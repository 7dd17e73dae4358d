"""A gateway that cannot be reached is one of the SDK's own errors, not httpx's: callers
catch ``ReachError`` for every way a call fails, and learn whether it may have run."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from agent_reach import AsyncReachClient, GatewayUnreachable, ReachClient, ReachError
from tests.support.servers import free_port


def test_nothing_listening_is_gateway_unreachable_and_safe_to_retry():
    base = f"http://127.0.0.1:{free_port()}"
    with ReachClient(base, "rk_x", timeout=2) as reach, \
            pytest.raises(GatewayUnreachable) as refused:
        reach.invoke("echo.all", input={})
    assert isinstance(refused.value, ReachError)
    assert (refused.value.status, refused.value.code, refused.value.retryable) == (
        0, "gateway_unreachable", True)  # it never connected: nothing ran

    async def twin():
        async with AsyncReachClient(base, "rk_x", timeout=2) as reach:
            await reach.invoke("echo.all", input={})

    with pytest.raises(GatewayUnreachable):
        asyncio.run(twin())


def test_a_connection_cut_before_the_answer_is_unreachable_but_not_retryable():
    """The request went out: the call may have run, so it is not called retryable."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def cut() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.close()

    serving = threading.Thread(target=cut, daemon=True)
    serving.start()
    try:
        with ReachClient(f"http://127.0.0.1:{port}", "rk_x", timeout=2) as reach, \
                pytest.raises(GatewayUnreachable) as cut:
            reach.invoke("echo.all", input={})
        assert cut.value.retryable is False
        serving.join(5)
    finally:
        listener.close()
