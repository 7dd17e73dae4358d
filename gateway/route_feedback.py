"""Route feedback: which capability an intent should have reached.

Two sources, one event (``registry.learning`` stores and learns from them):

- **explicit**: ``POST /v1/route/feedback`` with ``{"intent", "capability",
  "routed_to"?}``; ``capability`` must be one the caller's tenant can use;
- **inferred**: per API key the gateway remembers the last intent of a dry run
  (``GET /v1/route?intent=``) or of an intent call that failed (``no_capability`` or
  an agent error), with what the router chose; an explicit capability call by the same
  key that succeeds within ``window_s`` (60 s) reports that intent → capability, unless
  it is what the router chose, or an intent call of that key succeeded in between. The
  memory is per process, bounded (``max_keys``, least recently used first out) and used
  once: a second explicit call teaches nothing more.

Events go to a bounded queue shipped like usage events (``gateway.usage``): never a
database write and never a wait on the call's path. Valid reports are limited per key
and process (``REPORTS_PER_MINUTE``): each is a stored row, and a loop must not fill the
feedback table (what is learned is bounded anyway: ``registry.learning``).
"""

from __future__ import annotations

import collections
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from gateway.http_io import parse_json, query_params
from gateway.limits import InProcessLimiter, Limit
from gateway.usage import UsageQueue
from reach_core.errors import ReachError
from reach_core.kinds import FeedbackSource, Outcome
from routing.router import RouteRequest, capability_visible
from routing.table import ApiKeyEntry, RouteTable
from routing.text import holds_control, says_nothing

MAX_INTENT_CHARS = 1000
MAX_CAPABILITY_CHARS = 128
MAX_BODY_BYTES = 16_384  # an intent of 1,000 characters, each escaped as \uXXXX, fits
_FIELDS = ("intent", "capability", "routed_to")
# A person or a client correcting the router reports a few at a time; a burst of 20 lets
# a client replay a day's misses in a batch, and 60 a minute is far above correcting.
REPORTS_PER_MINUTE = 60
REPORTS_BURST = 20
# An intent call that ended so was probably routed to the wrong capability, or to none;
# one answered 300 needs_confirmation is followed by the caller's choice, which teaches.
FAILED_INTENT_OUTCOMES = frozenset({
    Outcome.NO_CAPABILITY, Outcome.NEEDS_CONFIRMATION, Outcome.UPSTREAM_ERROR,
    Outcome.UPSTREAM_TIMEOUT, Outcome.UPSTREAM_BAD_RESPONSE, Outcome.UPSTREAM_REFUSED,
})


@dataclass(frozen=True, slots=True)
class _Tried:
    tenant_pk: int
    intent: str
    routed_to: str
    at: float  # the recorder's clock


