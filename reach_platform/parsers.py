"""The control plane's one JSON parser: strict, bounded, and never a 500.

Every JSON body the REST API reads goes through ``StrictJSONParser``
(``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]`` and the registration view):

- nesting deeper than ``MAX_DEPTH`` (64) arrays/objects is refused, 400 ``malformed_json``
  (a 100,000-deep ``[[[…]]]`` is a 400, never a ``RecursionError``);
- a key that appears twice in one object is refused, 400 ``malformed_json``: which of the
  two values counts would otherwise depend on the reader;
- a NUL character or a lone surrogate (``\\u0000``, ``\\ud800``) in any string, key or
  value, is refused with 400 ``invalid_input`` naming the field's path
  (``capabilities[2].name``): PostgreSQL cannot store either, and neither is text.
"""

from __future__ import annotations

import codecs
import json
import re

from django.conf import settings
from rest_framework import exceptions, parsers

MAX_DEPTH = 64

_BAD_CHAR = re.compile("[\x00\ud800-\udfff]")


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict:
    obj: dict = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _char_problem(text: str) -> str | None:
    match = _BAD_CHAR.search(text)
    if match is None:
        return None
    if match.group() == "\x00":
        return "must not contain NUL (\\u0000) characters"
    return "must not contain unpaired surrogate characters (\\ud800-\\udfff)"


def _path(parent: str, key: object) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    # A key may itself hold the lone surrogate being reported: the path names it escaped,
    # or the error reply could not be encoded.
    key = str(key).encode("utf-8", "backslashreplace").decode("utf-8")
    return f"{parent}.{key}" if parent else key


def check_document(data: object, *, max_depth: int = MAX_DEPTH) -> dict[str, list[str]]:
    """Walk a parsed document (iteratively: no recursion to exhaust). Raises ``ParseError``
    when it nests deeper than ``max_depth``; returns ``{path: [problem]}`` for strings that
    hold NUL or lone surrogates (empty when the document is clean)."""
    problems: dict[str, list[str]] = {}
    stack: list[tuple[object, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth >= max_depth:
                raise exceptions.ParseError(
                    f"nested more than {max_depth} levels deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in items:
                child_path = _path(path, key)
                if isinstance(key, str) and (problem := _char_problem(key)):
                    problems.setdefault(child_path, []).append(f"key {problem}")
                stack.append((child, child_path, depth + 1))
        elif isinstance(value, str) and (problem := _char_problem(value)):
            problems.setdefault(path or "$", []).append(problem)
    return problems


class StrictJSONParser(parsers.JSONParser):
    """DRF's JSON parser with depth, duplicate-key and character checks (module doc)."""

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.getreader(encoding)(stream).read()
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"body is not valid {encoding}") from exc
        try:
            data = json.loads(text, object_pairs_hook=_unique_pairs,
                              parse_constant=_refuse_constant)
        except _DuplicateKey as exc:
            raise exceptions.ParseError(f"duplicate key {exc.key!r} in one object") from None
        except RecursionError:
            raise exceptions.ParseError(f"nested more than {MAX_DEPTH} levels deep") from None
        except ValueError as exc:
            raise exceptions.ParseError(str(exc)) from None
        problems = check_document(data)
        if problems:
            raise exceptions.ValidationError(problems)
        return data


def _refuse_constant(name: str):
    # NaN and Infinity are not JSON (RFC 8259), and PostgreSQL's jsonb refuses them.
    raise ValueError(f"{name} is not a JSON value")
