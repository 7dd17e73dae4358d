"""The demo's tool: a stand-in for an external inventory API, on loopback, that wants a
secret key. The key is made at each start and given only to the platform (stored
encrypted in the ``stock-lookup`` tool); agents call the tool through the gateway and
never see it."""

from __future__ import annotations

import http.server
import json
import secrets
import threading
from dataclasses import dataclass

STOCK = {"A-100": 42, "A-200": 0, "B-310": 7, "C-999": 1250}
TOOL_NAME = "stock-lookup"


@dataclass
class Inventory:
    url: str
    secret: str
    server: http.server.ThreadingHTTPServer

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def inventory_start(host: str = "127.0.0.1") -> Inventory:
    secret = "inv_" + secrets.token_urlsafe(24)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # GET /stock/<sku>
            if not secrets.compare_digest(self.headers.get("X-Api-Key", ""), secret):
                return self._answer(401, {"error": "a valid X-Api-Key is required"})
            sku = self.path.split("?")[0].rsplit("/", 1)[-1]
            if not self.path.startswith("/stock/") or sku not in STOCK:
                return self._answer(404, {"error": f"no article {sku}"})
            return self._answer(200, {"sku": sku, "in_stock": STOCK[sku],
                                      "warehouse": "demo"})

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, name="demo-inventory", daemon=True).start()
    return Inventory(url=f"http://{host}:{server.server_address[1]}", secret=secret,
                     server=server)


def demo_tool_register(*, tenant, inventory: Inventory):
    """The ``stock-lookup`` tool of the demo tenant, pointed at this start's inventory."""
    from tools.models import Tool
    from tools.services import tool_save

    tool = Tool.objects.filter(name=TOOL_NAME).first() or Tool(name=TOOL_NAME)
    tool.owner_tenant = tenant
    tool.display_name = "Stock lookup"
    tool.description = "The current stock of one article in the demo warehouse."
    tool.when_to_use = "Someone asks whether an article is available, or how many are left."
    tool.when_not_to_use = "Prices, delivery dates or orders: this tool only counts stock."
    tool.input_schema = {"type": "object", "required": ["sku"], "additionalProperties": False,
                         "properties": {"sku": {"type": "string", "pattern": "^[A-Z]-[0-9]+$",
                                                "description": "article number, e.g. A-100"}}}
    tool.output_description = "{sku, in_stock, warehouse}; 404 for an unknown article."
    tool.examples = [{"arguments": {"sku": "A-100"}, "use": "stock of article A-100"}]
    tool.url_template = inventory.url + "/stock/{sku}"
    tool.method = "GET"
    tool.auth_kind, tool.auth_field_name = "header", "X-Api-Key"
    tool.timeout_ms = 5000
    tool.calls_per_minute, tool.caller_calls_per_minute = 600, 120
    return tool_save(tool=tool, secret=inventory.secret)
