"""A real HTTP/1.1 service on loopback for the tests that need an external system (a
tool's API, a webhook receiver, an OTLP collector): threads of the standard library's
server, each request answered by the test's function."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable

# (the request as the server parsed it, its body) -> (status, content type or None, body),
# or with a fourth item, more headers: {name: value}.
Answer = Callable[[http.server.BaseHTTPRequestHandler, bytes], tuple]


class LoopbackService:
    """Answers every GET and POST with ``answer``; ``url`` is its base (plus ``path``)."""

    def __init__(self, answer: Answer, *, path: str = "") -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                status, content_type, data, *more = answer(self, self.rfile.read(length))
                self.send_response(status)
                if content_type:
                    self.send_header("Content-Type", content_type)
                for name, value in (more[0] if more else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve

            def log_message(self, *args):
                pass  # the test's output is the test's

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}{path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
