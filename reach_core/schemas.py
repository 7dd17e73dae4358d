"""JSON Schema validation safe against the schemas it is given.

A capability's or a tool's schema comes from whoever registered it. Checked as given,
``{"$ref": "http://..."}`` would make the gateway fetch any address while it validates
(past the endpoint policy, holding the event loop), and a ``pattern`` such as
``(a+)+$`` would hold the process for minutes on a 31-character input (Python's ``re``
backtracks, and keeps the GIL). Here references resolve only inside the schema, and
every pattern (``pattern``, ``patternProperties``, and the patterns deciding
``additionalProperties``) runs in the ``regex`` engine with a time limit. And a schema
whose references multiply (``d1: anyOf [$ref d0, $ref d0]``, ``d2: anyOf [$ref d1,
$ref d1]``, ...: 1 KB that checks one value 2^N times) is refused: no value may be
checked against more than ``MAX_CHECKS_PER_VALUE`` subschemas (``checks_per_value``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import regex
from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import NoSuchResource

PATTERN_TIMEOUT_S = 0.05
# The most subschemas one value of the input may be checked against, references
# followed: far above what hand-written schemas need (a few dozen), far below what
# holds the event loop (a break test: 2^25 through 25 nested anyOf pairs froze it).
MAX_CHECKS_PER_VALUE = 1_000
# The most subschema checks one call's value may cost: its parts (every object, array
# and scalar in it) times ``checks_per_value``. A schema under the bound above still
# makes an array of 50,000 items cost 50 million checks; past this, the value is refused
# unchecked ("too large to check"), in milliseconds.
MAX_CHECKS_PER_CALL = 200_000


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


def _unique_items(validator, unique, instance, schema) -> Iterator[ValidationError]:
    """``uniqueItems`` in one pass over hashable stand-ins of the items. jsonschema's own
    compares unhashable items pairwise: 3,000 objects held the event loop 17 s (a break
    test), and its message holds the whole array."""
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set = set()
    try:
        for index, item in enumerate(instance):
            key = _canonical(item)
            if key in seen:
                yield ValidationError(f"item {index} repeats an earlier item (uniqueItems)")
                return
            seen.add(key)
    except RecursionError:
        yield ValidationError("nested too deeply to check uniqueItems")


_ARRAY, _OBJECT, _BOOLEAN = object(), object(), object()


def _canonical(value: Any) -> Any:
    """A hashable value equal for equal JSON values (JSON Schema's equality: 1 and 1.0
    alike, true and 1 not, objects whatever their key order)."""
    if isinstance(value, bool):
        return (_BOOLEAN, value)
    if isinstance(value, list):
        return (_ARRAY, tuple(_canonical(item) for item in value))
    if isinstance(value, dict):
        return (_OBJECT, frozenset((key, _canonical(item)) for key, item in value.items()))
    return value  # str, int, float (1 == 1.0, equal hashes), None


SafeValidator = validators.extend(Draft202012Validator, {
    "pattern": _pattern, "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties, "uniqueItems": _unique_items,
})


def validator_for(schema: dict) -> Any:
    """A validator of ``schema``; None for one that may check a value against more than
    ``MAX_CHECKS_PER_VALUE`` subschemas (stored before that was refused, or an agent's)."""
    checks = checks_per_value(schema)
    if checks is None or checks > MAX_CHECKS_PER_VALUE:
        return None
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
    checks = checks_per_value(schema)
    if checks is None or checks > MAX_CHECKS_PER_VALUE:
        problems.append(f"checks one value against more than {MAX_CHECKS_PER_VALUE} "
                        "subschemas (references that multiply, or that refer back to "
                        "themselves without descending into the value)")
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


# Keywords whose subschemas apply to the same value as the schema holding them; the
# others (properties, items, ...) apply to a part of it, and ``$defs`` to nothing.
_SAME_VALUE_LISTS = ("allOf", "anyOf", "oneOf")
_SAME_VALUE_ONE = ("not", "if", "then", "else")
_CHILD_ONE = ("items", "additionalItems", "additionalProperties", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties")
_CHILD_MAPS = ("properties", "patternProperties", "$defs", "definitions")


def checks_per_value(schema: Any) -> int | None:
    """The most subschemas any one value is checked against under ``schema``, local
    references followed (None: a reference cycle that never descends into the value, or
    a chain too deep to follow). Linear in the schema's size: each subschema's count is
    worked out once."""
    counts: dict[int, int | None] = {}
    busy: set[int] = set()

    def count(node: Any, depth: int) -> int | None:
        if not isinstance(node, dict):
            return 1
        key = id(node)
        if key in counts:
            return counts[key]
        if key in busy or depth > 200:
            return None
        busy.add(key)
        total = 1
        same = [node.get(k) for k in _SAME_VALUE_ONE]
        for k in _SAME_VALUE_LISTS:
            if isinstance(node.get(k), list):
                same += node[k]
        if isinstance(node.get("dependentSchemas"), dict):
            same += node["dependentSchemas"].values()
        for k in ("$ref", "$dynamicRef"):
            if isinstance(node.get(k), str):
                same.append(_local_target(schema, node[k]))
        for sub in same:
            if sub is None:
                continue
            found = count(sub, depth + 1)
            if found is None:
                total = None
                break
            total += found
        busy.discard(key)
        counts[key] = total
        return total

    most = 0
    pending = [schema]
    seen: set[int] = set()
    while pending:
        node = pending.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        found = count(node, 0)
        if found is None:
            return None
        most = max(most, found)
        pending += [node.get(k) for k in (*_CHILD_ONE, *_SAME_VALUE_ONE)]
        for k in (*_SAME_VALUE_LISTS, "prefixItems"):
            if isinstance(node.get(k), list):
                pending += node[k]
        for k in (*_CHILD_MAPS, "dependentSchemas"):
            if isinstance(node.get(k), dict):
                pending += node[k].values()
    return most


def _local_target(root: dict, ref: str) -> Any:
    """What a ``#...`` reference points to in ``root`` (None if it points nowhere or out
    of the schema, which ``schema_problems`` refuses on its own)."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def parts_of(value: Any, most: int) -> int:
    """How many values ``value`` holds, itself included (objects, arrays, scalars),
    counted up to ``most`` (then ``most + 1``): what checking it costs per subschema."""
    count, pending = 0, [value]
    while pending:
        item = pending.pop()
        count += 1
        if count > most:
            return count
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return count
