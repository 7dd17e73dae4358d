"""An agent process for asynchronous-task tests. Loopback only.

    python -m tests.agents.task_agent PORT

- ``POST /work``: sleeps ``input.ms`` (default 0) milliseconds, then answers
  ``{"done": <input>, "port": PORT}``; a caller that drops the connection meanwhile
  stops it (seen as path ``gone``);
- ``POST /deep``: a reply nested 300 deep;
- ``POST /ask``: without ``language`` in its input, asks for it
  (``{"status": {"state": "input-required", "message": "Which language?"}}``); with it,
  answers ``{"translated": <text>, "language": ..., "port": PORT}``;
- ``POST /accept``: takes the work and answers ``202`` with no body (the test reports the
  rest through the platform's status API, as the agent would);
- ``POST /a2a``: A2A ``message/send``. A new message gets a Task in ``input-required``
  asking for a language; a message continuing that task (``taskId``) completes it with an
  artifact. Text ``push`` gets a Task in ``working``; 200 ms later the agent pushes the
  completed Task to the ``pushNotificationConfig`` URL with its token;
- ``GET /_seen``: each request's path, ``X-Reach-Task-Id``, ``Idempotency-Key``,
  ``X-Request-ID`` and JSON body so far.
Prints ``READY`` once listening.
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import aiohttp
from aiohttp import web

SEEN: list[dict] = []
PORT = 0
_background: set = set()


def _seen(request: web.Request, body) -> None:
    SEEN.append({"path": request.path, "task": request.headers.get("X-Reach-Task-Id"),
                 "idempotency_key": request.headers.get("Idempotency-Key"),
                 "request_id": request.headers.get("X-Request-ID"), "body": body})


async def work(request: web.Request) -> web.Response:
    body = await request.json()
    _seen(request, body)
    until = asyncio.get_running_loop().time() + int(body.get("ms", 0)) / 1000
    while (left := until - asyncio.get_running_loop().time()) > 0:
        await asyncio.sleep(min(left, 0.05))
        if request.transport is None or request.transport.is_closing():
            # The gateway dropped the call: its work stops here, and says so.
            SEEN.append({"path": "gone", "task": request.headers.get("X-Reach-Task-Id")})
            return web.Response(status=499)
    return web.json_response({"done": body, "port": PORT})


async def deep(request: web.Request) -> web.Response:
    """A valid JSON reply nested 300 deep: more than the gateway can write again."""
    _seen(request, await request.json())
    return web.Response(body=b'{"answer":' + b"[" * 300 + b"]" * 300 + b"}",
                        content_type="application/json")


async def ask(request: web.Request) -> web.Response:
    body = await request.json()
    _seen(request, body)
    if not body.get("language"):
        return web.json_response({"status": {"state": "input-required",
                                              "message": "Which language?"}})
    return web.json_response({"translated": body.get("text"), "language": body["language"],
                              "port": PORT})


async def accept(request: web.Request) -> web.Response:
    _seen(request, await request.json())
    return web.Response(status=202)


def _task(task_id: str, context: str, state: str, text: str, artifact: bool = False) -> dict:
    task = {"kind": "task", "id": task_id, "contextId": context,
            "status": {"state": state, "message": {
                "kind": "message", "role": "agent", "messageId": uuid.uuid4().hex,
                "parts": [{"kind": "text", "text": text}]}}}
    if artifact:
        task["artifacts"] = [{"artifactId": "a1", "parts": [
            {"kind": "text", "text": text}, {"kind": "data", "data": {"port": PORT}}]}]
    return task


async def a2a(request: web.Request) -> web.Response:
    body = await request.json()
    _seen(request, body)
    params = body.get("params") or {}
    message = params.get("message") or {}
    texts = [p.get("text") for p in message.get("parts", []) if p.get("kind") == "text"]
    data = next((p.get("data") for p in message.get("parts", []) if p.get("kind") == "data"),
                {}) or {}
    text = " ".join(t for t in texts if t)
    if text == "push":
        push = (params.get("configuration") or {}).get("pushNotificationConfig") or {}
        task = _task(uuid.uuid4().hex, uuid.uuid4().hex, "working", "on it")
        job = asyncio.ensure_future(_push_later(push, task))
        _background.add(job)
        job.add_done_callback(_background.discard)
        return web.json_response({"jsonrpc": "2.0", "id": body.get("id"), "result": task})
    if message.get("taskId"):
        language = data.get("language") or text
        result = _task(message["taskId"], message.get("contextId", ""), "completed",
                       f"translated into {language}", artifact=True)
    else:
        result = _task(uuid.uuid4().hex, uuid.uuid4().hex, "input-required",
                       "Which language?")
    return web.json_response({"jsonrpc": "2.0", "id": body.get("id"), "result": result})


async def _push_later(push: dict, task: dict) -> None:
    await asyncio.sleep(0.2)
    done = dict(task, status={"state": "completed", "message": {
        "kind": "message", "role": "agent", "messageId": uuid.uuid4().hex,
        "parts": [{"kind": "text", "text": "pushed result"}]}})
    async with aiohttp.ClientSession() as session, session.post(
            push["url"], json=done,
            headers={"X-A2A-Notification-Token": push.get("token", "")}) as reply:
        SEEN.append({"path": "push", "status": reply.status, "body": await reply.text()})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def seen(request: web.Request) -> web.Response:
    return web.json_response(SEEN)


def main() -> None:
    global PORT
    PORT = int(sys.argv[1])
    app = web.Application()
    app.router.add_post("/work", work)
    app.router.add_post("/deep", deep)
    app.router.add_post("/ask", ask)
    app.router.add_post("/accept", accept)
    app.router.add_post("/a2a", a2a)
    app.router.add_get("/_seen", seen)
    app.router.add_get("/healthz", healthz)

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", PORT).start()
        print("READY", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
