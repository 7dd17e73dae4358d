"""A call's JSON body is checked the same whatever its shape: repeated keys and nesting
past the limit are refused, strings that look like keys or brackets are not. With more
than ``WALKED_CONTAINERS`` brackets it is checked on its text (a walk of a body of many
arrays held the event loop: helper-52), so each case is tried as it is and padded past
that many brackets."""

from __future__ import annotations

import pytest

from gateway.http_io import MAX_JSON_DEPTH, WALKED_CONTAINERS, parse_json
from reach_core.errors import ReachError

CASES = [
    (b'"b": 1', None),
    (b'"a": 1', "malformed_json"),  # "a" is the padding's key too
    (b'"\\u0061": 1', "malformed_json"),  # the same key, escaped
    (b'"b": {"c": 1, "c": 2}', "malformed_json"),
    (b'"b": [{"c": 1}, {"c": 2}]', None),  # the same key in two objects
    (b'"b": "x\\": y\\":"', None),  # quote-colon inside a string
    (b'"b": "[[[[{{{{"', None),  # brackets inside a string
    (b'"b": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1), None),
    (b'"b": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, "malformed_json"),
]


def outcome(raw: bytes) -> str | None:
    try:
        parse_json(raw)
    except ReachError as error:
        return error.code
    return None


@pytest.mark.parametrize("padding", [b"[]", b"[" + b"[]," * WALKED_CONTAINERS + b"[]]"])
@pytest.mark.parametrize("field, refused", CASES)
def test_a_body_is_checked_the_same_walked_or_read_as_text(field, refused, padding):
    raw = b'{"a": ' + padding + b', ' + field + b"}"
    many = raw.count(b"[") + raw.count(b"{") > WALKED_CONTAINERS
    assert many == (len(padding) > 2)
    assert outcome(raw) == refused, raw[-200:]


def test_a_large_body_of_deep_arrays_within_the_limits_is_accepted():
    """helper-52's body: 2,360 arrays nested 190 deep, 900 KB."""
    one = b"[" * 190 + b"]" * 190
    raw = b'{"capability": "echo.all", "input": {"x": [' + b",".join([one] * 2360) + b"]}}"
    assert parse_json(raw)["capability"] == "echo.all"
