"""An agent process with scripted behaviours, for gateway tests. Loopback only.

    python -m tests.agents.scripted_agent PORT

- ``POST /echo``: replies ``{"echo": <body>, "headers": {<request headers>}}``;
- ``POST /slow``: answers after 2 s (reporting the ``X-Reach-Deadline-Ms`` it saw);
- ``POST /bad``: a reply that breaks the declared output schema;
- ``POST /redirect``: a 302 the gateway must not follow;
- ``POST /v1/chat/completions``: OpenAI chat; a last message ``die after N`` streams N
  chunks and then kills this process with SIGKILL, mid-stream;
- ``GET /healthz``; ``GET /_seen``: every request path and its X-Reach-Deadline-Ms so far.
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


async def echo(request: web.Request) -> web.Response:
    SEEN.append({"path": request.path, "deadline": request.headers.get("X-Reach-Deadline-Ms")})
    body = await request.json()
    return web.json_response({"echo": body, "headers": dict(request.headers),
                              "query": dict(request.query)})


async def slow(request: web.Request) -> web.Response:
    SEEN.append({"path": request.path, "deadline": request.headers.get("X-Reach-Deadline-Ms")})
    await asyncio.sleep(2)
    return web.json_response({"ok": True})


async def bad(request: web.Request) -> web.Response:
    return web.json_response({"unexpected": 42})


async def redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound("http://127.0.0.1:1/elsewhere")


async def chat(request: web.Request) -> web.StreamResponse:
    SEEN.append({"path": request.path, "deadline": request.headers.get("X-Reach-Deadline-Ms")})
    body = await request.json()
    text = body["messages"][-1]["content"]
    words = text.split()
    die_after = int(words[2]) if text.startswith("die after") else None
    stall_after = int(words[2]) if text.startswith("stall after") else None
    delay = 0.05 if text.startswith("slowly") else 0.01
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


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def seen(request: web.Request) -> web.Response:
    return web.json_response(SEEN)


def main() -> None:
    app = web.Application()
    app.add_routes([web.post("/echo", echo), web.post("/slow", slow), web.post("/bad", bad),
                    web.post("/redirect", redirect), web.post("/v1/chat/completions", chat),
                    web.get("/healthz", healthz), web.get("/_seen", seen)])

    async def ready(_app) -> None:
        sys.stdout.write("READY\n")
        sys.stdout.flush()

    app.on_startup.append(ready)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None,
                access_log=None)


if __name__ == "__main__":
    main()
