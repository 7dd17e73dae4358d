"""The lean HTTP/1.1 client (``gateway.h1``) keeps the guarantees aiohttp gave the
calls: replies framed every legal way are read whole, broken ones fail with the error
that says whether the agent had the request, limits hold, and nothing unsafe is sent.
Each agent here is a raw asyncio server on loopback that answers exactly what the test
scripts, byte for byte."""

from __future__ import annotations

import asyncio
import errno

import aiohttp
import pytest

from gateway.h1 import MAX_HEAD_BYTES, READ_HIGH_WATER, ConnectFailed, H1Session, ResetBeforeSent
from gateway.upstream import translate_error
from reach_core.endpoints import EndpointPolicy

POLICY = EndpointPolicy.from_setting(("127.0.0.1/32",), ())
TIMEOUT = aiohttp.ClientTimeout(total=5, sock_connect=2)


def session(**kwargs) -> H1Session:
    def no_tls():
        raise AssertionError("plain HTTP must not reach aiohttp")
    return H1Session(POLICY, idle_seconds=kwargs.pop("idle_seconds", 30),
                     max_idle_hosts=kwargs.pop("max_idle_hosts", 8), fallback=no_tls)


async def agent(handler):
    """A loopback server running ``handler(reader, writer)`` per connection; returns the
    server, its URL and the list of raw requests it read (head and body)."""
    seen: list[bytes] = []

    async def serve(reader, writer):
        try:
            await handler(reader, writer, seen)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/call", seen


async def read_request(reader, seen) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    body = await reader.readexactly(length)
    seen.append(head + body)
    return body


def run(coro):
    return asyncio.run(coro)