class FeedbackRecorder:
    """Turns feedback, reported or inferred, into events on ``queue``.

    ``clock`` (monotonic seconds) times the inference window; tests inject one."""

    def __init__(self, queue: UsageQueue, *, clock: Callable[[], float] = time.monotonic,
                 window_s: float = 60.0, max_keys: int = 10_000) -> None:
        self.queue = queue
        self._clock = clock
        self._window_s = window_s
        self._max_keys = max_keys
        # API key pk -> the intent it tried last; oldest first.
        self._tried: collections.OrderedDict[int, _Tried] = collections.OrderedDict()
        self._reports = InProcessLimiter(clock)

    def __len__(self) -> int:
        return len(self._tried)

    # ---- explicit ---------------------------------------------------------------------------

    async def reported(self, table: RouteTable, key: ApiKeyEntry, raw: bytes,
                       request_id: str) -> None:
        """A caller's ``POST /v1/route/feedback`` body, validated, as an event. Raises
        ``ReachError`` (``malformed_json``, ``invalid_input`` with every problem in
        ``details``; ``rate_limited`` past the key's share of valid reports here)."""
        body = parse_json(raw)
        problems: dict[str, list[str]] = {}
        for name in body:
            if name not in _FIELDS:
                problems[str(name)[:100]] = [
                    f"is not a known field (known here: {', '.join(_FIELDS)})"]
        intent, capability = body.get("intent"), body.get("capability")
        routed_to = body.get("routed_to")
        if intent is not None and not isinstance(intent, str):
            problems["intent"] = [f"must be a string, not {_json_type(intent)}"]
        elif not isinstance(intent, str) or says_nothing(intent):
            problems["intent"] = ["is required: the request's text"]
        elif holds_control(intent):
            problems["intent"] = ["holds a control character (a NUL, an escape...)"]
        elif len(intent) > MAX_INTENT_CHARS:
            problems["intent"] = [f"must be 1 to {MAX_INTENT_CHARS} characters of text"]
        if capability is not None and not isinstance(capability, str):
            problems["capability"] = [f"must be a string, not {_json_type(capability)}"]
        elif not isinstance(capability, str) or not capability:
            problems["capability"] = ["is required: the capability id finally used"]
        elif len(capability) > MAX_CAPABILITY_CHARS or not capability_visible(
                table, key.tenant_pk, capability):
            # Another tenant's private capability is answered exactly like a missing one.
            problems["capability"] = ["is not a capability this key can use"]
        if routed_to is not None and (not isinstance(routed_to, str)
                                      or len(routed_to) > MAX_CAPABILITY_CHARS
                                      or holds_control(routed_to)):
            problems["routed_to"] = [f"must be a capability id (at most "
                                     f"{MAX_CAPABILITY_CHARS} characters)"]
        if problems:
            raise ReachError("invalid_input", "; ".join(
                f"{name}: {' '.join(messages)}" for name, messages in problems.items()),
                details=problems)
        verdict = await self._reports.check([Limit(
            key=f"feedback:{key.pk}", rate_per_s=REPORTS_PER_MINUTE / 60,
            burst=REPORTS_BURST)])
        if not verdict.allowed:
            raise ReachError("rate_limited", f"This key reported route feedback more than "
                             f"{REPORTS_PER_MINUTE} times a minute; retry after "
                             f"{verdict.retry_after_s:g} s.",
                             retry_after=max(1, math.ceil(verdict.retry_after_s)))
        self._emit(key.tenant_pk, intent, capability, routed_to or "",
                   FeedbackSource.EXPLICIT, request_id)

    # ---- inferred ---------------------------------------------------------------------------

    def tried(self, key: ApiKeyEntry, intent: str | None, routed_to: str | None) -> None:
        """``key`` asked for ``intent`` and the router chose ``routed_to`` (None: nothing)
        in a dry run, or in a call that failed: remember it for ``window_s``."""
        if not intent or says_nothing(intent) or len(intent) > MAX_INTENT_CHARS \
                or holds_control(intent):
            return
        self._tried[key.pk] = _Tried(key.tenant_pk, intent, routed_to or "", self._clock())
        self._tried.move_to_end(key.pk)
        while len(self._tried) > self._max_keys:
            self._tried.popitem(last=False)

    def chose(self, key: ApiKeyEntry, capability: str, request_id: str) -> bool:
        """``key`` called ``capability`` explicitly, and the call succeeded: the intent it
        tried last, if within the window, should have reached it. Returns whether an
        event was emitted."""
        tried = self._tried.pop(key.pk, None)
        if tried is None or self._clock() - tried.at > self._window_s:
            return False
        if capability == tried.routed_to:
            return False  # the caller followed the router: nothing to learn
        self._emit(tried.tenant_pk, tried.intent, capability, tried.routed_to,
                   FeedbackSource.INFERRED, request_id)
        return True

    def after_dry_run(self, key: ApiKeyEntry, query_string: bytes,
                      explained: dict | None) -> None:
        """A dry run the router answered (``explained``: its body or its error's ``route``)."""
        if explained is None:
            return  # refused before routing (a bad query): nothing was tried
        intent = query_params({"query_string": query_string}).get("intent")
        self.tried(key, intent, explained.get("capability"))

    def after_call(self, key: ApiKeyEntry, route: RouteRequest, outcome: str,
                   routed_to: str | None, request_id: str) -> None:
        """A call through the pipeline ended with ``outcome``; ``routed_to`` is the
        capability it was last routed to (None: none)."""
        if route.intent:
            if outcome in FAILED_INTENT_OUTCOMES:
                self.tried(key, route.intent, routed_to)
            elif outcome == Outcome.SUCCESS:
                # The caller moved on: a later explicit call answers this intent, not
                # one it gave up on (a break test: a 300, two intent calls answered,
                # then a refund call taught "write up minutes" to the refund agent).
                self._tried.pop(key.pk, None)
        elif route.capability and route.agent is None and outcome == Outcome.SUCCESS:
            # A chat call naming an agent (``model``) chose an agent, not a capability.
            self.chose(key, route.capability, request_id)

    def _emit(self, tenant_pk: int, intent: str, capability: str, routed_to: str,
              source: FeedbackSource, request_id: str) -> None:
        self.queue.emit({
            "event_id": uuid.uuid4().hex, "request_id": request_id, "tenant": tenant_pk,
            "intent": intent, "capability": capability, "routed_to": routed_to,
            "source": str(source), "occurred_at": time.time(),
        })


def _json_type(value: object) -> str:
    """What a parsed JSON value is, in JSON's words."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {dict: "an object", list: "an array"}.get(type(value), "a string")
