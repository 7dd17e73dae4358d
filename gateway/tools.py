"""The tool gateway: every external API an agent calls goes through one guarded door.

``POST /v1/tools/<name>/call`` with ``{"arguments": {...}}``, by an agent (its agent
token) or a tenant (an ``invoke`` key):

    authenticate -> find the tool the caller may call -> validate the arguments
    -> quotas (the caller's, and the tool's total towards the external system, shared
    by every gateway process) -> the tool's breaker -> the request, with the secret only
    the gateway holds -> at most one safe retry -> one usage event (the audit record)

The audit record carries the arguments' digest, never their values. A tool's failures
open the tool's breaker, never the calling agent's: its router score is untouched.
``GET /v1/tools`` lists the tools a caller may call, as OpenAI ``tools`` with
``?format=openai``; ``gateway.mcp`` offers the same over MCP.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote

import aiohttp
import orjson
from yarl import URL

from gateway.auth import authenticate
from gateway.breaker import CircuitBreakers
from gateway.calls import Caller
from gateway.h1 import MalformedReply
from gateway.limits import Limit
from gateway.metrics import TOOL_CALL_DURATION, TOOL_CALLS
from gateway.protocols.base import thaw
from gateway.upstream import read_limited
from gateway.usage import UsageQueue
from reach_core import requestid
from reach_core.errors import ReachError
from reach_core.kinds import Outcome
from reach_core.numbers import rounded
from routing.table import RouteTable, ToolEntry

call_log = logging.getLogger("reach.calls")

AGENT_TOKEN_MARK = "rat_"  # noqa: S105  (the agent tokens' prefix, not a secret)
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_IDEMPOTENT = frozenset({"GET", "PUT", "DELETE"})
RESULT_MAX_BYTES = 4 * 1024 * 1024
AGENT_TOKEN_TTL_S = 60.0  # how long a token's check is trusted (revocation takes this long)
POOL_CONNECTIONS = 64


@dataclass(frozen=True)
class ToolCaller:
    """Who calls: a tenant (its key), or one of its agents (its agent token)."""

    tenant_pk: int
    agent_pk: int | None = None

    @property
    def label(self) -> str:
        return f"agent:{self.agent_pk}" if self.agent_pk is not None else \
            f"tenant:{self.tenant_pk}"


def digest(arguments: dict, key: bytes = b"") -> str:
    """The arguments' fingerprint for the audit record (their values are never kept):
    an HMAC with the platform's key, so a short value cannot be found by hashing
    guesses, while equal arguments still have equal digests."""
    return hmac.new(key, _dumps(arguments, sort=True), hashlib.sha256).hexdigest()


def _dumps(value, *, sort: bool = False) -> bytes:
    """JSON bytes; past orjson's nesting limit (255) the standard library takes over (the
    parser accepts bodies nested up to 1,024 levels)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort else None)
    except orjson.JSONEncodeError:
        return json.dumps(value, sort_keys=sort, separators=(",", ":"),
                          ensure_ascii=False).encode()