def answering(connections: list, answer):
    """A handler that reads request after request on each connection (each connection's
    writer goes into ``connections``) and lets ``await answer(writer, body, seen)`` reply."""
    async def handler(reader, writer, seen):
        connections.append(writer)
        while True:
            try:
                body = await read_request(reader, seen)
            except asyncio.IncompleteReadError:
                return
            await answer(writer, body, seen)
    return handler


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def test_a_kept_alive_connection_serves_one_call_after_another():
    connections = []

    async def answer(writer, body, seen):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8"
                     b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    handler = answering(connections, answer)

    async def go():
        server, url, seen = await agent(handler)
        client = session()
        replies = []
        for n in range(3):
            response = await client.post(url, data=b'{"n":%d}' % n,
                                         headers={"x-request-id": f"r{n}"}, timeout=TIMEOUT)
            replies.append((response.status, response.content_type,
                            response.content_length, await response.read()))
            response.release()
        kept = client.idle_connections()
        await client.close()
        server.close()
        return replies, seen, kept

    replies, seen, kept = run(go())
    assert replies == [(200, "application/json", 7, b'{"n":%d}' % n) for n in range(3)]
    assert len(connections) == 1 and kept == 1
    assert seen[0].startswith(b"POST /call HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nx-request-id: r0\r\n" in seen[0] and b"\r\nContent-Length: 7\r\n" in seen[0]


@pytest.mark.parametrize("reply, body", [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n",
     b"abcdefg"),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the close", b"until the close"),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"ok"),
    (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
])
def test_every_legal_framing_of_a_reply_is_read_whole(reply, body):
    async def handler(reader, writer, seen):
        await read_request(reader, seen)
        writer.write(reply)
        await writer.drain()

    async def go():
        server, url, _ = await agent(handler)
        client = session()
        response = await client.post(url, data=b"{}", headers={}, timeout=TIMEOUT)
        got = await response.read()
        response.release()
        await client.close()
        server.close()
        return got

    assert run(go()) == body


def failure(handler, *, data=b"{}", timeout=TIMEOUT, read=True):
    async def go():
        server, url, seen = await agent(handler)
        client = session()
        try:
            response = await client.post(url, data=data, headers={}, timeout=timeout)
            if read:
                await response.read()
            return None, seen
        except Exception as exc:
            return exc, seen
        finally:
            await client.close()
            server.close()

    return run(go())


def test_a_reply_cut_short_is_a_payload_error_and_counts_as_delivered():
    async def handler(reader, writer, seen):
        await read_request(reader, seen)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
        await writer.drain()

    exc, _ = failure(handler)
    assert isinstance(exc, aiohttp.ClientPayloadError)
    assert translate_error(exc).delivered is True


def test_a_close_after_the_request_before_any_reply_counts_as_delivered():
    async def handler(reader, writer, seen):
        await read_request(reader, seen)

    exc, seen = failure(handler)
    assert isinstance(exc, aiohttp.ServerDisconnectedError) and len(seen) == 1
    assert translate_error(exc).delivered is True


def test_a_reset_while_the_request_is_still_being_sent_is_not_delivered():
    big = b'{"pad":"' + b"x" * (8 * 1024 * 1024) + b'"}'

    async def handler(reader, writer, seen):
        seen.append(await reader.readuntil(b"\r\n\r\n"))  # the head only, then a reset
        sock = writer.get_extra_info("socket")
        import socket
        import struct
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    exc, seen = failure(handler, data=big)
    assert isinstance(exc, ResetBeforeSent), exc
    assert exc.errno in (errno.ECONNRESET, errno.EPIPE)
    assert len(seen) == 1


def test_no_connection_is_not_delivered_and_a_refused_address_is_never_dialled():
    async def go():
        client = session()
        closed_port = await unused_port()
        results = []
        for url in (f"http://127.0.0.1:{closed_port}/x", "http://10.1.2.3:80/x"):
            try:
                await client.post(url, data=b"{}", headers={}, timeout=TIMEOUT)
            except Exception as exc:
                results.append(exc)
        await client.close()
        return results

    refused, policy = run(go())
    assert isinstance(refused, ConnectFailed) and isinstance(policy, ConnectFailed)
    assert "endpoint policy" in str(policy)
    assert translate_error(refused).delivered is False
    assert translate_error(policy).delivered is False


async def unused_port() -> int:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    return port


def test_the_total_timeout_covers_a_reply_body_that_never_ends():
    async def handler(reader, writer, seen):
        await read_request(reader, seen)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab")
        await writer.drain()
        await asyncio.sleep(30)

    exc, _ = failure(handler, timeout=aiohttp.ClientTimeout(total=0.3))
    assert isinstance(exc, TimeoutError)
    assert translate_error(exc).code == "upstream_timeout"


def test_a_stream_idle_past_sock_read_fails_with_a_read_timeout():
    async def handler(reader, writer, seen):
        await read_request(reader, seen)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n6\r\ndata:1\r\n")
        await writer.drain()
        await asyncio.sleep(30)

    async def go():
        server, url, _ = await agent(handler)
        client = session()
        response = await client.post(url, data=b"{}", headers={},
                                     timeout=aiohttp.ClientTimeout(total=None, sock_read=0.3))
        chunks = []
        try:
            async for chunk in response.content.iter_any():
                chunks.append(chunk)
        except Exception as exc:
            return chunks, exc
        finally:
            response.close()
            await client.close()
            server.close()

    chunks, exc = run(go())
    assert chunks == [b"data:1"]
    assert isinstance(exc, aiohttp.ServerTimeoutError)


def test_a_reply_head_over_the_limit_is_refused():
    async def handler(reader, writer, seen):
        await read_request(reader, seen)
        writer.write(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * MAX_HEAD_BYTES + b"\r\n\r\n")
        await writer.drain()

    exc, _ = failure(handler)
    assert isinstance(exc, aiohttp.ClientPayloadError)


def test_a_header_value_with_a_line_break_is_never_sent():
    async def handler(reader, writer, seen):
        await read_request(reader, seen)

    async def go():
        server, url, seen = await agent(handler)
        client = session()
        with pytest.raises(ValueError):
            await client.post(url, data=b"{}", headers={"x-id": "a\r\nX-Admin: 1"},
                              timeout=TIMEOUT)
        with pytest.raises(ValueError):
            await client.post(url, data=b"{}", headers={"x-id": "a\nb"}, timeout=TIMEOUT)
        await client.close()
        server.close()
        return seen

    assert run(go()) == []


def test_reading_pauses_while_the_reader_is_slow():
    """An agent that streams faster than its caller reads fills only a bounded buffer:
    past the high-water mark the gateway stops reading its socket."""
    chunk = b"x" * 65536
    sent = []

    async def handler(reader, writer, seen):
        await read_request(reader, seen)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        writer.transport.set_write_buffer_limits(high=65536)
        try:
            for _ in range(400):  # 25 MiB offered
                writer.write(chunk)
                await asyncio.wait_for(writer.drain(), 1.0)
                sent.append(len(chunk))
        except (TimeoutError, ConnectionError):
            pass

    async def go():
        server, url, _ = await agent(handler)
        client = session()
        response = await client.post(url, data=b"{}", headers={},
                                     timeout=aiohttp.ClientTimeout(total=None))
        # Wait until the agent can send no more (its drain times out) without reading.
        for _ in range(100):
            before = len(sent)
            await asyncio.sleep(0.05)
            if len(sent) == before and sent:
                break
        buffered = response._buffered
        response.close()
        await client.close()
        server.close()
        return buffered

    buffered = run(go())
    assert buffered <= READ_HIGH_WATER + 2 * 65536 + 1024
    assert sum(sent) < 400 * len(chunk)  # the agent was held back


def test_idle_connections_are_closed_after_their_keep_alive():
    async def go():
        closed = asyncio.Event()

        async def handler(reader, writer, seen):
            await read_request(reader, seen)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            seen.append(await reader.read())  # b"" once the gateway closes its side
            closed.set()

        server, url, seen = await agent(handler)
        client = session(idle_seconds=0.05)
        response = await client.post(url, data=b"{}", headers={}, timeout=TIMEOUT)
        await response.read()
        response.release()
        kept = client.idle_connections()
        await asyncio.wait_for(closed.wait(), 5)
        left = client.idle_connections()
        await client.close()
        server.close()
        return kept, left, seen[-1]

    kept, left, last = run(go())
    assert (kept, left, last) == (1, 0, b"")


@pytest.mark.parametrize("apart, stale", [
    (False, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"),
    (True, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"),
    # Only the head of a second reply, its body still to come: the next call's reply
    # would be swallowed as that body (a break test saw the next call hang for good).
    (False, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 34\r\n\r\n"),
    (True, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 34\r\n\r\n"),
])
def test_an_unsolicited_second_reply_is_never_the_next_calls_reply(apart, stale):
    """An agent that answers one request twice (in one write, or a moment later) must
    not hand its stale second answer to the next call on the kept-alive connection."""
    connections = []

    async def answer(writer, body, seen):
        if apart:
            writer.write(ok(body))
            await writer.drain()
            await asyncio.sleep(0)
            writer.write(stale)
        else:
            writer.write(ok(body) + stale)
        await writer.drain()

    handler = answering(connections, answer)

    async def go():
        server, url, _ = await agent(handler)
        client = session()
        bodies = []
        for n in range(3):
            response = await client.post(url, data=b'{"n":%d}' % n, headers={},
                                         timeout=TIMEOUT)
            bodies.append(await response.read())
            if apart:
                await asyncio.sleep(0.05)  # let the stale reply arrive before release
            response.release()
        await client.close()
        server.close()
        return bodies

    bodies = run(go())
    assert bodies == [b'{"n":0}', b'{"n":1}', b'{"n":2}']
    assert len(connections) == 3  # each poisoned connection was dropped, not reused


def test_a_connection_is_not_reused_while_its_request_is_still_being_sent():
    """An agent that answers before reading the whole request body leaves that body's
    tail in flight: the connection must not carry another request."""
    big = b'{"pad":"' + b"x" * (8 * 1024 * 1024) + b'"}'
    connections = []

    async def handler(reader, writer, seen):
        connections.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(1)  # never reads the body

    async def go():
        server, url, _ = await agent(handler)
        client = session()
        response = await client.post(url, data=big, headers={}, timeout=TIMEOUT)
        body = await response.read()
        response.release()
        kept = client.idle_connections()
        await client.close()
        server.close()
        return body, kept

    body, kept = run(go())
    assert body == b"ok" and kept == 0


def test_a_head_line_that_never_ends_is_refused_early_not_buffered():
    """The parser holds a header line until its end: what it may hold is bounded while
    the line is still arriving (a break test grew the gateway by 270 MB on one call)."""
    async def handler(reader, writer, seen):
        await read_request(reader, seen)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: ")
        try:
            for _ in range(3200):  # up to 200 MiB, never a line end
                writer.write(b"a" * 65536)
                await writer.drain()
        except ConnectionError:
            pass

    async def go():
        server, url, _ = await agent(handler)
        client = session()
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await client.post(url, data=b"{}", headers={},
                              timeout=aiohttp.ClientTimeout(total=30))
        except Exception as exc:
            return exc, loop.time() - started
        finally:
            await client.close()
            server.close()

    exc, _ = run(go())
    assert isinstance(exc, aiohttp.ClientPayloadError) and "head" in str(exc)
    assert translate_error(exc).code == "upstream_bad_response"  # the agent's fault


def test_identity_is_asked_for_and_an_encoded_reply_is_refused_by_name():
    import gzip

    body = gzip.compress(b'{"ok": true}')

    async def handler(reader, writer, seen):
        await read_request(reader, seen)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d"
                     b"\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    exc, seen = failure(handler)
    assert b"\r\nAccept-Encoding: identity\r\n" in seen[0]
    assert isinstance(exc, aiohttp.ClientPayloadError) and "gzip" in str(exc)
    assert translate_error(exc).code == "upstream_bad_response"


def test_an_agent_that_spoke_out_of_turn_gets_no_kept_connection_for_a_while():
    """A late extra reply may arrive just after the next request went out on another of
    the agent's connections, where HTTP/1.1 cannot tell it from that request's reply: so
    once an agent has sent bytes out of turn, none of its connections is kept."""
    connections = []

    async def answer(writer, body, seen):
        writer.write(ok(body))
        if len(seen) == 1:
            writer.write(ok(b"stale"))
        await writer.drain()

    handler = answering(connections, answer)

    async def go():
        server, url, _ = await agent(handler)
        client = session()
        bodies, kept = [], []
        for n in range(4):
            response = await client.post(url, data=b'{"n":%d}' % n, headers={},
                                         timeout=TIMEOUT)
            bodies.append(await response.read())
            response.release()
            kept.append(client.idle_connections())
        await client.close()
        server.close()
        return bodies, kept

    bodies, kept = run(go())
    assert bodies == [b'{"n":%d}' % n for n in range(4)]
    assert kept == [0, 0, 0, 0] and len(connections) == 4


def test_a_reply_of_tiny_chunks_never_holds_the_event_loop():
    """helper-50: a reply of a million 1-byte chunks held the gateway's loop for the whole
    read (1.5 s): each chunk is a Python call to parse, the loop reads a socket up to 32
    times a turn, and counted by its bytes the buffer never reached its high-water mark.
    Each chunk now counts ``CHUNK_COST`` more: reading pauses after one read's worth, so
    other work gets a turn between reads (counted in loop turns, not in time)."""
    import socket
    import threading

    import uvloop

    import gateway.h1 as h1

    chunks = 300_000
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         + b"1\r\nx\r\n" * chunks + b"0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    turns, reads_in_turn = [0], []
    original = h1._Connection.data_received

    def counted(self, data):
        reads_in_turn.append(turns[0])
        original(self, data)

    async def go():
        stop = asyncio.Event()

        async def tick():
            while not stop.is_set():
                turns[0] += 1
                await asyncio.sleep(0)

        ticker = asyncio.ensure_future(tick())
        client = session()
        response = await client.post(f"http://127.0.0.1:{port}/call", data=b"{}", headers={},
                                     timeout=aiohttp.ClientTimeout(total=60))
        body = await response.read()
        stop.set()
        await ticker
        response.release()
        await client.close()
        return body

    h1._Connection.data_received = counted
    try:
        body = uvloop.run(go())
    finally:
        h1._Connection.data_received = original
        listener.close()
    assert body == b"x" * chunks
    most_in_one_turn = max(reads_in_turn.count(t) for t in set(reads_in_turn))
    assert most_in_one_turn <= 2, most_in_one_turn
