"""An agent process with scripted behaviours, for gateway tests. Loopback only.

    python -m tests.agents.scripted_agent PORT

- ``POST /echo``: replies ``{"echo": <body>, "headers": {<request headers>}}``;
- ``POST /slow``: answers after 2 s (reporting the ``X-Reach-Deadline-Ms`` it saw,
  and recording ``caller_gone`` when the gateway dropped the call meanwhile);
- ``POST /bad``: a reply that breaks the declared output schema;
- ``POST /fail``: HTTP 500; ``POST /refuse``: HTTP 422;
- ``POST /redirect``: a 302 the gateway must not follow;
- ``POST /v1/chat/completions``: OpenAI chat; a last message ``die after N`` streams N
  chunks and then kills this process with SIGKILL, mid-stream; ``report usage X`` reports
  ``X`` (a JSON number, as written) as its tokens, ``answer number X`` answers it;
- ``POST /a2a``: A2A JSON-RPC; ``message/send`` answers a Message echoing the text,
  ``message/stream`` streams one artifact-update per word, then a final status-update
  reporting usage in ``metadata.usage`` (input 3, output = the number of words);
- ``GET /healthz``; ``GET /_seen``: every request path, its X-Reach-Deadline-Ms and (for
  echo, slow, fail, chat and A2A) its JSON body and Idempotency-Key header so far.
Prints ``READY`` once listening.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

from aiohttp import web

SEEN: list[dict] = []


def _seen(request: web.Request, body=None) -> None:
    SEEN.append({"path": request.path, "deadline": request.headers.get("X-Reach-Deadline-Ms"),
                 "idempotency_key": request.headers.get("Idempotency-Key"), "body": body})


async def echo(request: web.Request) -> web.Response:
    body = await request.json()
    _seen(request, body)
    return web.json_response({"echo": body, "headers": dict(request.headers),
                              "query": dict(request.query)})


async def slow(request: web.Request) -> web.Response:
    _seen(request, await request.json())
    await asyncio.sleep(2)
    if request.transport is None or request.transport.is_closing():
        # The gateway dropped the call (its caller left): say so, for the tests.
        SEEN.append({"path": request.path, "caller_gone": True})
    return web.json_response({"ok": True})


async def fail(request: web.Request) -> web.Response:
    _seen(request, await request.json())
    return web.json_response({"error": "scripted failure"}, status=500)


async def refuse(request: web.Request) -> web.Response:
    return web.json_response({"error": "text is required"}, status=422)


async def bad(request: web.Request) -> web.Response:
    return web.json_response({"unexpected": 42})


async def deep(request: web.Request) -> web.Response:
    """A valid JSON reply nested as deep as the request's ``depth`` asks."""
    body = await request.json()
    _seen(request, body)
    depth = int(body.get("depth", 300))
    return web.Response(body=b'{"answer":' + b"[" * depth + b"]" * depth + b"}",
                        content_type="application/json")


