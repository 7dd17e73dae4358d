"""The gateway's doors as OpenAPI 3.0: paths and components merged into ``/api/schema/``
(``reach_platform.openapi``), so callers read one document for the whole platform.

Written from the doors' own contracts (``gateway.doors``) and the one error catalogue
(``reach_core.errors``): every error status a door can answer lists the codes it may
carry. Plain data, no Django.
"""

from __future__ import annotations

from reach_core.errors import CATALOGUE

_REF = "#/components/schemas/"


def _ref(name: str) -> dict:
    return {"$ref": _REF + name}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_OBJECT = {"type": "object", "additionalProperties": True}
_TEXT = {"type": "string"}

SCHEMAS: dict[str, dict] = {
    "GatewayError": {
        "type": "object", "required": ["error"],
        "description": "Every failure, from either plane: a catalogue code, a message, the "
                       "request id, whether retrying may help, and per-field details.",
        "properties": {"error": {
            "type": "object", "required": ["code", "message", "request_id", "retryable"],
            "properties": {
                "code": {"type": "string", "enum": sorted(CATALOGUE)},
                "message": _TEXT, "request_id": _TEXT, "retryable": {"type": "boolean"},
                "details": {**_OBJECT, "description": "Field paths to messages (invalid "
                            "input), candidates (needs_confirmation) or suggestions."},
            }}},
    },
    "InvokeRequest": {
        "type": "object",
        "description": "Name a `capability`, or describe the request as an `intent`.",
        "properties": {
            "capability": {**_TEXT, "example": "translate.text"},
            "intent": {**_TEXT, "maxLength": 2000,
                       "example": "translate this paragraph into French"},
            "input": {**_OBJECT, "description": "The capability's input (its input_schema)."},
            "params": {**_OBJECT, "description": "Extra parameters, merged under `input`."},
            "stream": {"type": "boolean", "default": False,
                       "description": "Relay the agent's answer as Server-Sent Events."},
            "namespace": {**_TEXT, "default": "default"},
            "min_version": _TEXT,
            "cost": {"type": "string", "enum": ["best", "cheapest"], "default": "best"},
            "on_ambiguity": {"type": "string", "enum": ["guess", "ask"], "default": "guess",
                             "description": "`ask`: an intent that nearly ties between "
                             "capabilities answers 300 needs_confirmation with candidates."},
            "mode": {"type": "string", "enum": ["sync", "async"], "default": "sync",
                     "description": "`async`: stored as a task, answered 202."},
            "callback_url": {**_TEXT, "format": "uri"},
            "callback_secret": _TEXT,
        },
    },
    "AgentResponse": {
        "type": "object",
        "required": ["request_id", "agent", "instance", "capability", "usage", "timings"],
        "properties": {
            "request_id": _TEXT, "agent": _TEXT, "instance": {"type": "integer"},
            "capability": _TEXT,
            "reply_content": {**_TEXT, "nullable": True},
            "tool_calls": {"type": "array", "items": _OBJECT, "nullable": True},
            "output": {"nullable": True, "description": "The agent's answer, as it gave it."},
            "raw_meta": {**_OBJECT, "nullable": True},
            "usage": {"type": "object", "properties": {
                "input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"},
                "cost": {"type": "number"}}},
            "timings": {"type": "object", "properties": {
                "route_ms": {"type": "number"}, "upstream_ms": {"type": "number"},
                "total_ms": {"type": "number"}}},
            "confidence": {"type": "number", "description": "An intent: the chance its "
                           "routing is right (as a dry run states it)."},
            "margin": {"type": "number", "description": "An intent: the best match's "
                       "lead over the runner-up."},
            "step_confidence": {"type": "array", "items": {"type": "number"},
                                "description": "An intent of several steps: each step's "
                                               "confidence."},
            "plan": {"type": "array", "items": _TEXT,
                     "description": "An intent of several steps: their capabilities in "
                                    "order; this call ran the first."},
        },
    },
    "TaskAccepted": {
        "type": "object", "required": ["task_id", "state", "request_id", "links"],
        "properties": {
            "task_id": _TEXT, "state": _TEXT, "request_id": _TEXT,
            "idempotency_key": {**_TEXT, "nullable": True}, "capability": _TEXT,
            "links": {"type": "object", "properties": {"self": _TEXT, "events": _TEXT}},
        },
    },
    "ChatCompletionRequest": {
        "type": "object", "required": ["model", "messages"],
        "description": "OpenAI-compatible. `model` names an agent (`name` or "
                       "`namespace/name`) or a capability (`capability:<id>`); the "
                       "`X-Reach-Intent` header routes by intent instead.",
        "properties": {
            "model": {**_TEXT, "example": "capability:chat.general"},
            "messages": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["role"],
                "properties": {"role": _TEXT, "content": {"nullable": True}}}},
            "stream": {"type": "boolean", "default": False},
            "stream_options": {"type": "object", "properties": {
                "include_usage": {"type": "boolean"}}},
        },
        "additionalProperties": True,
    },
    "ChatCompletion": {
        "type": "object", "required": ["id", "object", "model", "choices"],
        "properties": {
            "id": _TEXT, "object": {"type": "string", "enum": ["chat.completion"]},
            "created": {"type": "integer"}, "model": _TEXT,
            "choices": {"type": "array", "items": _OBJECT},
            "usage": {"type": "object", "properties": {
                "prompt_tokens": {"type": "integer"},
                "completion_tokens": {"type": "integer"},
                "total_tokens": {"type": "integer"}}},
        },
    },
    "RouteExplanation": {
        "type": "object",
        "description": "A dry run: what a call would reach, and why; calls nobody.",
        "properties": {
            "request_id": _TEXT, "table_version": {"type": "integer"},
            "capability": {**_TEXT, "nullable": True},
            "chosen": {**_OBJECT, "nullable": True},
            "candidates": {"type": "array", "items": _OBJECT},
            "dropped": {"type": "array", "items": _OBJECT},
            "matches": {"type": "array", "items": _OBJECT},
            "suggestions": {"type": "array", "items": _OBJECT},
            "plan": {"type": "array", "items": _TEXT},
            "confidence": {"type": "number", "nullable": True},
            "margin": {"type": "number", "nullable": True},
            "needs_confirmation": {"type": "boolean"},
        },
        "additionalProperties": True,
    },
    "ToolCallRequest": {
        "type": "object", "properties": {"arguments": {
            **_OBJECT, "description": "The tool's arguments (its input_schema)."}},
        "additionalProperties": False,
    },
    "ToolCallReply": {
        "type": "object", "required": ["request_id", "tool", "ok", "status", "result"],
        "properties": {
            "request_id": _TEXT, "tool": _TEXT,
            "ok": {"type": "boolean", "description": "false: the service answered 4xx."},
            "status": {"type": "integer", "description": "The external service's status."},
            "result": {"nullable": True, "description": "Its answer (JSON, or text)."},
            "attempts": {"type": "integer"},
        },
    },
    "Model": {
        "type": "object", "required": ["id", "object", "created", "owned_by"],
        "properties": {"id": _TEXT, "object": {"type": "string", "enum": ["model"]},
                       "created": {"type": "integer"}, "owned_by": _TEXT,
                       "description": _TEXT},
    },
    "ToolList": {
        "type": "object", "required": ["tools"],
        "properties": {"tools": {"type": "array", "items": _OBJECT, "description": (
            "The tools the caller may call; with format=openai, OpenAI `tools` definitions "
            "({type: function, function: {name, description, parameters}}).")}},
    },
    "RouteFeedback": {
        "type": "object", "required": ["intent", "capability"],
        "properties": {"intent": {**_TEXT, "maxLength": 2000}, "capability": _TEXT,
                       "routed_to": {**_TEXT, "nullable": True}},
    },
}


