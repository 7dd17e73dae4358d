"""An MCP server (Streamable HTTP, at ``/mcp``) offering the caller's tools, and with
``?agents=true`` the capabilities of the agents it may reach, as MCP tools: an MCP
client reaches external APIs and agents through one endpoint, with its key.

Stateless: no session id is issued, each POST carries one JSON-RPC message (batches,
which only the 2025-03-26 revision had, are refused) and is answered with JSON;
notifications get 202. GET (a
server-to-client stream) and DELETE (ending a session) answer 405, which the
specification allows. Tool calls go through the tool gateway (``gateway.tools``) and
capability calls through the call pipeline, so quotas, breakers, audit and metering are
the same as for the HTTP doors.
"""

from __future__ import annotations

import re
import time

import orjson

from gateway import doors
from gateway.calls import CallContext
from gateway.http_io import check_parsed
from gateway.pipeline import Pipeline, deadline_header
from gateway.protocols.base import thaw
from gateway.tools import ToolCaller, ToolDoors, as_text, manual, parameters
from reach_core.errors import ReachError
from routing.router import RouteRequest, reachable_in
from routing.table import RouteTable

PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
SERVER_INFO = {"name": "agent-reach", "title": "Agent-Reach gateway", "version": "1.0.0"}
CAPABILITY_PREFIX = "agent__"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
INTERNAL_ERROR = -32603


