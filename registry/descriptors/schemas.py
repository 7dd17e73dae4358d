"""JSON Schemas (Draft 2020-12) of the three descriptor formats.

These check shape only: types, ranges, patterns, enums. Rules that span fields
(unique capability ids, lease TTL against heartbeat interval, embedded schemas
being valid JSON Schemas) live in ``parse.py``. Unknown keys are allowed
everywhere so descriptors can carry fields a newer registry understands; they
are ignored. A capability's (or endpoint's) ``method``, which earlier descriptors
declared, is one: the gateway always POSTs to a capability's path.
"""

from __future__ import annotations

from typing import Any

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
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


_STRING: dict[str, Any] = {"type": "string"}

_DEFS: dict[str, Any] = {
    # Parse errors on either keyword read "must be a positive integer".
    "positive_int": {"type": "integer", "minimum": 1},
    "strings": {"type": "array", "items": _STRING},
    "name": {"type": "string", "pattern": NAME_PATTERN},
    "capability_id": {"type": "string", "pattern": CAPABILITY_ID_PATTERN},
    "version": {"type": "string", "minLength": 1, "maxLength": 40},
    "team": {"type": "string", "maxLength": 100},
    "display_name": {"type": "string", "maxLength": 200},
    "namespace": {"type": "string", "pattern": NAMESPACE_PATTERN},
    "url": {"type": "string", "maxLength": 500, "pattern": URL_PATTERN},
    "protocol": {"enum": ["openai", "http", "a2a"]},
    "kind": {"enum": ["sync", "stream", "async"]},
    "path": {"type": "string", "maxLength": 500, "pattern": PATH_PATTERN},
    "languages": {"type": "array", "items": {"type": "string", "pattern": LANGUAGE_PATTERN}},
    # One direction or a list of them; pattern/items each apply only to their own type.
    "directions": {
        "type": ["string", "array"],
        "pattern": DIRECTION_PATTERN,
        "items": {"type": "string", "pattern": DIRECTION_PATTERN},
    },
    "json_schema": {"type": "object"},
    "rate_limit": {
        "type": "object",
        "properties": {"qps": _ref("positive_int"), "burst": _ref("positive_int")},
    },
    "liveness": {
        "type": "object",
        "properties": {
            "ttl_seconds": _ref("positive_int"),
            "heartbeat_interval_seconds": _ref("positive_int"),
        },
    },
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
}

_DESCRIBED: dict[str, Any] = {
    "display_name": _ref("display_name"),
    "description": _STRING,
    "keywords": _ref("strings"),
}


def _document(title: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"$schema": DRAFT, "title": title, "type": "object", **body, "$defs": _DEFS}


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
            "capabilities": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": _ref("capability_id"),
                        "type": _ref("capability_id"),
                        **_DESCRIBED,
                        **_REACH_FIELDS,
                        # Shorthand for an object input_schema with these properties.
                        "params": {"type": "object", "additionalProperties": _ref("json_schema")},
                        "kind": _ref("kind"),
                        "path": _ref("path"),
                    },
                    "anyOf": [{"required": ["id"]}, {"required": ["type"]}],
                },
            },
            "reach": {
                "type": "object",
                "properties": {
                    "protocol": _ref("protocol"),
                    "endpoint": _ref("url"),
                    "auth": {"type": "object"},
                    "use_tls": {"type": "boolean"},
                    "weight": {"type": "integer", "minimum": 1, "maximum": 10_000},
                },
            },
            "liveness": _ref("liveness"),
        },
        "required": ["capabilities"],
        "anyOf": [{"required": ["name"]}, {"required": ["agent_id"]}],
    },
)

CAPABILITY_YAML_SCHEMA: dict[str, Any] = _document(
    "capability.yaml",
    {
        "properties": {
            "name": _ref("name"),
            "version": _ref("version"),
            "language": {"type": "string", "pattern": LANGUAGE_PATTERN},
            "description": _STRING,
            "namespace": _ref("namespace"),
            "endpoint": _ref("url"),
            "liveness": _ref("liveness"),
            "capabilities": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": _ref("capability_id"),
                        **_DESCRIBED,
                        **_REACH_FIELDS,
                        "type": _ref("kind"),
                        "endpoints": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "path": _ref("path"),
                                    "protocol": _ref("protocol"),
                                },
                            },
                        },
                    },
                    "required": ["id"],
                },
            },
            # ``sla`` is free-form and not read yet.
            "metadata": {"type": "object", "properties": {"owner_team": _ref("team")}},
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
            "provider": {"type": "object", "properties": {"organization": _ref("team")}},
            "capabilities": {"type": "object", "properties": {"streaming": {"type": "boolean"}}},
            "defaultInputModes": _ref("strings"),
            "defaultOutputModes": _ref("strings"),
            "skills": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "minLength": 1},
                        "name": _ref("display_name"),
                        "description": _STRING,
                        "tags": _ref("strings"),
                        "examples": _ref("strings"),
                        "inputModes": _ref("strings"),
                        "outputModes": _ref("strings"),
                        # Vendor extension: what a card cannot say but routing needs.
                        "x-reach": {
                            "type": "object",
                            "properties": {
                                **_REACH_FIELDS,
                                "kind": _ref("kind"),
                                "path": _ref("path"),
                            },
                        },
                    },
                    "required": ["id", "name"],
                },
            },
        },
        "required": ["name", "url", "skills"],
    },
)