async def redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound("http://127.0.0.1:1/elsewhere")


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    _seen(request, body)
    text = body["messages"][-1]["content"]
    words = text.split()
    die_after = int(words[2]) if text.startswith("die after") else None
    stall_after = int(words[2]) if text.startswith("stall after") else None
    delay = 0.05 if text.startswith("slowly") else 0.01
    if text == "answer html":
        return web.Response(text="<html>oops</html>", content_type="text/html")
    if text.startswith(("report usage ", "answer number ")):
        # A figure written as given ("report usage 1e20", "answer number 1" + 30 zeros):
        # the JSON text itself, which no encoder here would write.
        literal = words[2]
        usage = literal if words[0] == "report" else "3"
        content = literal if words[0] == "answer" else '"ok"'
        if not body.get("stream"):
            return web.Response(content_type="application/json", text=(
                '{"id": "c1", "object": "chat.completion", "created": 0, "choices": [{"index": '
                f'0, "message": {{"role": "assistant", "content": "ok", "n": {content}}}, '
                f'"finish_reason": "stop"}}], "usage": {{"prompt_tokens": {usage}, '
                f'"completion_tokens": {usage}}}}}'))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "ok"}}]}\n\n'
                             b'data: {"choices": [], "usage": {"prompt_tokens": '
                             + usage.encode() + b', "completion_tokens": 1}}\n\n'
                             b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    if not body.get("stream"):
        return web.json_response({
            "id": "c1", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"ok: {text}"},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(words), "completion_tokens": len(words) + 1,
                      "total_tokens": 2 * len(words) + 1},
        })
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if text == "stream then fail":
        await response.write(b'data: {"choices": [{"delta": {"content": "fine "}}]}\n\n'
                             b'event: error\ndata: {"error": {"message": "secret-internal-'
                             b'detail /etc/passwd"}}\n\n')
        await response.write_eof()
        return response
    if text.startswith("tiny events "):
        # "tiny events <pieces> <per piece>": pieces of that many comment events each,
        # then one word (helper-50: 80,000 in a piece held the gateway's loop for 25 s).
        pieces, per_piece = int(words[2]), int(words[3])
        for _ in range(pieces):
            await response.write(b":\n\n" * per_piece)
        await response.write(b'data: {"choices": [{"delta": {"content": "end"}}]}\n\n'
                             b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    if text == "stream garbage":
        await response.write(b'data: {"choices": [{"delta": {"content": "fine "}}]}\n\n'
                             b"data: {not json}\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    try:
        for index, word in enumerate(words):
            if die_after is not None and index == die_after:
                os.kill(os.getpid(), signal.SIGKILL)
            if stall_after is not None and index == stall_after:
                await asyncio.sleep(30)
            chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0,
                     "model": body.get("model"),
                     "choices": [{"index": 0, "delta": {"content": word + " "},
                                  "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(delay)
        usage = {"prompt_tokens": 2, "completion_tokens": len(words),
                 "total_tokens": 2 + len(words)}
        await response.write(f'data: {{"choices": [], "usage": {json.dumps(usage)}}}\n\n'.encode())
    except (ConnectionResetError, asyncio.CancelledError):
        # The gateway dropped the connection: its caller went away.
        SEEN.append({"path": request.path, "cancelled_at_word": index})
        raise
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def a2a(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    _seen(request, body)
    text = " ".join(p.get("text", "") for p in body["params"]["message"]["parts"]
                    if p.get("kind") == "text")
    if body["method"] == "message/send":
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": {
            "kind": "message", "role": "agent", "messageId": "m1",
            "parts": [{"kind": "text", "text": f"a2a: {text}"}]}})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    words = text.split()
    for word in words:
        event = {"jsonrpc": "2.0", "id": body["id"], "result": {
            "kind": "artifact-update", "taskId": "t1", "contextId": "c1",
            "artifact": {"artifactId": "a1", "parts": [{"kind": "text", "text": word}]}}}
        await response.write(f"data: {json.dumps(event)}\n\n".encode())
    final = {"jsonrpc": "2.0", "id": body["id"], "result": {
        "kind": "status-update", "taskId": "t1", "contextId": "c1", "final": True,
        "status": {"state": "completed"},
        "metadata": {"usage": {"input_tokens": 3, "output_tokens": len(words)}}}}
    await response.write(f"data: {json.dumps(final)}\n\n".encode())
    await response.write_eof()
    return response


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def seen(request: web.Request) -> web.Response:
    return web.json_response(SEEN)


def main() -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)  # large bodies for the reset tests
    app.add_routes([web.post("/echo", echo), web.post("/slow", slow), web.post("/bad", bad),
                    web.post("/deep", deep), web.post("/fail", fail), web.post("/refuse", refuse),
                    web.post("/redirect", redirect), web.post("/v1/chat/completions", chat),
                    web.post("/a2a", a2a),
                    web.get("/healthz", healthz), web.get("/_seen", seen)])

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", int(sys.argv[1])).start()
        # Only now is the socket listening: READY before this would race the first call.
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
