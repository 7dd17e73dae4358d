"""A callback receiver for task tests. Loopback only.

    python -m tests.agents.receiver PORT GATEWAY_URL API_KEY [--fail]

Every ``POST`` is recorded: path, the delivery headers, whether the signature verifies
(``SIGNING_SECRET`` in the environment), and whether ``GET /v1/tasks/<id>`` on the gateway
already showed the announced state and result when the callback arrived. With ``--fail``
it answers 500 to everything; else 200. ``GET /_seen`` returns the records.
Prints ``READY`` once listening.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import sys

import aiohttp
from aiohttp import web

SEEN: list[dict] = []


async def receive(request: web.Request) -> web.Response:
    body = await request.read()
    headers = request.headers
    secret = os.environ.get("SIGNING_SECRET", "")
    timestamp = headers.get("X-Reach-Timestamp", "")
    expected = "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body,
                                    hashlib.sha256).hexdigest()
    payload = json.loads(body)
    task_id = headers.get("X-Reach-Task")
    readable = None
    async with aiohttp.ClientSession() as session, session.get(
            f"{request.app['gateway']}/v1/tasks/{task_id}",
            headers={"Authorization": f"Bearer {request.app['key']}"}) as reply:
        if reply.status == 200:
            task = await reply.json()
            readable = (task["state"] == payload["announces"]
                        and task["result"] == payload["task"]["result"])
    SEEN.append({"delivery": headers.get("X-Reach-Delivery"), "task": task_id,
                 "idempotency_key": headers.get("Idempotency-Key"),
                 "request_id": headers.get("X-Request-ID"),
                 "signature_ok": hmac.compare_digest(expected,
                                                     headers.get("X-Reach-Signature", "")),
                 "announces": payload["announces"], "readable": readable,
                 "body": body.decode(), "headers": dict(headers)})
    return web.json_response({"ok": False}, status=500) if request.app["fail"] \
        else web.json_response({"ok": True})


async def seen(request: web.Request) -> web.Response:
    return web.json_response(SEEN)


def main() -> None:
    port, gateway, key = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    app = web.Application()
    app["gateway"], app["key"], app["fail"] = gateway, key, "--fail" in sys.argv
    app.router.add_post("/{tail:.*}", receive)
    app.router.add_get("/_seen", seen)

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print("READY", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
