"""A real agent process for tests: serves HTTP on loopback, registers, heartbeats.

    python -m tests.agents.registered_agent CONTROL_URL REGISTRATION_KEY [--no-heartbeat]
        [--name NAME] [--interval S] [--port PORT] [--endpoint URL]
        [--ttl S --declared-interval S] [--capability ID] [--timeout-ms MS]

- ``GET /healthz``: ``{"status": "ok"}``;
- ``POST /echo``: ``{"echo": <body>, "port": <this agent's port>}``.

``--endpoint`` registers another address than its own (a proxy in front of it);
``--ttl`` / ``--declared-interval`` are the descriptor's liveness (30 s / 10 s unless
given), ``--interval`` how often it really heartbeats. Prints one line ``READY <json>``
once registered, then serves until killed.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent_reach import ControlPlane


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self._reply(200 if self.path.startswith("/healthz") else 404, {"status": "ok"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.startswith("/echo"):
            self._reply(200, {"echo": body, "port": self.server.server_address[1]})
        else:
            self._reply(404, {"error": "no such path"})

    def _reply(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("control_url")
    parser.add_argument("key")
    parser.add_argument("--name", default="lease-agent")
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--no-heartbeat", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--endpoint")
    parser.add_argument("--ttl", type=int, default=30)
    parser.add_argument("--declared-interval", type=int, default=10)
    parser.add_argument("--capability", default="echo.text")
    parser.add_argument("--timeout-ms", type=int)
    args = parser.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    plane = ControlPlane(args.control_url, token=args.key)
    capability = {"id": args.capability, "description": "Echo text back.", "path": "/echo"}
    if args.timeout_ms:
        capability["timeout_ms"] = args.timeout_ms
    registration = plane.register({
        "agent_id": args.name,
        "version": "1.0.0",
        "reach": {"protocol": "http",
                  "endpoint": args.endpoint or f"http://127.0.0.1:{port}/"},
        "liveness": {"ttl_seconds": args.ttl,
                     "heartbeat_interval_seconds": args.declared_interval},
        "capabilities": [capability],
    })
    if not args.no_heartbeat:
        plane.keep_alive(registration, interval=args.interval, load=lambda: {"cpu": 0.1})
    ready = {"port": port, "agent": registration.agent_id, "instance": registration.instance_id}
    sys.stdout.write("READY " + json.dumps(ready) + "\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()
