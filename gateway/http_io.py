"""The gateway's ASGI plumbing: request headers, bodies and JSON replies.

The gateway reads ``http.request`` messages itself (no framework buffering), so a
body over the limit is refused as it arrives and a disconnect is noticed.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from urllib.parse import parse_qsl

import numpy as np
import orjson

from reach_core.errors import ReachError

# Headers that decide what a call is or who sends it: given twice, which one counts is
# a guess the gateway does not make (a re-test: of two X-Reach-Intent headers the last
# won, the first one never checked).
SINGLE_HEADERS = frozenset({b"authorization", b"idempotency-key", b"x-reach-intent",
                            b"x-reach-deadline-ms", b"x-reach-namespace"})
_REPEATED = "reach.repeated_headers"


def header(scope, name: bytes) -> str | None:
    """A request header by lower-case name, parsed once per request; one of
    ``SINGLE_HEADERS`` given more than once is a 400 (any other: the last one wins)."""
    headers = scope.get("reach.headers")
    if headers is None:
        raw = scope.get("headers", [])
        headers = scope["reach.headers"] = {key.lower(): value for key, value in raw}
        if len(headers) < len(raw):
            counts = Counter(key.lower() for key, _ in raw)
            scope[_REPEATED] = {key for key, n in counts.items() if n > 1}
    value = headers.get(name)
    if value is not None and name in SINGLE_HEADERS and name in scope.get(_REPEATED, ()):
        label = name.decode().title()
        raise ReachError("invalid_input", f"{label} is given more than once: send it once.",
                         details={label: ["repeated"]})
    return value.decode("latin-1") if value is not None else None


def query_params(scope) -> dict[str, str]:
    """The query string's parameters, each given once, in UTF-8; else a 400, as a
    repeated header is (a break test: ``?intent=x&intent=y`` was taken silently, and
    bytes that are not UTF-8 were matched as replacement characters)."""
    out: dict[str, str] = {}
    try:
        pairs = parse_qsl(scope.get("query_string", b"").decode(), keep_blank_values=True,
                          errors="strict")
    except UnicodeDecodeError:
        raise ReachError("invalid_input", "The query string must be UTF-8 "
                         "(percent-encoded).") from None
    for name, value in pairs:
        if name in out:
            raise ReachError("invalid_input", f"{name[:40]!r} is given more than once in "
                             "the query: give it once.", details={name[:100]: ["repeated"]})
        out[name] = value
    return out


# Set in a request's scope when its caller disconnected while sending the body, or
# before its reply began.
CLIENT_GONE = "reach.client_gone"
# A call's task, put in its scope by the pipeline: the server protocol cancels it when
# the caller's connection ends before the reply begins (reach_platform.http_protocol).
CANCEL_ON_GONE = "reach.cancel_on_gone"


async def read_body(scope, receive, limit: int, timeout_s: float) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` and with 408
    unless it is all in within ``timeout_s``. A client that goes away while sending
    cancels the request (``CancelledError``)."""
    declared = header(scope, b"content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ReachError("payload_too_large", f"Request body exceeds {limit} bytes.")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    scope[CLIENT_GONE] = True
                    raise asyncio.CancelledError
                body = message.get("body", b"")
                size += len(body)
                if size > limit:
                    raise ReachError("payload_too_large",
                                     f"Request body exceeds {limit} bytes.")
                chunks.append(body)
                if not message.get("more_body"):
                    return b"".join(chunks)
    except TimeoutError:
        raise ReachError("request_timeout", f"The request body did not arrive within "
                         f"{timeout_s:g} s.") from None


# How deep a request body may nest: what the gateway can still encode again, with the
# few levels its own envelopes add (orjson writes at most 254; it reads 1024).
MAX_JSON_DEPTH = 200


def parse_json(raw: bytes) -> dict:
    """A JSON object; 400 for anything else, for nesting past ``MAX_JSON_DEPTH``, and
    for duplicate keys (``{"capability": "a", "capability": "b"}`` is ambiguous: other
    parsers on the path may read the first one)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if wide_integer(raw):  # past a double's range orjson gives up (helper-50)
            raise _too_wide() from None
        if str(exc).startswith("number is infinity"):
            # Valid JSON that no double holds (1e400): a value out of range, as a wide
            # integer is, not a syntax error (helper-52 got malformed_json for one and
            # invalid_input for the other).
            raise ReachError("invalid_input", "A number in the body is beyond a double's "
                             f"range and cannot be carried: send it as a string ({exc}).") from None
        raise ReachError("malformed_json", f"Request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ReachError("invalid_input", "Request body must be a JSON object.")
    check_parsed(raw, body)
    if wide_integer(raw):
        raise _too_wide()
    return body


def _too_wide() -> ReachError:
    return ReachError("invalid_input", "An integer in the body is outside -2^63 to "
                      "2^64-1 and cannot be carried exactly: send it as a string.")


# orjson reads an integer beyond -2**63 .. 2**64-1 as a float, silently rounded (a break
# test: 100000000000000000000001 reached the agent as 1e23, and two such bodies under one
# Idempotency-Key were "the same"). Only a text with a run of 19 digits can hold one:
# only that is read again, exactly. The run is looked for in the text with every digit
# made "0" and all else " " (a regular expression took 8 us on a 300-byte reply).
_DIGITS_AS_ZERO = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_NINETEEN_DIGITS = b"0" * 19
_WIDEST = (-(2**63), 2**64 - 1)


def wide_integer(raw: bytes) -> bool:
    """Whether the JSON text ``raw`` (already parsed by orjson) holds an integer that
    orjson cannot carry exactly."""
    if _NINETEEN_DIGITS not in raw.translate(_DIGITS_AS_ZERO):
        return False
    found = False

    def integer(literal: str) -> int:
        nonlocal found
        try:
            if not _WIDEST[0] <= int(literal) <= _WIDEST[1]:
                found = True
        except ValueError:  # past Python's 4,300 digits for int(): wide too
            found = True
        return 0

    try:
        json.loads(raw, parse_int=integer, parse_float=lambda _: 0.0)
    except (ValueError, RecursionError):  # what orjson read and this cannot: not ours
        return False
    return found


def check_parsed(raw: bytes, value) -> None:
    """400 ``malformed_json`` for a parsed body nested past ``MAX_JSON_DEPTH`` or with a
    repeated key (doors that parse their own bodies call it too).

    Every key in the text is a string followed by a colon: with no more such spots
    than parsed keys, no key can have been repeated. Only when there are more (a
    duplicate, or a colon after a quote inside a string value) is the slow check run."""
    if raw.count(b"[") + raw.count(b"{") > WALKED_CONTAINERS:
        _check_large(raw, value)
    elif len(_KEY_END.findall(raw)) > _count_keys(value):
        _refuse_duplicates(raw)


_KEY_END = re.compile(rb'"\s*:')
# With more brackets than this (an upper bound on its arrays and objects) a body is
# checked on its text, not by walking what was parsed: a walk visits every array and
# object in Python, and 900 KB of arrays nested 190 deep (within every limit) held the
# event loop 300-400 ms (helper-52). Below it the walk is the cheaper (a 1 MB string:
# 0.4 ms walked, 13 ms read as text).
WALKED_CONTAINERS = 20_000
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_MASKED_KEY = re.compile(rb'""\s*:')


def _check_large(raw: bytes, value) -> None:
    """``check_parsed`` for a large body: its strings blanked (``""``), its depth is the
    deepest run of brackets, and its keys are the blanked strings a colon follows; the
    parsed value, written again, has as many unless a key was repeated."""
    masked = _STRING.sub(b'""', raw)
    text = np.frombuffer(masked, dtype=np.uint8)
    steps = np.isin(text, _OPENERS).astype(np.int32) - np.isin(text, _CLOSERS)
    if steps.size and int(np.cumsum(steps).max()) > MAX_JSON_DEPTH:
        raise ReachError("malformed_json",
                         f"Request body is nested deeper than {MAX_JSON_DEPTH} levels.")
    written = _STRING.sub(b'""', orjson.dumps(value))
    if len(_MASKED_KEY.findall(masked)) > len(_MASKED_KEY.findall(written)):
        _refuse_duplicates(raw)


_OPENERS = np.array([ord("["), ord("{")], dtype=np.uint8)
_CLOSERS = np.array([ord("]"), ord("}")], dtype=np.uint8)


def require_json(scope, what: str = "the request body") -> None:
    """415 unless the request says its body is JSON (every door that reads one)."""
    content_type, _, parameters = (header(scope, b"content-type") or "").partition(";")
    if content_type.strip().lower() != "application/json":
        raise ReachError("unsupported_media_type",
                         f"Send {what} as Content-Type: application/json.")
    encoding = header(scope, b"content-encoding")
    if encoding is not None and encoding.strip().lower() not in ("", "identity"):
        # RFC 9110 8.4: a coding the server does not decode is a 415. Read as plain,
        # a gzip body is "not JSON", and a plain one labelled gzip was served as if
        # no proxy on the way could have decoded it otherwise (helper-53).
        raise ReachError("unsupported_media_type", f"Send {what} unencoded: "
                         f"Content-Encoding {encoding[:40]!r} is not decoded here.")
    # JSON is UTF-8 (RFC 8259): a body declared in another charset would be misread.
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and \
                value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise ReachError("unsupported_media_type",
                             f"Send {what} in UTF-8 (charset=utf-8, or no charset).")


def _count_keys(value) -> int:
    """The keys in ``value``, refusing it past ``MAX_JSON_DEPTH``. Iterative: a body
    nested as deep as the parser allows (1,024) must not hit Python's recursion limit."""
    count, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_JSON_DEPTH:
            raise ReachError("malformed_json",
                             f"Request body is nested deeper than {MAX_JSON_DEPTH} levels.")
        if isinstance(item, dict):
            count += len(item)
            pending.extend((v, depth + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            pending.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))
    return count


def dumps_reply(value) -> bytes:
    """An agent's result as JSON: one nested too deep to write again is the agent's bad
    reply (502), decided before any byte of the answer is sent, never a 500."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise ReachError("upstream_bad_response", "the agent's reply is nested too deeply "
                         "to forward") from exc


def _refuse_duplicates(raw: bytes) -> None:
    def pairs(items: list[tuple[str, object]]) -> dict:
        seen: dict = {}
        for key, value in items:
            if key in seen:
                # The control plane's parser calls this malformed_json too: one name.
                raise ReachError("malformed_json",
                                 f"Request body repeats the key {key[:100]!r}.")
            seen[key] = value
        return seen

    json.loads(raw, object_pairs_hook=pairs)


async def send_bytes(send, status: int, payload: bytes, request_id: str,
                     extra: list | None = None,
                     content_type: bytes = b"application/json") -> None:
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", content_type),
                    (b"content-length", str(len(payload)).encode()),
                    (b"x-request-id", request_id.encode()), *(extra or [])],
    })
    await send({"type": "http.response.body", "body": payload})


async def send_json(send, status: int, body: dict, request_id: str,
                    extra: list | None = None) -> None:
    await send_bytes(send, status, orjson.dumps(body), request_id, extra)


def retry_headers(retryable: bool, retry_after: int | None = None) -> list:
    """An error's retry hints as headers: ``Retry-After`` when known, and
    ``x-should-retry`` (the official OpenAI SDKs obey it over their own rules, which
    would resend every 5xx and 429: an agent that answered garbage ran three times)."""
    extra = [(b"x-should-retry", b"true" if retryable else b"false")]
    if retry_after:
        extra.append((b"retry-after", str(retry_after).encode()))
    return extra


async def send_error(send, error: ReachError, request_id: str) -> None:
    await send_json(send, error.kind.status, error.body(request_id), request_id,
                    retry_headers(error.kind.retryable, error.retry_after))


def sse_headers(request_id: str) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
            (b"x-request-id", request_id.encode())]
