"""JSON Schemas (Draft 2020-12) of the three descriptor formats.

These check shape only: types, ranges, patterns, enums. Rules that span fields
(unique capability ids, lease TTL against heartbeat interval, embedded schemas
being valid JSON Schemas) live in ``parse.py``.

Every object is closed (``additionalProperties: false``): a key the registry does
not understand is refused at its path, never dropped, so a descriptor means
exactly what its author wrote. Fields kept only for people (an SLA, an Agent
Card's icon) are declared as such and stored with the source document.
"""

from __future__ import annotations

from typing import Any

from registry.spec import MAX_HINT_CHARS, MAX_HINTS

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _exact(body: str) -> str:
    """Anchor ``body`` to the whole string.

    Python's ``$`` also matches before a final newline, so a plain ``^...$`` lets
    "translator\\n" through; the look-ahead closes that gap and reads the same in
    ECMA-262, so the schemas stay portable.
    """
    return f"^(?:{body})$(?!\\n)"


_LANG = r"[A-Za-z]{2,3}(?:-[A-Za-z0-9]{2,8})*"
NAME_PATTERN = _exact(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")
CAPABILITY_ID_PATTERN = _exact(r"[a-z0-9][a-z0-9_.\-]{0,127}")
NAMESPACE_PATTERN = _exact(r"[a-z0-9][a-z0-9_\-]{0,62}")
LANGUAGE_PATTERN = _exact(_LANG)
DIRECTION_PATTERN = _exact(f"{_LANG}->{_LANG}")
URL_PATTERN = _exact(r"https?://[^\s/?#]+(?:[/?#]\S*)?")
PATH_PATTERN = _exact(r"/\S*")
MAX_LEASE_TTL_S = 86_400
# Seconds as a number or with a unit: 90, "90s", "1500ms", "2m", "1h".
DURATION_PATTERN = _exact(r"[0-9]+(?:\.[0-9]+)?(?:ms|s|m|h)?")
ENV_PATTERN = _exact(r"[A-Z_][A-Z0-9_]{0,127}")
HEADER_PATTERN = _exact(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")

# What a failed ``pattern`` means, in words a descriptor author can act on.
PATTERN_HINTS: dict[str, str] = {
    NAME_PATTERN: "must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit",
    CAPABILITY_ID_PATTERN: (
        "must be 1-128 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit"
    ),
    NAMESPACE_PATTERN: "must be a slug of lower-case letters, digits, '_' or '-'",
    LANGUAGE_PATTERN: "must be a language code like en or zh-Hans",
    DIRECTION_PATTERN: "must read like en->zh",
    URL_PATTERN: "must be an http:// or https:// URL",
    PATH_PATTERN: "must start with /",
    DURATION_PATTERN: 'must be seconds, or a duration like "90s", "1500ms" or "2m"',
    ENV_PATTERN: "must be an environment variable name (A-Z, 0-9, _)",
    HEADER_PATTERN: "must be a header or query parameter name",
}

# Protocol names from the field reports, and what each one means here.
PROTOCOL_ALIASES = {"openai-compatible": "openai", "raw-http": "http"}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


def _closed(properties: dict[str, Any], **rest: Any) -> dict[str, Any]:
    """An object with exactly these keys (each optional unless ``required`` says so)."""
    return {"type": "object", "properties": properties, "additionalProperties": False, **rest}


_STRING: dict[str, Any] = {"type": "string"}
# Kept with the source document for people to read; nothing acts on it.
_INFORMATIONAL: dict[str, Any] = {}

_DEFS: dict[str, Any] = {
    # Parse errors on either keyword read "must be a positive integer".
    "positive_int": {"type": "integer", "minimum": 1},
    "strings": {"type": "array", "items": _STRING},
    # A capability's ``examples`` and ``not_for``: short sentences the router reads.
    "hints": {"type": "array", "maxItems": MAX_HINTS,
              "items": {"type": "string", "maxLength": MAX_HINT_CHARS}},
    "name": {"type": "string", "pattern": NAME_PATTERN},
    "capability_id": {"type": "string", "pattern": CAPABILITY_ID_PATTERN},
    "version": {"type": "string", "minLength": 1, "maxLength": 40},
    "team": {"type": "string", "maxLength": 100},
    "display_name": {"type": "string", "maxLength": 200},
    "namespace": {"type": "string", "pattern": NAMESPACE_PATTERN},
    "url": {"type": "string", "maxLength": 500, "pattern": URL_PATTERN},
    # Reached through a reverse tunnel the agent holds to a gateway: no endpoint, and an
    # instance key of the agent's choosing (one per running process).
    "tunnel": _closed({"mode": {"const": "tunnel"},
                       "instance": {"type": "string", "pattern": "^[A-Za-z0-9_-]{8,64}$"}},
                      required=["mode", "instance"]),
    "protocol": {"enum": ["openai", "http", "a2a", *PROTOCOL_ALIASES]},
    "kind": {"enum": ["sync", "stream", "async"]},
    "path": {"type": "string", "maxLength": 500, "pattern": PATH_PATTERN},
    # The gateway always POSTs to a capability's path; saying so is allowed.
    "method": {"enum": ["POST", "post"]},
    "languages": {"type": "array", "items": {"type": "string", "pattern": LANGUAGE_PATTERN}},
    # One direction or a list of them; pattern/items each apply only to their own type.
    "directions": {
        "type": ["string", "array"],
        "pattern": DIRECTION_PATTERN,
        "items": {"type": "string", "pattern": DIRECTION_PATTERN},
    },
    # A JSON Schema, or the flat ``field: {type, required, default, ...}`` form
    # (``parse.py`` converts that and checks either).
    "json_schema": {"type": "object"},
    "duration": {
        "type": ["number", "string"], "minimum": 0, "maxLength": 20, "pattern": DURATION_PATTERN,
    },
    "env": {"type": "string", "pattern": ENV_PATTERN},
    "file": {"type": "string", "minLength": 1, "maxLength": 500},
    "rate_limit": _closed({"qps": _ref("positive_int"), "burst": _ref("positive_int")}),
    # A lease is a promise that a silent instance stops getting calls soon: a day at most
    # (a break test registered a 31-year lease, an instance that could never lapse).
    "liveness": _closed({
        "ttl_seconds": {"type": "integer", "minimum": 1, "maximum": MAX_LEASE_TTL_S},
        "heartbeat_interval_seconds": {"type": "integer", "minimum": 1,
                                       "maximum": MAX_LEASE_TTL_S},
    }),
    # How the gateway authenticates to the agent. Secrets are never written here: only
    # the names of environment variables (and file paths) the gateway reads.
    "auth": _closed(
        {
            "type": {"enum": ["header", "query", "bearer", "cert"]},
            "key": {"type": "string", "pattern": HEADER_PATTERN},
            "value_env": _ref("env"),
            "token_env": _ref("env"),
            "ca_file": _ref("file"),
            "client_cert": _ref("file"),
            "client_key": _ref("file"),
            "client_key_env": _ref("env"),
        },
        required=["type"],
    ),
    "pool": _closed({
        "max_conns": {"type": "integer", "minimum": 1, "maximum": 4096},
        "idle_timeout": _ref("duration"),
    }),
    "routing": _closed({
        "weight": {"type": "integer", "minimum": 1, "maximum": 10_000},
        # Lower is preferred: tier 2 takes calls only while tier 1 has no healthy instance.
        "priority": {"type": "integer", "minimum": 0, "maximum": 100},
    }),
    "adapter_request": _closed({"template": {}}),
    "adapter_response": _closed({
        "envelope": _closed({
            "code_field": _STRING, "ok_value": {}, "message_field": _STRING,
            "data_field": _STRING,
        }),
        "output": _STRING,
        "reply": _STRING,
    }),
    "endpoint": _closed({
        "path": _ref("path"),
        "protocol": _ref("protocol"),
        "method": _ref("method"),
    }),
}

# Capability fields spelled the same in the JSON descriptor, capability.yaml and
# an Agent Card skill's ``x-reach`` extension.
_REACH_FIELDS: dict[str, Any] = {
    "input_schema": _ref("json_schema"),
    "output_schema": _ref("json_schema"),
    "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600_000},
    "rate_limit": _ref("rate_limit"),
    "languages": _ref("languages"),
    "direction": _ref("directions"),
    "version": _ref("version"),
    # Declarative request template and response mapping for plain-HTTP agents.
    "request": _ref("adapter_request"),
    "response": _ref("adapter_response"),
}

_DESCRIBED: dict[str, Any] = {
    "display_name": _ref("display_name"),
    "description": _STRING,
    "keywords": _ref("strings"),
    # Example requests the team expects, and negative hints ("parcel tracking (use
    # logistics.track)").
    "examples": _ref("hints"),
    "not_for": _ref("hints"),
}

# A capability in the JSON descriptor's form (also accepted in an operator's entry).
_JSON_CAPABILITY: dict[str, Any] = _closed(
    {
        "id": _ref("capability_id"),
        "type": _ref("capability_id"),
        **_DESCRIBED,
        **_REACH_FIELDS,
        # Shorthand for an object input_schema with these properties.
        "params": {"type": "object", "additionalProperties": _ref("json_schema")},
        "kind": _ref("kind"),
        "path": _ref("path"),
        "method": _ref("method"),
    },
    anyOf=[{"required": ["id"]}, {"required": ["type"]}],
)

# What a JSON descriptor's ``reach`` block and an operator's entry both say about
# how the agent is reached.
_REACH_BLOCK: dict[str, Any] = {
    "protocol": _ref("protocol"),
    "endpoint": _ref("url"),
    "auth": _ref("auth"),
    "internal_only": {"type": "boolean"},
    "pool": _ref("pool"),
}


def _document(title: str, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": DRAFT, "title": title, "type": "object", "additionalProperties": False,
        **body, "$defs": _DEFS,
    }


JSON_DESCRIPTOR_SCHEMA: dict[str, Any] = _document(
    "Agent descriptor (JSON)",
    {
        "properties": {
            "agent_id": _ref("name"),
            "name": _ref("name"),
            "version": _ref("version"),
            "description": _STRING,
            "namespace": _ref("namespace"),
            "team": _ref("team"),
            "capabilities": {"type": "array", "minItems": 1, "items": _JSON_CAPABILITY},
            "reach": _closed({
                **_REACH_BLOCK,
                "mode": {"enum": ["direct", "tunnel"]},
                "instance": {"type": "string", "pattern": "^[A-Za-z0-9_-]{8,64}$"},
                "use_tls": {"type": "boolean"},
                "weight": _ref("routing/properties/weight"),
                "priority": _ref("routing/properties/priority"),
            }),
            "liveness": _ref("liveness"),
        },
        "required": ["capabilities"],
        "anyOf": [{"required": ["name"]}, {"required": ["agent_id"]}],
    },
)

# One entry of an operator's ``agents:`` list, as the field reports write it.
AGENT_ENTRY_SCHEMA: dict[str, Any] = _document(
    "Agent entry (operator registry form)",
    {
        "properties": {
            "name": _ref("name"),
            **_REACH_BLOCK,
            # Capability ids, or capabilities written out as in the JSON descriptor.
            "capabilities": {
                "type": "array",
                "minItems": 1,
                # if/then/else, not anyOf: an error is reported inside the form used.
                "items": {"if": {"type": "string"}, "then": _ref("capability_id"),
                          "else": _JSON_CAPABILITY},
            },
            "routing": _ref("routing"),
            "version": _ref("version"),
            "description": _STRING,
            "namespace": _ref("namespace"),
            "team": _ref("team"),
            "liveness": _ref("liveness"),
        },
        "required": ["name", "endpoint", "capabilities"],
    },
)

CAPABILITY_YAML_SCHEMA: dict[str, Any] = _document(
    "capability.yaml",
    {
        "properties": {
            "name": _ref("name"),
            "version": _ref("version"),
            # A language code (en, zh-Hans) is the default natural language of every
            # capability; anything else (python, go-lang) names what the agent is
            # written in, which is informational.
            "language": {"type": "string", "minLength": 1, "maxLength": 40},
            "description": _STRING,
            "namespace": _ref("namespace"),
            "endpoint": _ref("url"),
            "reach": _ref("tunnel"),
            "liveness": _ref("liveness"),
            "capabilities": {
                "type": "array",
                "minItems": 1,
                "items": _closed(
                    {
                        "id": _ref("capability_id"),
                        **_DESCRIBED,
                        **_REACH_FIELDS,
                        "type": _ref("kind"),
                        "endpoints": {
                            "type": "array", "maxItems": 1, "items": _ref("endpoint"),
                        },
                    },
                    required=["id"],
                ),
            },
            "metadata": _closed({"owner_team": _ref("team"), "sla": _INFORMATIONAL}),
        },
        "required": ["name", "capabilities"],
    },
)

AGENT_CARD_SCHEMA: dict[str, Any] = _document(
    "A2A Agent Card",
    {
        "properties": {
            # Free text here: the parser turns it into a valid agent name.
            "name": {"type": "string", "minLength": 1},
            "description": _STRING,
            "url": _ref("url"),
            "version": _ref("version"),
            "provider": _closed({"organization": _ref("team"), "url": _STRING}),
            "capabilities": _closed({
                "streaming": {"type": "boolean"},
                "pushNotifications": {"type": "boolean"},
                "stateTransitionHistory": {"type": "boolean"},
                # An extension the agent *requires* of its clients, the gateway cannot
                # honour; optional ones are kept with the card.
                "extensions": {"type": "array", "items": {
                    "type": "object", "properties": {"required": {"const": False}}}},
            }),
            # The gateway speaks JSON-RPC to A2A agents; another transport would be called
            # wrongly, so it is refused rather than ignored.
            "preferredTransport": {"const": "JSONRPC"},
            # Security the card demands (bearer, API key ...) would be silently unmet: the
            # credential is declared with an auth block (JSON descriptor) instead.
            "security": {"type": "array", "maxItems": 0},
            "defaultInputModes": _ref("strings"),
            "defaultOutputModes": _ref("strings"),
            # The rest of the A2A card: kept with the source document for people and
            # for A2A clients; the gateway calls the card's ``url`` over JSON-RPC.
            **dict.fromkeys(
                ("protocolVersion", "additionalInterfaces", "iconUrl",
                 "documentationUrl", "securitySchemes",
                 "supportsAuthenticatedExtendedCard", "signatures"),
                _INFORMATIONAL,
            ),
            "skills": {
                "type": "array",
                "minItems": 1,
                "items": _closed(
                    {
                        "id": {"type": "string", "minLength": 1},
                        "name": _ref("display_name"),
                        "description": _STRING,
                        "tags": _ref("strings"),
                        "examples": _ref("hints"),
                        "inputModes": _ref("strings"),
                        "outputModes": _ref("strings"),
                        "security": _INFORMATIONAL,
                        # Vendor extension: what a card cannot say but routing needs.
                        "x-reach": _closed({
                            **_REACH_FIELDS,
                            "not_for": _ref("hints"),
                            "kind": _ref("kind"),
                            "path": _ref("path"),
                            "method": _ref("method"),
                        }),
                    },
                    required=["id", "name"],
                ),
            },
        },
        "required": ["name", "url", "skills"],
    },
)