class ToolDoors:
    def __init__(self, *, caller: Caller, limiter, fallback=None,
                 breakers: CircuitBreakers, usage: UsageQueue | None,
                 authenticate_agent: Callable[[str], Awaitable[int | None]] | None = None,
                 digest_key: bytes = b"", clock: Callable[[], float] = time.monotonic) -> None:
        self.caller = caller
        # Tool quotas are low rates: checked on the shared buckets themselves (a leasing
        # limiter loses the unspent part of its leases, which a 60/min quota feels).
        limiter = getattr(limiter, "exact", limiter)
        self.digest_key = digest_key
        self.limiter = limiter
        self.fallback = fallback
        self.breakers = breakers
        self.usage = usage
        self._authenticate_agent = authenticate_agent
        self._clock = clock
        self._tokens: dict[str, tuple[int | None, float]] = {}
        self._sweep_above = 10_000

    # ---- who calls -------------------------------------------------------------------

    async def caller_of(self, table: RouteTable, authorization: str | None) -> ToolCaller:
        token = (authorization or "").partition(" ")[2].strip()
        if token.startswith(AGENT_TOKEN_MARK):
            agent_pk = await self._agent_of(token)
            agent = table.agents.get(agent_pk) if agent_pk is not None else None
            tenant = table.tenants.get(agent.owner_tenant_pk) if agent is not None else None
            if agent is None or tenant is None or not tenant.is_active:
                raise ReachError("unauthorized", "Agent token is not known, revoked, or its "
                                 "tenant is disabled.")
            return ToolCaller(tenant_pk=agent.owner_tenant_pk, agent_pk=agent.pk)
        key = authenticate(table, authorization)
        return ToolCaller(tenant_pk=key.tenant_pk)

    async def _agent_of(self, token: str) -> int | None:
        """An agent token's agent, asked of the control plane's database once a minute at
        most per token (the route table does not carry agent tokens)."""
        now = self._clock()
        known = self._tokens.get(token)
        if known is not None and known[1] > now:
            return known[0]
        if self._authenticate_agent is None:
            return None
        agent_pk = await self._authenticate_agent(token)
        if len(self._tokens) > self._sweep_above:
            self._tokens = {k: v for k, v in self._tokens.items() if v[1] > now}
            # Swept again only once the count doubles: a sweep per lookup would make
            # each new token (a guesser's, say) scan every live one.
            self._sweep_above = max(10_000, 2 * len(self._tokens))
        # A refusal is remembered briefly: a new token must work within seconds.
        self._tokens[token] = (agent_pk, now + (AGENT_TOKEN_TTL_S if agent_pk else 5.0))
        return agent_pk

    @staticmethod
    def permitted(table: RouteTable, who: ToolCaller) -> list[ToolEntry]:
        return sorted((t for t in table.tools.values()
                       if t.callable_by(who.tenant_pk, who.agent_pk)), key=lambda t: t.name)

    @staticmethod
    def tool(table: RouteTable, who: ToolCaller, name: str) -> ToolEntry:
        tool = table.tools_by_name.get(name)
        if tool is None or not tool.callable_by(who.tenant_pk, who.agent_pk):
            raise ReachError("not_found", f"No tool named {name[:100]!r} that you may call.")
        return tool

    # ---- a call ----------------------------------------------------------------------

    async def call(self, table: RouteTable, who: ToolCaller, tool: ToolEntry, arguments,
                   *, request_id: str, deadline_ms: int | None = None) -> dict:
        """Run one call; returns the reply body. Raises ``ReachError``. Exactly one usage
        event (the audit record) whatever happens once the tool is known: ``arguments``
        may be a coroutine function reading them (the request's body), so a body that
        cannot be read or parsed is a call of the tool too."""
        started = self._clock()
        outcome, status = "internal_error", None
        event_id, opened = requestid.new_request_id(), None
        try:
            if callable(arguments):
                arguments = await arguments()
            if self.usage is not None:  # a SIGKILL from here on still leaves one event
                opened = self.usage.opened(self._usage_event(
                    who, tool, arguments, request_id, event_id, Outcome.WORKER_LOST, None, 0.0))
            owner = table.tenants.get(tool.owner_tenant_pk)
            result = await self._call(who, tool, arguments, deadline_ms,
                                      owner.slug if owner is not None else "")
            outcome, status = "success", result["status"]
            return {"request_id": request_id, "tool": tool.name, **result}
        except ReachError as error:
            outcome = error.code
            raise
        except asyncio.CancelledError:
            outcome = "client_cancelled"
            raise
        finally:
            self._audit(who, tool, arguments, request_id, outcome, status, started, table,
                        event_id, opened)

    async def _call(self, who: ToolCaller, tool: ToolEntry, arguments,
                    deadline_ms: int | None, owner: str) -> dict:
        if not isinstance(arguments, dict):
            raise ReachError("invalid_input", "'arguments' must be a JSON object.",
                             details={"arguments": ["must be an object"]})
        problems = self.caller.validators.errors(tool.input_schema, arguments)
        if problems:
            message = "; ".join(f"{p}: {' '.join(m)}" for p, m in problems.items())
            raise ReachError("invalid_input", "arguments do not match the tool's "
                             f"input_schema: {message}", details=problems)
        await self._admit(who, tool)
        if not self.breakers.allow(tool.pk):
            raise ReachError("circuit_open", f"The tool {tool.name!r} is failing; its breaker "
                             "is open. Retry later.", retry_after=5)
        budget_ms = min(tool.timeout_ms, deadline_ms) if deadline_ms else tool.timeout_ms
        caller_bound = bool(deadline_ms) and deadline_ms < tool.timeout_ms
        deadline = self._clock() + budget_ms / 1000
        url, query, body = request_parts(tool, arguments)
        headers = {"accept": "application/json"}
        if body is not None:
            headers["content-type"] = "application/json"
        ssl_context, secret = self._authenticate_upstream(tool, headers, query, owner)
        attempts = 0
        while True:
            attempts += 1
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise _timed_out(caller_bound, budget_ms)
            try:
                status, result = await self._send(tool, url, query, headers, body,
                                                  ssl_context, remaining, secret)
            except _Retryable as failure:
                self.breakers.record(tool.pk, ok=False)
                # The one safe retry: only when the service never had the request (the
                # HTTP client already repeats an idempotent request on a dropped
                # keep-alive connection; a second layer would multiply it).
                if attempts == 1 and not failure.delivered:
                    continue
                if failure.code == "upstream_timeout":
                    raise _timed_out(caller_bound, budget_ms) from None
                raise ReachError(failure.code, failure.message) from None
            if status >= 500:
                self.breakers.record(tool.pk, ok=False)
                if attempts == 1 and tool.method in _IDEMPOTENT and status in (502, 503, 504):
                    continue
                raise ReachError("upstream_error", f"The tool's service answered HTTP {status}.",
                                 details={"status": status})
            self.breakers.record(tool.pk, ok=True)
            return {"ok": status < 400, "status": status,
                    "result": result, "attempts": attempts}

    async def _admit(self, who: ToolCaller, tool: ToolEntry) -> None:
        """The caller's quota first, then the tool's total: a caller over its own quota
        is refused without spending the tokens every caller shares."""
        if tool.caller_calls_per_minute:
            await self._take(_per_minute(f"tool:{tool.pk}:{who.label}",
                                         tool.caller_calls_per_minute), tool, "your")
        if tool.calls_per_minute:
            await self._take(_per_minute(f"tool:{tool.pk}", tool.calls_per_minute), tool,
                             "its total")

    async def _take(self, limit: Limit, tool: ToolEntry, whose: str) -> None:
        verdict = await self.limiter.check([limit])
        if verdict.degraded and self.fallback is not None:
            verdict = await self.fallback.check([limit])
        if not verdict.allowed:
            raise ReachError("rate_limited", f"The tool {tool.name!r} reached {whose} quota; "
                             f"retry after {verdict.retry_after_s:g} s.",
                             retry_after=max(1, math.ceil(verdict.retry_after_s)))

    def _authenticate_upstream(self, tool: ToolEntry, headers: dict, query: dict,
                               owner: str):
        """The tool's credential (its owner's, the tenant with slug ``owner``), applied
        here and nowhere else: ``(an mTLS context or None, the secret sent or None)``."""
        if tool.auth_kind == "none":
            return None, None
        credentials = self.caller.credentials
        if tool.auth_kind == "mtls":
            return credentials.client_ssl(tool.client_cert_path, tool.client_key_path,
                                          tool.value_env, tool.ca_file, owner), None
        secret = credentials.secret(tool, owner)
        if not secret:
            raise ReachError("service_unavailable", f"The tool {tool.name!r} has no secret "
                             "configured in this gateway.")
        if tool.auth_kind == "bearer":
            headers["authorization"] = f"Bearer {secret}"
        elif tool.auth_kind == "header":
            headers[tool.auth_field_name.lower()] = secret
        elif tool.auth_kind == "query":
            query[tool.auth_field_name] = secret
        return None, secret

    async def _send(self, tool: ToolEntry, url: str, query: dict, headers: dict,
                    body: bytes | None, ssl_context, remaining_s: float,
                    secret: str | None = None):
        pools = self.caller.pools
        session = pools.aiohttp_session(90)
        try:
            slot = await pools.slot(-tool.pk, POOL_CONNECTIONS, min(1.0, remaining_s))
        except TimeoutError:
            raise ReachError("upstream_busy", f"All connections to the tool {tool.name!r} are "
                             "busy; retry shortly.", retry_after=1) from None
        try:
            timeout = aiohttp.ClientTimeout(total=remaining_s,
                                            sock_connect=min(3.0, remaining_s))
            async with session.request(tool.method, URL(url, encoded=True),
                                       params=query or None, data=body,
                                       headers=headers, timeout=timeout,
                                       allow_redirects=False,
                                       ssl=ssl_context if ssl_context is not None else True
                                       ) as response:
                raw = _redacted(await read_limited(
                    response, RESULT_MAX_BYTES,
                    f"The tool's answer is larger than {RESULT_MAX_BYTES} bytes."), secret)
                return response.status, _result(response.content_type, raw)
        except MalformedReply as exc:  # not the network's doing: the service's answer
            raise ReachError("upstream_bad_response", f"The tool's answer is refused: {exc}."
                             ) from None
        except aiohttp.ClientConnectorError as exc:
            raise _Retryable("upstream_error", f"cannot connect to the tool's service "
                             f"({exc.os_error})", delivered=False) from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise _Retryable("upstream_timeout", "the tool's service did not answer in time",
                             delivered=True) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise _Retryable("upstream_error", f"calling the tool failed "
                             f"({type(exc).__name__})", delivered=True) from exc
        finally:
            slot.release()

    def _audit(self, who: ToolCaller, tool: ToolEntry, arguments, request_id: str,
               outcome: str, status: int | None, started: float, table: RouteTable,
               event_id: str, opened=None) -> None:
        seconds = self._clock() - started
        TOOL_CALLS.labels(tool.name, outcome).inc()
        TOOL_CALL_DURATION.labels(tool.name).observe(seconds)
        if call_log.isEnabledFor(logging.INFO):  # a call through the gateway: its line too
            tenant = table.tenants.get(who.tenant_pk)
            call_log.info("tool call %s %s in %.1f ms", outcome, tool.name, seconds * 1000,
                          extra={"call": {
                              "event": "tool_call", "request_id": request_id,
                              "tenant": tenant.slug if tenant is not None else None,
                              "tool": tool.name, "caller_agent": who.agent_pk,
                              "outcome": outcome, "upstream_status": status,
                              "duration_ms": rounded(seconds * 1000, 3)}})
        if self.usage is not None:
            self.usage.emit(self._usage_event(who, tool, arguments, request_id, event_id,
                                              outcome, status, seconds), opened)

    def _usage_event(self, who: ToolCaller, tool: ToolEntry, arguments, request_id: str,
                     event_id: str, outcome: str, status: int | None, seconds: float) -> dict:
        """The call's audit record; its open (``worker_lost``) and final forms share
        ``event_id``, so the store keeps one of them."""
        return {
            "event_id": event_id, "request_id": request_id,
            "tenant": who.tenant_pk, "agent": None, "capability": None, "instance": None,
            "tool": tool.pk, "caller_agent": who.agent_pk,
            "argument_digest": digest(arguments, self.digest_key)
            if isinstance(arguments, dict) else "",
            "upstream_status": status, "outcome": outcome, "input_tokens": 0,
            "output_tokens": 0, "cost": 0.0, "latency_ms": int(seconds * 1000),
            "occurred_at": time.time(),
        }


