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


class Canned:
    """A server on loopback answering every request with the same bytes, then closing."""

    def __init__(self, reply: bytes) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self.reply)

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("reply", [
    # The head, then the body cut short (a gateway killed mid-reply).
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"a",
    # A 200 that is no gateway's answer (a proxy's page, a wrong base URL).
    b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 6\r\n\r\n<html>",
    # JSON, but not an object: every answer of the gateway's is one (a break test got
    # the [] back as the call's result).
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]",
    # A proxy's own error page: not a refusal of the gateway's.
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nContent-Length: 6\r\n\r\n<html>",
])
def test_an_answer_that_is_not_the_gateways_is_gateway_unreachable_not_retryable(reply):
    server = Canned(reply)
    try:
        with ReachClient(server.base, "rk_x", timeout=2) as reach:
            with pytest.raises(GatewayUnreachable) as broken:
                reach.invoke("echo.all", input={})
            assert broken.value.retryable is False
            with pytest.raises(GatewayUnreachable):  # a stream that is no event stream
                list(reach.stream("echo.all", input={}))

        async def twin():
            async with AsyncReachClient(server.base, "rk_x", timeout=2) as reach:
                await reach.invoke("echo.all", input={})

        with pytest.raises(GatewayUnreachable):
            asyncio.run(twin())
    finally:
        server.close()


def test_a_task_answer_without_a_state_is_not_the_gateways():
    """``wait`` read ``task["state"]`` and failed with a bare ``KeyError`` on a JSON
    object that was no task (a proxy's ``{}``)."""
    server = Canned(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 2\r\n\r\n{}")
    try:
        with ReachClient(server.base, "rk_x", timeout=2) as reach:
            for read in (lambda: reach.task("t1"), lambda: reach.wait("t1", timeout=1)):
                with pytest.raises(GatewayUnreachable) as broken:
                    read()
                assert broken.value.retryable is False

        async def twin():
            async with AsyncReachClient(server.base, "rk_x", timeout=2) as reach:
                await reach.wait("t1", timeout=1)

        with pytest.raises(GatewayUnreachable):
            asyncio.run(twin())
    finally:
        server.close()