def _errors(*codes: str) -> dict:
    """The error responses of a door: by status, each with the codes it may carry."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(CATALOGUE[code].status, []).append(code)
    return {str(status): _json(_ref("GatewayError"), "One of: " + ", ".join(
        f"`{c}`" for c in sorted(found))) for status, found in sorted(by_status.items())}


_AUTH_ERRORS = ("unauthorized", "forbidden", "too_many_requests", "overloaded",
                "service_unavailable", "internal_error")
_CALL_ERRORS = (*_AUTH_ERRORS, "bad_request", "invalid_input", "malformed_json",
                "payload_too_large", "unsupported_media_type", "headers_too_large",
                "request_timeout",
                "no_capability", "needs_confirmation", "no_healthy_instance", "circuit_open",
                "rate_limited", "quota_exceeded", "idempotency_in_progress",
                "idempotency_key_reused", "idempotency_unavailable", "deadline_exceeded",
                "upstream_timeout", "upstream_error", "upstream_bad_response",
                "upstream_refused", "upstream_busy")
_HEADERS = [
    {"name": "Idempotency-Key", "in": "header", "schema": {**_TEXT, "maxLength": 255},
     "description": "Run a non-streamed call at most once per (tenant, key)."},
    {"name": "X-Reach-Deadline-Ms", "in": "header", "schema": {"type": "integer",
                                                              "minimum": 1},
     "description": "The caller's budget for the whole call, in milliseconds."},
    {"name": "X-Request-ID", "in": "header", "schema": {**_TEXT, "maxLength": 128},
     "description": "Your id for the call (else one is made); echoed in the reply."},
    {"name": "traceparent", "in": "header", "schema": _TEXT,
     "description": "W3C trace context; the call's spans (and the agent) join it."},
    {"name": "X-Reach-Namespace", "in": "header", "schema": _TEXT},
]
_SSE = {"text/event-stream": {"schema": {**_TEXT, "description": "Server-Sent Events"}}}


def _post(operation: str, summary: str, request: str, ok: dict, errors: tuple,
          extra_parameters: list | None = None) -> dict:
    return {"post": {
        "operationId": operation, "summary": summary, "tags": ["gateway"],
        "parameters": [*_HEADERS, *(extra_parameters or [])],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": _ref(request)}}},
        "responses": {**ok, **_errors(*errors)},
    }}


PATHS: dict[str, dict] = {
    "/v1/invoke": _post(
        "gateway_invoke", "Call a capability, or an intent, through the gateway",
        "InvokeRequest", {
            "200": {"description": "The agent's answer (or, with `stream`, its events).",
                    "content": {"application/json": {"schema": _ref("AgentResponse")},
                                **_SSE}},
            "202": _json(_ref("TaskAccepted"), "`mode: async`: the task was stored."),
        }, _CALL_ERRORS),
    "/v1/chat/completions": _post(
        "gateway_chat_completions", "OpenAI-compatible chat completions", "ChatCompletionRequest",
        {"200": {"description": "A completion, or with `stream` its chunks.",
                 "content": {"application/json": {"schema": _ref("ChatCompletion")},
                             **_SSE}}},
        tuple(c for c in _CALL_ERRORS if c != "needs_confirmation"),
        [{"name": "X-Reach-Intent", "in": "header", "schema": _TEXT,
          "description": "Route by this intent (UTF-8 or percent-encoded)."}]),
    "/v1/models": {"get": {
        "operationId": "gateway_models", "tags": ["gateway"],
        "summary": "OpenAI-compatible: what 'model' may name for this key",
        "responses": {"200": _json({"type": "object", "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": _ref("Model")}}}, "The models."),
            **_errors(*_AUTH_ERRORS)},
    }},
    "/v1/models/{model}": {"get": {
        "operationId": "gateway_model", "tags": ["gateway"], "summary": "One model",
        "parameters": [{"name": "model", "in": "path", "required": True, "schema": _TEXT}],
        "responses": {"200": _json(_ref("Model"), "The model."),
                      **_errors(*_AUTH_ERRORS, "not_found")},
    }},
    "/v1/route": {"get": {
        "operationId": "gateway_route", "summary": "Dry run: where a call would go, and why",
        "tags": ["gateway"],
        "parameters": [
            {"name": name, "in": "query", "schema": _TEXT, "required": False}
            for name in ("capability", "intent", "namespace", "min_version", "cost",
                         "src_lang", "dest_lang", "format", "input_chars")],
        "responses": {"200": _json(_ref("RouteExplanation"), "The decision, explained."),
                      **_errors(*_AUTH_ERRORS, "bad_request", "no_capability",
                                "no_healthy_instance")},
    }},
    "/v1/tools": {"get": {
        "operationId": "gateway_tools", "summary": "The tools this key or agent may call",
        "tags": ["gateway"],
        "parameters": [{"name": "format", "in": "query", "required": False,
                        "schema": {"type": "string", "enum": ["openai"]}}],
        "responses": {"200": _json(_ref("ToolList"), "The permitted tools."),
                      **_errors(*_AUTH_ERRORS, "bad_request")},
    }},
    "/v1/tools/{name}/call": {"post": {
        "operationId": "gateway_tool_call", "tags": ["gateway"],
        "summary": "Call a tool: the gateway holds its secret, quotas and breaker",
        "parameters": [{"name": "name", "in": "path", "required": True, "schema": _TEXT},
                       *_HEADERS[1:3]],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": _ref("ToolCallRequest")}}},
        "responses": {"200": _json(_ref("ToolCallReply"), "The service's answer."),
                      **_errors(*_AUTH_ERRORS, "not_found", "invalid_input",
                                "malformed_json", "payload_too_large",
                                "unsupported_media_type", "rate_limited", "circuit_open",
                                "upstream_timeout", "upstream_error",
                                "upstream_bad_response", "upstream_busy")},
    }},
    "/mcp": {"post": {
        "operationId": "gateway_mcp", "tags": ["gateway"],
        "summary": "MCP (Streamable HTTP): the caller's tools, and ?agents=true its agents",
        "parameters": [{"name": "agents", "in": "query", "required": False,
                        "schema": {"type": "string", "enum": ["true", "false", "1", "0",
                                                              "yes", "no"]}}],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"type": "object", "required": ["jsonrpc"],
                       "properties": {"jsonrpc": {"type": "string", "enum": ["2.0"]},
                                      "method": {"type": "string", "minLength": 1},
                                      "id": {"oneOf": [{"type": "string"},
                                                       {"type": "integer"}]},
                                      "params": _OBJECT},
                       "description": "One JSON-RPC 2.0 message."}}}},
        "responses": {"200": _json(_OBJECT, "The JSON-RPC response."),
                      "202": {"description": "A notification, accepted."},
                      **_errors(*_AUTH_ERRORS, "bad_request", "unsupported_media_type",
                                "payload_too_large")},
    }},
    "/v1/route/feedback": {"post": {
        "operationId": "gateway_route_feedback", "tags": ["gateway"],
        "summary": "Say which capability an intent should have reached",
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": _ref("RouteFeedback")}}},
        "responses": {"202": {"description": "Recorded; it shapes this tenant's routing."},
                      **_errors(*_AUTH_ERRORS, "invalid_input", "malformed_json",
                                "payload_too_large", "unsupported_media_type",
                                "rate_limited")},
    }},
}


# /mcp answers a message it cannot take with 400 and a JSON-RPC error (the MCP transport's
# rule), other failures (authentication, media type) with the platform's error.
SCHEMAS["JsonRpcError"] = {
    "type": "object", "required": ["jsonrpc", "error"],
    "properties": {"jsonrpc": {"type": "string", "enum": ["2.0"]}, "id": {"nullable": True},
                   "error": {"type": "object", "required": ["code", "message"],
                             "properties": {"code": {"type": "integer"}, "message": _TEXT}}},
}
PATHS["/mcp"]["post"]["responses"]["400"] = {
    "description": "Not a JSON-RPC message this server takes (a JSON-RPC error), or a bad "
                   "request (`bad_request`).",
    "content": {"application/json": {"schema": {"oneOf": [_ref("JsonRpcError"),
                                                          _ref("GatewayError")]}}}}


def merge_into(schema: dict) -> dict:
    """``schema`` (an OpenAPI document) with the gateway's paths and components added."""
    paths = schema.setdefault("paths", {})
    for path, item in PATHS.items():
        paths[path] = {method: {**operation, "security": [{"BearerAuth": []}]}
                       for method, operation in item.items()}
    schema.setdefault("components", {}).setdefault("schemas", {}).update(SCHEMAS)
    tags = schema.setdefault("tags", [])
    if not any(tag.get("name") == "gateway" for tag in tags):
        tags.append({"name": "gateway", "description": "The data plane: calls to agents. "
                     "Authenticate with an API key of scope `invoke`."})
    return schema