def _timed_out(caller_bound: bool, budget_ms: int) -> ReachError:
    if caller_bound:
        return ReachError("deadline_exceeded", f"The caller's budget of {budget_ms} ms ran out.")
    return ReachError("upstream_timeout", f"The tool did not answer within {budget_ms} ms.")


def _redacted(raw: bytes, secret: str | None) -> bytes:
    """The answer without the tool's secret, should the service echo it back (a URL
    with the key in its query, a header dump): replaced in the bytes, before parsing,
    in every form an echo takes (``_echoes``)."""
    if not secret or len(secret) < 4:
        return raw
    return _echoes(secret).sub(b"[redacted]", raw)


@lru_cache(maxsize=256)
def _echoes(secret: str) -> re.Pattern[bytes]:
    """The secret as a service may echo it: whole as base64 (either alphabet, padded or
    not) or hex, or character by character as sent, percent-encoded once or twice
    (either hex case, ``+`` for a space), JSON-escaped once or twice (a header dump
    inside a JSON string: ``\\\"``, ``\\u00e9``, ``\\/``), as an HTML entity, or any
    mix of these. Break tests read a base64 key back from ``api_key=AbC%2BdEf...``, and
    a header value from a JSON dump nested in a JSON string."""
    utf8 = secret.encode()
    whole = {base64.b64encode(utf8), base64.urlsafe_b64encode(utf8)}
    whole |= {form.rstrip(b"=") for form in whole}
    forms = []
    for char in secret:
        forms.append(b"(?:" + b"|".join(sorted(_char_echoes(char))) + b")")
    # Hex in either case (a break test read the key back as upper-case hex).
    return re.compile(b"|".join([b"".join(forms), b"(?i:" + utf8.hex().encode() + b")",
                                 *(re.escape(w) for w in sorted(whole))]))


