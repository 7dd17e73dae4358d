"""The flat schema form of the field reports, as a real JSON Schema.

``capability.yaml`` authors write parameters as ``document_url: {type: string,
required: true}`` and ``key_points: {type: array, items: string}``. That is not
JSON Schema (``required`` is a list there, ``items`` a schema), and storing it as
one would constrain nothing. A schema whose top level holds only field names
mapping to objects is read as this form and converted; anything with a JSON Schema
keyword at the top is taken as JSON Schema. Unknown keys in a field are refused.
"""

from __future__ import annotations

from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

# JSON Schema 2020-12 keywords: a top level using any of them is a JSON Schema, and a
# flat field may use them (with ``required`` as a boolean, ``items`` as a type name).
KEYWORDS = frozenset({
    "$schema", "$id", "$ref", "$defs", "$comment", "$anchor", "definitions",
    "type", "enum", "const", "default", "title", "description", "examples", "format",
    "properties", "patternProperties", "additionalProperties", "required",
    "propertyNames", "minProperties", "maxProperties", "dependentRequired",
    "dependentSchemas", "unevaluatedProperties", "items", "prefixItems", "contains",
    "minItems", "maxItems", "uniqueItems", "minContains", "maxContains",
    "unevaluatedItems", "minLength", "maxLength", "pattern", "contentEncoding",
    "contentMediaType", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "allOf", "anyOf", "oneOf", "not", "if", "then", "else",
    "readOnly", "writeOnly", "deprecated",
})
_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})


def is_flat(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` is the flat form: field names only, each mapping to an object."""
    return bool(schema) and not (KEYWORDS & set(schema)) and all(
        isinstance(v, dict) for v in schema.values()
    )


def as_json_schema(schema: dict[str, Any], at: str, problems: dict[str, list[str]], *,
                   force_flat: bool = False) -> dict[str, Any]:
    """``schema`` as JSON Schema: converted when flat (or ``force_flat``), else as given.

    Problems are added at the field's path (``at.document_url.required``)."""
    if not (force_flat or is_flat(schema)):
        # A JSON Schema: a key that is no keyword would be ignored by every validator
        # (a parameter written beside "properties" constrains nothing), so it is refused.
        for key in sorted(set(schema) - KEYWORDS, key=str):
            problems.setdefault(f"{at}.{key}", []).append(
                "is neither a JSON Schema keyword nor, beside them, a parameter: put "
                "parameters under properties, or write only parameters (the flat form)")
        properties = schema.get("properties")
        for name, sub in (properties.items() if isinstance(properties, dict) else ()):
            if isinstance(sub, dict) and "default" in sub:
                _check_default(sub, f"{at}.properties.{name}", problems)
        return schema
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, raw in schema.items():
        where = f"{at}.{name}"
        if not isinstance(raw, dict):
            problems.setdefault(where, []).append("must be an object like {type: string}")
            continue
        field = _field(raw, where, problems)
        if field.pop("required", False) is True:
            required.append(name)
        properties[name] = field
    converted: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        converted["required"] = required
    return converted


def _field(raw: dict[str, Any], where: str, problems: dict[str, list[str]]) -> dict[str, Any]:
    field = dict(raw)
    for key in sorted(set(field) - KEYWORDS):
        problems.setdefault(f"{where}.{key}", []).append(
            "is not a known field (a parameter takes type, required, default, enum, "
            "description, items and other JSON Schema keywords)")
    if "required" in field and not isinstance(field["required"], bool):
        problems.setdefault(f"{where}.required", []).append("must be true or false")
    items = field.get("items")
    if isinstance(items, str):
        if items in _TYPES:
            field["items"] = {"type": items}
        else:
            problems.setdefault(f"{where}.items", []).append(
                "must be a type name (" + ", ".join(sorted(_TYPES)) + ") or a schema")
    if "default" in field and not problems.get(where):
        _check_default(field, where, problems)
    return field


def _check_default(field: dict[str, Any], where: str, problems: dict[str, list[str]]) -> None:
    """A default the field itself would refuse would turn every call without it into a 400."""
    own = {k: v for k, v in field.items() if k not in ("default", "required")}
    try:
        error = next(Draft202012Validator(own).iter_errors(field["default"]), None)
    except SchemaError:
        return  # reported when the converted schema is checked
    if error is not None:
        problems.setdefault(f"{where}.default", []).append(
            f"does not match the field's own schema: {error.message}")
