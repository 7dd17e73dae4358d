"""A real agent process for tests: serves HTTP on loopback, registers, heartbeats.

    python -m tests.agents.registered_agent CONTROL_URL REGISTRATION_KEY [--no-heartbeat]

Prints one line ``READY <json>`` once registered, then serves until killed.
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
        body = b'{"status": "ok"}'
        self.send_response(200 if self.path.startswith("/healthz") else 404)
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
    args = parser.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    plane = ControlPlane(args.control_url, token=args.key)
    registration = plane.register({
        "agent_id": args.name,
        "version": "1.0.0",
        "reach": {"protocol": "http", "endpoint": f"http://127.0.0.1:{port}/"},
        "liveness": {"ttl_seconds": 30, "heartbeat_interval_seconds": 10},
        "capabilities": [{"id": "echo.text", "description": "Echo text back."}],
    })
    if not args.no_heartbeat:
        plane.keep_alive(registration, interval=args.interval, load=lambda: {"cpu": 0.1})
    ready = {"port": port, "agent": registration.agent_id, "instance": registration.instance_id}
    sys.stdout.write("READY " + json.dumps(ready) + "\n")
    sys.stdout.flush()
    threading.Event().wait()


if __name__ == "__main__":
    main()