def _char_echoes(char: str) -> set[bytes]:
    utf8 = char.encode()
    percent = b"".join(b"%%%02x" % byte for byte in utf8)
    escaped = {json.dumps(char).encode()[1:-1],
               "".join(f"\\u{unit:04x}" for unit in _utf16(char)).encode()}
    if char == "/":
        escaped.add(b"\\/")
    escaped |= {json.dumps(form.decode()).encode()[1:-1] for form in escaped}  # twice
    ways = {re.escape(utf8), b"(?i:" + percent + b")",
            b"(?i:" + percent.replace(b"%", b"%25") + b")",
            b"(?i:&#x0*%x;)" % ord(char), b"&#0*%d;" % ord(char)}
    ways |= {b"(?i:" + re.escape(form) + b")" for form in escaped if form != utf8}
    if char == " ":
        ways.add(re.escape(b"+"))
    named = {"&": b"&amp;", "<": b"&lt;", ">": b"&gt;", '"': b"&quot;", "'": b"&apos;"}
    if char in named:
        ways.add(re.escape(named[char]))
    return ways


def _utf16(char: str) -> list[int]:
    """The UTF-16 code units of ``char`` (a surrogate pair past the BMP), as \\u names them."""
    data = char.encode("utf-16-be")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


class _Retryable(Exception):
    def __init__(self, code: str, message: str, *, delivered: bool) -> None:
        super().__init__(message)
        self.code, self.message, self.delivered = code, message, delivered