class McpServer:
    def __init__(self, *, tools: ToolDoors, pipeline: Pipeline) -> None:
        self.tools = tools
        self.pipeline = pipeline

    async def answer(self, table: RouteTable, who: ToolCaller, raw: bytes, *,
                     with_agents: bool, request_id: str, scope: dict | None = None,
                     namespace: str = "default") -> tuple[int, bytes | None]:
        """The HTTP status and body for one POST: 202 without a body when it held only
        notifications or responses."""
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return 400, orjson.dumps(_error(None, PARSE_ERROR, "The body is not JSON."))
        try:
            check_parsed(raw, message)
        except ReachError as error:
            return 400, orjson.dumps(_error(None, PARSE_ERROR, error.message))
        if isinstance(message, list):  # batches: 2025-03-26 only, and not served here
            return 400, orjson.dumps(_error(None, INVALID_REQUEST, "Send one message per "
                                            "request (JSON-RPC batches are not served)."))
        reply = await self._one(table, who, message, with_agents, request_id, scope, namespace)
        if reply is None:
            return 202, None
        # Not a JSON-RPC message at all: the HTTP answer says so too.
        invalid = "error" in reply and reply["error"]["code"] == INVALID_REQUEST
        try:
            return (400 if invalid else 200), orjson.dumps(reply)
        except orjson.JSONEncodeError:  # an agent's result nested past what can be written
            return 200, orjson.dumps(_error(reply.get("id"), INTERNAL_ERROR, "The tool's "
                                            "result is nested too deeply to forward."))

    async def _one(self, table, who, message, with_agents: bool, request_id: str,
                   scope: dict | None = None, namespace: str = "default"):
        """The reply to one message; None for a notification or a response. A message
        this server cannot take at all is answered with INVALID_REQUEST (HTTP 400)."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error(None, INVALID_REQUEST, "Not a JSON-RPC 2.0 message.")
        if "method" not in message:
            if "result" in message or "error" in message:
                return None  # a response to us: nothing to answer
            return _error(None, INVALID_REQUEST, "A message needs a 'method'.")
        method, params = message["method"], message.get("params", {})
        if not isinstance(method, str) or not method:
            return _error(None, INVALID_REQUEST, "'method' must name a method.")
        if not isinstance(params, dict):
            return _error(None, INVALID_REQUEST, "'params' must be an object.")
        if "id" not in message:
            return None  # a notification (notifications/initialized, ...)
        ident = message["id"]
        if ident is None or isinstance(ident, bool) or not isinstance(ident, str | int):
            return _error(None, INVALID_REQUEST, "'id' must be a string or an integer.")
        if method == "initialize":
            asked = params.get("protocolVersion")
            version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[-1]
            return _result(ident, {
                "protocolVersion": version, "serverInfo": SERVER_INFO,
                "capabilities": {"tools": {"listChanged": False}},
                "instructions": "Tools of Agent-Reach: external APIs called through its "
                                "gateway, and (with ?agents=true) the agents you may reach."})
        if method == "ping":
            return _result(ident, {})
        if method == "tools/list":
            return _result(ident, {"tools": self._listed(table, who, with_agents, namespace)})
        if method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            if not isinstance(name, str):
                return _error(ident, INVALID_PARAMS, "'name' must name a tool.")
            return await self._call(table, who, ident, name, arguments, with_agents,
                                    request_id, scope, namespace)
        return _error(ident, METHOD_NOT_FOUND, f"Method {str(method)[:100]!r} is not served.")

    def _listed(self, table: RouteTable, who: ToolCaller, with_agents: bool,
                namespace: str) -> list[dict]:
        listed = [{"name": t.name, "title": t.display_name or t.name,
                   "description": manual(t), "inputSchema": parameters(t)}
                  for t in self.tools.permitted(table, who)]
        if with_agents:
            for name, (agent, capability) in capability_tools(table, who.tenant_pk,
                                                              namespace).items():
                listed.append({
                    "name": name, "title": capability.display_name or capability.capability_id,
                    "description": (capability.description or agent.description
                                    or capability.capability_id),
                    "inputSchema": {"type": "object", "properties": {},
                                    **thaw(capability.input_schema)}})
        return listed

    async def _call(self, table, who, ident, name: str, arguments, with_agents: bool,
                    request_id: str, scope: dict | None = None, namespace: str = "default"):
        tool = table.tools_by_name.get(name)
        if tool is not None and tool.callable_by(who.tenant_pk, who.agent_pk):
            try:
                reply = await self.tools.call(table, who, tool, arguments,
                                              request_id=request_id)
            except ReachError as error:  # the tool failed: a result the model can read
                return _result(ident, _failed(error, request_id))
            return _result(ident, {
                "content": [{"type": "text", "text": as_text(reply["result"])}],
                "structuredContent": reply, "isError": not reply["ok"]})
        if with_agents and name.startswith(CAPABILITY_PREFIX):
            found = capability_tools(table, who.tenant_pk, namespace).get(name)
            if found is not None:
                return _result(ident, await self._capability(
                    table, who, found[1].capability_id, arguments, request_id, scope,
                    namespace))
        return _error(ident, INVALID_PARAMS, f"Unknown tool {name[:100]!r}.")

    async def _capability(self, table, who, capability_id: str, arguments,
                          request_id: str, scope: dict | None = None,
                          namespace: str = "default") -> dict:
        """One capability call through the pipeline (routing, limits, budgets, metering),
        as the caller's tenant."""
        if not isinstance(arguments, dict):
            return _failed(ReachError("invalid_input", "'arguments' must be an object."),
                           request_id)
        tenant = table.tenants.get(who.tenant_pk)
        ctx = CallContext(request_id=request_id, tenant_pk=who.tenant_pk,
                          tenant_slug=tenant.slug if tenant else "", started=time.monotonic(),
                          budget_ms=0, caller_budget_ms=None, idempotency_key=None)
        try:
            # The caller's deadline holds here too (a re-test found 1 ms and "abc" alike
            # ignored on this door).
            ctx.caller_budget_ms = deadline_header(scope) if scope is not None else None
            call = doors.invoke_call({"capability": capability_id, "input": arguments},
                                     who.tenant_pk, namespace=namespace, internal=False)
            result = await self.pipeline.perform(table, call, ctx, scope=scope)
        except ReachError as error:
            return _failed(error, request_id)
        answer = doors.agent_response(result)
        # A plain agent's answer is its output; a chat agent's, its reply or tool calls.
        shown = next((answer[k] for k in ("output", "reply_content", "tool_calls")
                      if answer[k] is not None), None)
        return {"content": [{"type": "text", "text": as_text(shown)}],
                "structuredContent": answer, "isError": False}


def capability_tools(table: RouteTable, tenant_pk: int,
                     namespace: str = "default") -> dict[str, tuple]:
    """The capabilities a tenant may reach in ``namespace``, as MCP tool names
    (``agent__<id>``, id's other characters as ``_``) -> (the first agent offering it
    there, its capability entry)."""
    request = RouteRequest(tenant_pk=tenant_pk, namespace=namespace)
    out: dict[str, tuple] = {}
    for capability_id in sorted(table.agents_by_capability):
        name = (CAPABILITY_PREFIX + _UNSAFE.sub("_", capability_id))[:64]
        if name in out:
            continue
        for pk in table.agents_by_capability[capability_id]:
            agent = table.agents.get(pk)
            capability = next((c for c in agent.capabilities
                               if c.capability_id == capability_id), None) if agent else None
            if capability is not None and reachable_in(table, request, agent, capability):
                out[name] = (agent, capability)
                break
    return out


def _failed(error: ReachError, request_id: str) -> dict:
    return {"content": [{"type": "text", "text": f"{error.code}: {error.message}"}],
            "structuredContent": error.body(request_id), "isError": True}


def _result(ident, result: dict) -> dict:
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def _error(ident, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}

