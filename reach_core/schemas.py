"""JSON Schema validation safe against the schemas it is given.

A capability's or a tool's schema comes from whoever registered it. Checked as given,
``{"$ref": "http://..."}`` would make the gateway fetch any address while it validates
(past the endpoint policy, holding the event loop), and a ``pattern`` such as
``(a+)+$`` would hold the process for minutes on a 31-character input (Python's ``re``
backtracks, and keeps the GIL). Here references resolve only inside the schema, and
every pattern (``pattern``, ``patternProperties``, and the patterns deciding
``additionalProperties``) runs in the ``regex`` engine with a time limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import regex
from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import NoSuchResource

PATTERN_TIMEOUT_S = 0.05


def _no_retrieval(uri: str):
    raise NoSuchResource(ref=uri)


# References resolve within the schema itself (and the metaschemas), never by fetching.
LOCAL_ONLY = Registry(retrieve=_no_retrieval)


def _search(pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` finds ``text``; None when it could not tell in time (or the
    pattern is not one the engine compiles)."""
    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except (TimeoutError, regex.error):
        return None


def _pattern(validator, pattern: str, instance, schema) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    found = _search(pattern, instance)
    if found is None:
        yield ValidationError(f"could not be matched against {pattern!r} in time")
    elif not found:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, patterns: dict, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            found = _search(pattern, key)
            if found is None:
                yield ValidationError(f"the name {key[:100]!r} could not be matched against "
                                      f"{pattern!r} in time")
            elif found:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator, additional, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [key for key in instance if key not in properties
              and not any(_search(p, key) for p in patterns)]
    if validator.is_type(additional, "object"):
        for key in extras:
            yield from validator.descend(instance[key], additional, path=key)
    elif additional is False and extras:
        names = ", ".join(repr(k) for k in sorted(extras)[:20])
        yield ValidationError(f"Additional properties are not allowed ({names} "
                              f"{'was' if len(extras) == 1 else 'were'} unexpected)")


SafeValidator = validators.extend(Draft202012Validator, {
    "pattern": _pattern, "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
})


def validator_for(schema: dict) -> Any:
    return SafeValidator(schema, registry=LOCAL_ONLY)


def schema_problems(schema: Any) -> list[str]:
    """Why ``schema`` cannot be used (empty: it can): not a JSON Schema, a reference out
    of itself, a pattern the engine does not compile."""
    if not isinstance(schema, dict):
        return ["must be a JSON object (a JSON Schema)"]
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return [f"is not a valid JSON Schema: {exc.message}"]
    problems = []
    for key, value in _walk(schema):
        if key == "$ref" and isinstance(value, str) and not value.startswith("#"):
            problems.append(f"$ref {value[:100]!r} points outside the schema: only "
                            "'#/...' references are followed")
        elif key == "pattern" and isinstance(value, str):
            problems += _compiles(value)
        elif key == "patternProperties" and isinstance(value, dict):
            for pattern in value:
                problems += _compiles(pattern)
    return problems


def _compiles(pattern: str) -> list[str]:
    try:
        regex.compile(pattern)
    except regex.error as exc:
        return [f"pattern {pattern[:100]!r} does not compile ({exc})"]
    return []


def _walk(value, depth: int = 0):
    if depth > 64:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield key, item
            yield from _walk(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item, depth + 1)