def _per_minute(key: str, per_minute: int) -> Limit:
    # A minute's quota as a bucket of five seconds' worth, refilled continuously: a few
    # calls at once after a pause pass, a whole minute's at once does not.
    return Limit(key=key, rate_per_s=per_minute / 60, burst=max(1, math.ceil(per_minute / 12)))


def request_parts(tool: ToolEntry, arguments: dict) -> tuple[str, dict, bytes | None]:
    """The upstream URL (``{name}`` placeholders filled, percent-encoded), the query and
    the JSON body from the arguments. Raises ``invalid_input`` for a missing path one."""
    used = set()

    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name not in arguments:
            raise ReachError("invalid_input", f"The argument {name!r} is required (it is part "
                             "of the tool's URL).", details={name: ["is required"]})
        used.add(name)
        text = as_text(arguments[name])
        if text in ("", ".", ".."):
            # A dot segment would climb the service's path (/users/{id} -> /).
            raise ReachError("invalid_input", f"The argument {name!r} cannot be "
                             f"{text!r}: it is a part of the tool's URL.",
                             details={name: ["must not be empty, '.' or '..'"]})
        return quote(text, safe="")

    url = _PLACEHOLDER.sub(fill, tool.url_template)
    rest = {k: v for k, v in arguments.items() if k not in used}
    query = {k: as_text(rest.pop(k)) for k in tool.query_arguments if k in rest}
    body = None
    if tool.method in _BODY_METHODS:
        body = _dumps(rest)
    else:
        query.update({k: as_text(v) for k, v in rest.items()})
    return url, query, body


def as_text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return _dumps(value).decode()


def _result(content_type: str, raw: bytes):
    if content_type == "application/json" or content_type.endswith("+json"):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return raw.decode("utf-8", errors="replace")


# ---- offered to models ---------------------------------------------------------------


def manual(tool: ToolEntry) -> str:
    """The tool's description as a model reads it: what, when, when not, an example."""
    parts = [tool.description.strip()]
    if tool.when_to_use:
        parts.append(f"Use it when: {tool.when_to_use.strip()}")
    if tool.when_not_to_use:
        parts.append(f"Do not use it when: {tool.when_not_to_use.strip()}")
    if tool.output_description:
        parts.append(f"It returns: {tool.output_description.strip()}")
    for example in tool.examples[:1]:
        if isinstance(example, dict | type(tool.input_schema)) and "arguments" in example:
            use = f" ({example['use']})" if example.get("use") else ""
            arguments = orjson.dumps(thaw(example["arguments"])).decode()
            parts.append(f"Example{use}: {arguments}")
    return "\n".join(p for p in parts if p)


def _capped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def parameters(tool: ToolEntry) -> dict:
    schema = thaw(tool.input_schema) or {}
    return {"type": "object", "properties": {}, **schema}


OPENAI_DESCRIPTION_MAX = 1024  # OpenAI refuses a request with a longer one


def listing(tools: list[ToolEntry], fmt: str | None) -> dict:
    if fmt == "openai":
        return {"tools": [{"type": "function", "function": {
            "name": t.name, "description": _capped(manual(t), OPENAI_DESCRIPTION_MAX),
            "parameters": parameters(t)}} for t in tools]}
    return {"tools": [{
        "name": t.name, "display_name": t.display_name or t.name,
        "description": t.description, "when_to_use": t.when_to_use,
        "when_not_to_use": t.when_not_to_use, "input_schema": parameters(t),
        "output_description": t.output_description, "examples": thaw(t.examples),
        "timeout_ms": t.timeout_ms} for t in tools]}
