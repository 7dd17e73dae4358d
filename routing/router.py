"""The router: from a request to a ranked, explained choice of instance.

Plain Python over a ``RouteTable``: match (capability id or intent), filter
(constraints, access, health), score (weight x health - load pressure, with
observed success and latency), tier by priority, prefer cost if asked, split
A/B shares, then balance with smooth weighted round robin.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from routing.balancer import SmoothWeightedRoundRobin
from routing.matcher import AMBIGUITY_MARGIN, CapabilityText, IntentIndex, Match, Score
from routing.table import AgentEntry, CapabilityEntry, InstanceEntry, RouteTable

QUEUE_NORM = 50  # queue depth counted as full pressure
# Allowance for clock skew between the control plane (which sets leases) and this
# process: an instance stops getting callers at most this long after its lease ran out.
LEASE_SLACK_SECONDS = 1.0
WEIGHT_SCALE = 1000  # SWRR needs integers; scores become thousandths


# ---- requests and decisions ----------------------------------------------------------


@dataclass(frozen=True)
class RouteRequest:
    tenant_pk: int
    capability: str | None = None
    intent: str | None = None
    namespace: str = "default"
    min_version: str | None = None
    src_lang: str | None = None
    dest_lang: str | None = None
    input_format: str | None = None
    input_chars: int | None = None
    cost_preference: str = "best"  # "best" or "cheapest"
    # The caller's network is one internal_only agents accept (decided by the gateway).
    internal_network: bool = False
    # Only this agent ("name" or "namespace/name"), as an OpenAI "model" names one.
    agent: str | None = None
    # This instance if it can take the call (a task continued where it was asked for
    # input); the others otherwise, as usual.
    prefer_instance: int | None = None


@dataclass(frozen=True)
class Candidate:
    agent: AgentEntry
    capability: CapabilityEntry
    instance: InstanceEntry
    match: float
    health_factor: float
    load_pressure: float
    success_factor: float
    latency_factor: float
    score: float

    def explain(self) -> dict:
        return {
            "agent": self.agent.name, "agent_id": self.agent.pk,
            "namespace": self.agent.namespace, "instance_id": self.instance.pk,
            "capability": self.capability.capability_id,
            "capability_version": self.capability.version,
            "priority": self.agent.priority, "traffic_percent": self.agent.traffic_percent,
            "scores": {
                "match": self.match, "weight": self.agent.weight,
                "health_factor": self.health_factor,
                "load_pressure": round(self.load_pressure, 4),
                "success_factor": round(self.success_factor, 4),
                "latency_factor": round(self.latency_factor, 4),
                "final": round(self.score, 4),
            },
        }


@dataclass(frozen=True)
class Dropped:
    agent: str
    capability: str
    reason: str
    detail: str = ""
    instance_id: int | None = None

    def explain(self) -> dict:
        out = {"agent": self.agent, "capability": self.capability, "reason": self.reason}
        if self.detail:
            out["detail"] = self.detail
        if self.instance_id is not None:
            out["instance_id"] = self.instance_id
        return out


@dataclass(frozen=True)
class Decision:
    """What the router decided. ``error`` is ``no_capability`` or ``no_healthy_instance``
    when nothing was chosen; ``plan`` lists capability ids when the intent asked for
    several steps (the first step's instance is ``chosen``).

    ``candidates`` (ranked, with every score component) and ``dropped`` (with
    reasons) are filled in for a dry run and whenever nothing could be chosen; a
    routed call skips building them, which is most of a decision's cost."""

    capability: str | None
    chosen: Candidate | None
    candidates: tuple[Candidate, ...] = ()
    dropped: tuple[Dropped, ...] = ()
    matches: tuple[Score, ...] = ()
    plan: tuple[str, ...] = ()
    covered: bool = False
    error: str | None = None
    # Intent decisions: how sure the match is, its lead over the runner-up, whether the
    # two nearly tie (a caller may confirm instead), the closest capabilities when none
    # matched, and each plan step's confidence.
    confidence: float | None = None
    margin: float | None = None
    needs_confirmation: bool = False
    suggestions: tuple[Score, ...] = ()
    step_confidence: tuple[float, ...] = ()
    # What a confirmation chooses among (the matches of the step a call runs: a plan's
    # first, whose confidence and margin a plan's are).
    choices: tuple[Score, ...] = ()
    # How many other instances could serve the chosen capability now: whether a call
    # that fails on ``chosen`` has somewhere else to be retried.
    others: int = 0

    def explain(self) -> dict:
        out = {
            "capability": self.capability,
            "chosen": self.chosen.explain() if self.chosen else None,
            "candidates": [c.explain() for c in self.candidates],
            "dropped": [d.explain() for d in self.dropped],
        }
        if self.matches:
            out["matches"] = [
                {"capability": s.capability_id, "score": s.score, "exact": s.exact,
                 "lexical": round(s.lexical, 4), "semantic": round(s.semantic, 4),
                 "negative": round(s.negative, 4), "learned": round(s.learned, 4)}
                for s in self.matches[:10]
            ]
        if self.confidence is not None:
            out["confidence"] = self.confidence
            out["margin"] = self.margin
            out["needs_confirmation"] = self.needs_confirmation
        if self.suggestions:
            out["suggestions"] = [{"capability": s.capability_id, "score": s.score}
                                  for s in self.suggestions]
        if self.plan:
            out["plan"] = list(self.plan)
            out["step_confidence"] = list(self.step_confidence)
        if self.covered:
            out["covered"] = True
        if self.error:
            out["error"] = self.error
        return out


# ---- feedback from the gateway -------------------------------------------------------


# An instance leaves a call unanswered (no status line yet) for at least this long, and
# for UNANSWERED_FACTOR times its usual latency, before the router prefers the others.
UNANSWERED_FLOOR_S = 0.1
UNANSWERED_FACTOR = 4.0
# How long a call that timed out unanswered keeps its instance avoided when the table
# carries no lease for it (with a lease: until a heartbeat renews it, or it lapses).
UNANSWERED_HOLD_S = 10.0
# Observed failures fade with this time constant (seconds) where no calls come to
# outweigh them: a minute after a burst of failures, an idle instance is back to about
# 87 % of its weight.
SUCCESS_MEMORY_S = 30.0


class Feedback:
    """Observed success rate and latency per instance, as exponentially weighted averages,
    and which instances leave calls unanswered.

    The gateway records every call; the router reads. An instance with no
    observations counts as perfect, so new instances get traffic to be measured.

    *Unanswered*: the gateway reports each attempt when it is ``sent`` and when it is
    ``settled`` (answered: a status line came, whatever its status). An instance is
    ``unanswered`` while one of its attempts has waited past its patience (the larger of
    ``UNANSWERED_FLOOR_S`` and ``UNANSWERED_FACTOR`` x its latency) with no answer from it
    since that attempt began, and after an attempt timed out unanswered until it answers
    again or its lease is renewed (``UNANSWERED_HOLD_S`` without a lease). A hung or
    SIGSTOPped process accepts connections (the kernel does) but answers nothing: without
    this, the balancer keeps handing it its share of calls until its lease lapses, and
    an unkeyed call it received cannot be retried. The router only *prefers* the others:
    an instance that is the only one left still gets its calls.
    """

    def __init__(self, alpha: float = 0.1, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._alpha = alpha
        self._clock = clock
        self.observed = False  # nothing recorded yet: every factor is 1
        self._success: dict[int, tuple[float, float]] = {}  # (success rate, recorded at)
        self._latency: dict[int, float] = {}
        self._lock = threading.Lock()
        self._tokens = itertools.count()
        # Per instance: its attempts waiting for an answer, {token: sent at}, oldest first.
        self._waiting: dict[int, dict[int, float]] = {}
        self._answered: dict[int, float] = {}  # when it last answered
        # Since when it is silent (an attempt timed out unanswered), and its lease then.
        self._silent: dict[int, tuple[float, float | None]] = {}

    def sent(self, instance_pk: int) -> int:
        """An attempt is going to the instance; returns the token ``settled`` takes."""
        token = next(self._tokens)
        now = self._clock()
        with self._lock:
            self._waiting.setdefault(instance_pk, {})[token] = now
        return token

    def settled(self, instance_pk: int, token: int, *, answered: bool,
                timed_out: bool = False, lease_expires_at: float | None = None) -> None:
        """The attempt ``token`` is over: ``answered`` (its status line came), or not;
        ``timed_out`` unanswered makes the instance silent (``lease_expires_at`` is its
        lease as the gateway knows it, so that a renewal ends the silence)."""
        now = self._clock()
        with self._lock:
            waiting = self._waiting.get(instance_pk)
            started = waiting.pop(token, now) if waiting is not None else now
            if waiting is not None and not waiting:
                del self._waiting[instance_pk]
            if answered:
                self._answered[instance_pk] = now
                self._silent.pop(instance_pk, None)
            elif timed_out and instance_pk not in self._silent and \
                    self._answered.get(instance_pk, float("-inf")) < started:
                self._silent[instance_pk] = (started, lease_expires_at)

    def unanswered(self, instance_pk: int, lease_expires_at: float | None = None) -> bool:
        """Whether the instance leaves calls unanswered (see the class docstring)."""
        if instance_pk not in self._waiting and instance_pk not in self._silent:
            return False  # the common case, without the lock
        now = self._clock()
        with self._lock:
            answered = self._answered.get(instance_pk, float("-inf"))
            silent = self._silent.get(instance_pk)
            if silent is not None:
                since, lease = silent
                if lease is None or lease_expires_at is None:
                    holds = now - since < UNANSWERED_HOLD_S
                else:
                    holds = lease_expires_at <= lease  # not renewed since
                if holds and answered < since:
                    return True
                del self._silent[instance_pk]
            waiting = self._waiting.get(instance_pk)
            if not waiting:
                return False
            oldest = next(iter(waiting.values()))
            return now - oldest > self.patience_s(instance_pk) and answered < oldest

    def patience_s(self, instance_pk: int) -> float:
        """How long an attempt may wait unanswered before the instance is suspect: the
        larger of ``UNANSWERED_FLOOR_S`` and ``UNANSWERED_FACTOR`` x its usual latency."""
        latency = self._latency.get(instance_pk)
        return UNANSWERED_FLOOR_S if latency is None else max(
            UNANSWERED_FLOOR_S, UNANSWERED_FACTOR * latency / 1000)

    def record(self, instance_pk: int, *, ok: bool, latency_ms: float) -> None:
        a = self._alpha
        self.observed = True
        now = self._clock()
        with self._lock:
            s = self._success_at(instance_pk, now)
            self._success[instance_pk] = ((1 - a) * s + a * (1.0 if ok else 0.0), now)
            if ok:
                lat = self._latency.get(instance_pk)
                self._latency[instance_pk] = latency_ms if lat is None else (
                    (1 - a) * lat + a * latency_ms
                )

    def success(self, instance_pk: int) -> float:
        return self._success_at(instance_pk, self._clock())

    def _success_at(self, instance_pk: int, now: float) -> float:
        """The success rate, its failures forgotten over time (``SUCCESS_MEMORY_S``): only
        calls raised it again, and one ranked low gets few, so a burst of failures left an
        instance with 1 % of the traffic for minutes after it had recovered (a break
        test)."""
        found = self._success.get(instance_pk)
        if found is None:
            return 1.0
        rate, at = found
        if rate >= 1.0:
            return rate
        return 1.0 - (1.0 - rate) * math.exp((at - now) / SUCCESS_MEMORY_S)

    def latency(self, instance_pk: int) -> float | None:
        return self._latency.get(instance_pk)


# ---- filters: each returns a reason, or None to keep --------------------------------------


def version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _granted(table: RouteTable, tenant_pk: int, agent: AgentEntry,
             capability: CapabilityEntry) -> bool:
    """Whether the tenant holds a grant on the agent or on the capability, accepted for
    this capability id."""
    return any(
        g.tenant_pk == tenant_pk and (g.agent_pk == agent.pk or g.capability_pk == capability.pk)
        and capability.capability_id in g.capability_ids
        for g in table.grants_by_tenant.get(tenant_pk, ())
    )


def _trusted(table: RouteTable, tenant_pk: int, agent: AgentEntry,
             capability: CapabilityEntry) -> bool:
    """The tenant's own agent, or one it holds a grant on."""
    return agent.owner_tenant_pk == tenant_pk or _granted(table, tenant_pk, agent, capability)


_INVISIBLE = frozenset({"not_granted", "namespace"})


# Another tenant's public agent under an id one of the caller's own or granted agents
# offers is never the caller's: not as a rival (a break test: one published under
# another tenant's id with weight 1000 took its calls, inputs and all), nor as the
# fallback while the caller's own are drained or down (the re-test: a deploy of the
# owner's agent handed its calls to whoever had published the same id). Only a call
# that names that agent reaches it.
NOT_OWN = ("not_own", "another tenant's public agent: the tenant's own or granted agents "
           "offer this capability")


def visible_to(table: RouteTable, tenant_pk: int, agent: AgentEntry,
               capability: CapabilityEntry) -> bool:
    """Whether a tenant may know the agent exists: it owns it, holds a grant, or it is public."""
    return (agent.owner_tenant_pk == tenant_pk or agent.visibility == "public"
            or _granted(table, tenant_pk, agent, capability))


def _offered(table: RouteTable, capability_id: str,
             by: Callable[[AgentEntry, CapabilityEntry], bool]) -> bool:
    """Whether some agent offering ``capability_id`` is one ``by`` accepts."""
    for pk in table.agents_by_capability.get(capability_id, ()):
        agent = table.agents.get(pk)
        if agent is None:
            continue
        for capability in agent.capabilities:
            if capability.capability_id == capability_id and by(agent, capability):
                return True
    return False


def capability_visible(table: RouteTable, tenant_pk: int, capability_id: str) -> bool:
    """Whether some agent offering ``capability_id`` is visible to the tenant: otherwise the
    id itself is another tenant's private business and must not be named to this one."""
    return _offered(table, capability_id,
                    lambda agent, capability: visible_to(table, tenant_pk, agent, capability))


def capability_trusted(table: RouteTable, tenant_pk: int, capability_id: str) -> bool:
    """Whether one of the tenant's own or granted agents offers ``capability_id``."""
    return _offered(table, capability_id,
                    lambda agent, capability: _trusted(table, tenant_pk, agent, capability))


def _wrote(text: CapabilityText, agent: AgentEntry) -> bool:
    """Whether ``agent`` is one of those whose words make ``text``."""
    return text.owner in (None, agent.owner_tenant_pk)


def text_trusted(table: RouteTable, tenant_pk: int, text: CapabilityText) -> bool:
    """Whether the text is (in part) written by the tenant's own or granted agents."""
    return _offered(table, text.capability_id, lambda agent, capability: (
        _wrote(text, agent) and _trusted(table, tenant_pk, agent, capability)))


def text_visible(table: RouteTable, tenant_pk: int, text: CapabilityText) -> bool:
    """Whether a tenant's intents are matched against the text: its own or granted
    agents' text; another tenant's text of a public agent only for an id none of its
    own or granted agents offers (a call of that id goes to its own agents, so another
    tenant's words for it must not decide whether, or when, it is chosen)."""
    if text_trusted(table, tenant_pk, text):
        return True
    if text.owner is not None and capability_trusted(table, tenant_pk, text.capability_id):
        return False
    return _offered(table, text.capability_id, lambda agent, capability: (
        _wrote(text, agent) and visible_to(table, tenant_pk, agent, capability)))


def reachable_in(table: RouteTable, request: RouteRequest, agent: AgentEntry,
                 capability: CapabilityEntry) -> bool:
    """Whether the agent's capability is one the request's tenant may call in its
    namespace (it may still be filtered out for the moment: a version, a language)."""
    reason = capability_filter(table, request, agent, capability)
    return reason is None or reason[0] not in _INVISIBLE


def capability_filter(
    table: RouteTable, request: RouteRequest, agent: AgentEntry, capability: CapabilityEntry
) -> tuple[str, str] | None:
    if request.agent and request.agent not in (agent.name, f"{agent.namespace}/{agent.name}"):
        return "not_requested", f"the call names agent {request.agent!r}"
    granted = _granted(table, request.tenant_pk, agent, capability)
    owner = agent.owner_tenant_pk == request.tenant_pk
    if agent.namespace != request.namespace and not granted:
        return "namespace", f"agent is in namespace {agent.namespace!r}; no grant reaches it"
    if not (owner or granted or agent.visibility == "public"):
        return "not_granted", "the tenant has no grant for this agent"
    if agent.internal_only and not ((owner or granted) and request.internal_network):
        return "internal_only", "internal agent: tenant or source network not allowed"
    if request.min_version and version_tuple(capability.version) < version_tuple(
        request.min_version
    ):
        return "version", f"capability version {capability.version} < {request.min_version}"
    reason = language_reason(capability, request.src_lang, request.dest_lang)
    if reason:
        return "language", reason
    if request.input_format and capability.formats and request.input_format not in (
        capability.formats
    ):
        return "format", f"accepts {', '.join(capability.formats)}"
    if (
        request.input_chars is not None
        and capability.max_input_chars is not None
        and request.input_chars > capability.max_input_chars
    ):
        return "input_too_long", f"input of {request.input_chars} chars > max " \
            f"{capability.max_input_chars}"
    return None


def language_reason(capability: CapabilityEntry, src: str | None, dest: str | None) -> str:
    if not (src or dest):
        return ""
    if capability.directions:
        ok = any(
            (not src or d.split("->")[0] == src) and (not dest or d.split("->")[-1] == dest)
            for d in capability.directions
        )
        if not ok:
            return f"no direction {src or '*'}->{dest or '*'} in {', '.join(capability.directions)}"
        return ""
    if capability.languages:
        missing = [x for x in (src, dest) if x and x not in capability.languages]
        if missing:
            return f"language {missing[0]} not in {', '.join(capability.languages)}"
    return ""


def instance_filter(
    instance: InstanceEntry, capability: CapabilityEntry, open_breakers: frozenset[int]
) -> tuple[str, str] | None:
    if instance.state == "unknown":
        return "instance_unknown", "lease lapsed: probe traffic only until it answers"
    if instance.state in ("offline", "draining"):
        return f"instance_{instance.state}", ""
    if not instance.serves(capability.capability_id):
        return "capability_unavailable", "the instance's heartbeat does not list it"
    if instance.health_tier == "sub_healthy":
        return "sub_healthy", "probe traffic only"
    if instance.pk in open_breakers:
        return "circuit_open", ""
    return None


# ---- scoring -----------------------------------------------------------------------------


def lease_reason(instance: InstanceEntry, now: float) -> tuple[str, str] | None:
    """Why a lapsed lease keeps callers away (probes still go), or None while it holds."""
    expires = instance.lease_expires_at
    if expires is None or now < expires + LEASE_SLACK_SECONDS:
        return None
    return ("lease_expired",
            f"lease ran out {now - expires:.1f}s ago: probe traffic only until a heartbeat")


def load_pressure(instance: InstanceEntry) -> float:
    """0.3 cpu + 0.3 memory + 0.4 queue depth (normalised to ``QUEUE_NORM``); 0..1."""
    queue = min(1.0, instance.queue_depth / QUEUE_NORM)
    return 0.3 * min(1.0, instance.cpu) + 0.3 * min(1.0, instance.memory) + 0.4 * queue


def base_score(agent: AgentEntry, instance: InstanceEntry) -> float:
    """Weight (100 = 1.0) x health factor - load pressure. A loaded instance keeps a
    trickle (5 % of its base) so that it is measured again rather than starved."""
    base = agent.weight / 100 * instance.weight_factor
    return max(base * 0.05, base - load_pressure(instance)) if base > 0 else 0.0


def price_of(agent: AgentEntry) -> float:
    return agent.price_per_call + agent.price_input_per_1k + agent.price_output_per_1k


# ---- the router ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Row:
    """One (agent, capability, instance) of a capability id, with what the table alone
    decides: a reason to drop it, else its base score."""

    agent: AgentEntry
    capability: CapabilityEntry
    instance: InstanceEntry | None
    static_reason: tuple[str, str] | None
    base: float


@dataclass
class _Prepared:
    """Per table and capability id: what does not depend on the request."""

    rows: list[_Row] = field(default_factory=list)


class Router:
    def __init__(
        self,
        *,
        feedback: Feedback | None = None,
        open_breakers: Callable[[], Iterable[int]] | None = None,
        index: Callable[[], IntentIndex | None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """``open_breakers`` lists instance pks whose circuit is open (from the gateway);
        ``index`` returns the current intent index (rebuilt in the background);
        ``clock`` is the time in epoch seconds leases are judged by (``time.time``)."""
        self.feedback = feedback or Feedback()
        self._clock = clock or time.time
        self._open_breakers = open_breakers or (lambda: ())
        self._tunnel_up: Callable[[int], bool] = lambda instance_pk: False
        self._index = index or (lambda: None)
        self.balancer = SmoothWeightedRoundRobin()
        self._prepared_for = None
        self._prepared: dict[str, _Prepared] = {}
        self._allowed_cache: dict[tuple, tuple] = {}
        # instance pk -> (the prepared row, the heartbeat applied, the row with it)
        self._live_rows: dict[int, tuple[_Row, object, _Row]] = {}
        self._lock = threading.Lock()

    def intents_current(self) -> bool:
        """Whether the intent index covers the latest route table: a newly registered
        agent's capabilities are found by intent from then on (by id at once)."""
        current = getattr(self._index, "current", None)
        return current is None or current()

    def set_open_breakers(self, open_breakers: Callable[[], Iterable[int]]) -> None:
        self._open_breakers = open_breakers

    def set_tunnel_presence(self, tunnel_up: Callable[[int], bool]) -> None:
        """Whether a tunnelled instance's tunnel is held by some gateway now: only then is
        it routable."""
        self._tunnel_up = tunnel_up

    # -- candidates of one capability id, cached per table
    def _rows(self, table: RouteTable, capability_id: str) -> _Prepared:
        if self._prepared_for is not table:
            with self._lock:
                if self._prepared_for is not table:
                    self._prepared, self._prepared_for = {}, table
        prepared = self._prepared.get(capability_id)
        if prepared is None:
            prepared = _Prepared()
            for agent_pk in table.agents_by_capability.get(capability_id, ()):
                agent = table.agents[agent_pk]
                cap = next(c for c in agent.capabilities if c.capability_id == capability_id)
                if not agent.instances:
                    prepared.rows.append(_Row(agent, cap, None, ("no_instances", ""), 0.0))
                for instance in agent.instances:
                    reason = instance_filter(instance, cap, frozenset())
                    base = base_score(agent, instance) if reason is None else 0.0
                    if reason is None and base <= 0:
                        reason = ("zero_weight",
                                  f"state {instance.state}, tier {instance.health_tier}")
                    prepared.rows.append(_Row(agent, cap, instance, reason, base))
            self._prepared[capability_id] = prepared
        return prepared

    def match(self, table: RouteTable, request: RouteRequest) -> Match | None:
        """What an intent matches among the capabilities its tenant may see; None while a
        large fleet's first intent index is still being built (``follow``). This is the
        CPU of an intent's decision, and it reads no balancer or breaker state, so the
        gateway runs it off the event loop (``gateway.pipeline``)."""
        index = self._index()
        if index is None:
            return None
        allowed, home = self._allowed(index, table, request.tenant_pk, request.namespace)
        return index.match(request.intent or "",
                           learned=table.learned_by_tenant.get(request.tenant_pk, ()),
                           allowed=allowed, home=home)

    def route(self, table: RouteTable, request: RouteRequest, *, pick: bool = True,
              exclude: frozenset[int] = frozenset(), match: Match | None = None) -> Decision:
        """Decide. ``pick=False`` ranks without advancing the balancer (a dry run);
        ``exclude`` lists instances not to use (those a retry already tried); ``match``,
        the intent's ``match`` when it was worked out already."""
        if request.capability:
            return self._route_capability(table, request, request.capability, (), pick=pick,
                                          exclude=exclude)
        if match is None:
            match = self.match(table, request)
        if match is None:
            return Decision(capability=None, chosen=None, error="service_unavailable")
        # A plan is as sure as the step a call runs, its first (a re-test read a plan's
        # whole-request margin of 0.012 beside needs_confirmation false).
        sure = {"confidence": match.step_confidence[0] if match.plan else match.confidence,
                "margin": match.first_margin if match.plan else match.margin,
                "needs_confirmation": match.ambiguous, "choices": match.choices[:3]}
        # A plan stands though the whole request matches nothing: each part does.
        if not match.ranked and not match.plan:
            return Decision(capability=None, chosen=None, error="no_capability",
                            suggestions=match.suggestions, **sure)
        if match.plan:
            first = self._route_capability(table, request, match.plan[0], match.ranked,
                                           pick=pick, exclude=exclude)
            return Decision(
                capability=match.plan[0], chosen=first.chosen, candidates=first.candidates,
                dropped=first.dropped, matches=match.ranked, plan=match.plan,
                error=first.error, step_confidence=match.step_confidence, **sure,
                others=first.others,
            )
        # The best-matching capability that some instance can serve; the others
        # are reported as dropped with the reason their candidates failed. The way round
        # the best one's outage is only a match as good (within the ambiguity margin):
        # re-tests sent an invoice to a contract reviewer at 0.25 when the invoice
        # capability was drained; and once one of the caller's own or granted
        # capabilities matched, another tenant's is never that way round (its input went
        # to another tenant's public capability, the next match).
        dropped: list[Dropped] = []
        last = None
        own_matched = False
        for score in match.ranked[:5]:
            own = capability_trusted(table, request.tenant_pk, score.capability_id)
            if last is not None and ((own_matched and not own) or score.score
                                     < match.ranked[0].score - AMBIGUITY_MARGIN):
                break
            own_matched = own_matched or own
            decision = self._route_capability(table, request, score.capability_id,
                                              match.ranked, pick=pick, exclude=exclude)
            if decision.chosen is not None or (decision.candidates and not pick):
                return Decision(
                    capability=decision.capability, chosen=decision.chosen,
                    candidates=decision.candidates, dropped=(*dropped, *decision.dropped),
                    matches=match.ranked, covered=match.covered, **sure,
                    others=decision.others,
                )
            dropped.extend(decision.dropped)
            last = decision
        return Decision(
            capability=match.ranked[0].capability_id, chosen=None, dropped=tuple(dropped),
            matches=match.ranked, error=last.error if last else "no_capability", **sure,
        )

    def _allowed(self, index: IntentIndex, table: RouteTable, tenant_pk: int,
                 namespace: str):
        """The index slots of the capabilities the tenant may see in ``namespace``, and
        of those it owns or was granted (None when that is all it sees: nothing to
        prefer), worked out once per index, agents, grants, tenant and namespace (a
        registration or a grant makes new ones). A capability offered only in another
        namespace, and not granted, is no match (helper-48: it was chosen, then 404'd
        with no suggestions)."""
        key = (id(index), id(table.agents), id(table.grants), tenant_pk, namespace)
        found = self._allowed_cache.get(key)
        if found is None:
            if len(self._allowed_cache) >= ALLOWED_CACHE:
                self._allowed_cache.clear()

            def reachable(text: CapabilityText) -> bool:
                return _offered(table, text.capability_id, lambda agent, capability: (
                    agent.namespace == namespace
                    or _granted(table, tenant_pk, agent, capability)))

            mask = index.allowed_slots(
                lambda text: text_visible(table, tenant_pk, text) and reachable(text))
            home = index.allowed_slots(
                lambda text: text_trusted(table, tenant_pk, text) and reachable(text))
            if np.array_equal(home, mask):
                home = None
            # The objects are kept with the masks, so their ids are not reused meanwhile.
            found = self._allowed_cache[key] = (mask, home, index, table.agents,
                                                table.grants)
        return found[0], found[1]

    def _route_capability(self, table, request, capability_id, matches, *, pick,
                          exclude: frozenset[int] = frozenset()) -> Decision:
        prepared = self._rows(table, capability_id)
        if not prepared.rows:
            return Decision(capability=capability_id, chosen=None, matches=tuple(matches),
                            error="no_capability")
        match_score = next((s.score for s in matches if s.capability_id == capability_id), 1.0)
        open_breakers = frozenset(self._open_breakers()) | exclude
        now = self._clock()
        explain = not pick
        dropped: list[Dropped] = []
        kept: list[_Row] = []
        agent_reason: dict[int, tuple[str, str] | None] = {}
        instance_reasons: set[str] = set()  # why instances of offered agents were dropped
        has_own: bool | None = None  # one of the caller's own or granted agents offers it
        live = table.live
        for row in prepared.rows:
            if live and row.instance is not None and row.instance.pk in live:
                row = self._with_live_load(table, row)
            agent = row.agent
            reason = agent_reason.get(agent.pk, False)
            if reason is False:
                reason = agent_reason[agent.pk] = capability_filter(
                    table, request, agent, row.capability)
            if reason is None:
                reason = row.static_reason
            if reason is None and not request.agent and not _trusted(
                    table, request.tenant_pk, agent, row.capability):
                if has_own is None:
                    has_own = capability_trusted(table, request.tenant_pk, capability_id)
                if has_own:  # the agent's, like the filters' (not its instance's)
                    reason = agent_reason[agent.pk] = NOT_OWN
            if reason is None:  # time-dependent, so never cached with the table
                reason = lease_reason(row.instance, now)
            if reason is None and row.instance.pk in open_breakers:
                reason = ("circuit_open", "")
            if reason is None and row.instance.reach_mode == "tunnel" and \
                    not self._tunnel_up(row.instance.pk):
                reason = ("tunnel_down", "no gateway holds the instance's tunnel now")
            if reason is None:
                kept.append(row)
            elif agent_reason[agent.pk] is None:
                instance_reasons.add(reason[0])
            if reason is not None and explain and (reason[0] not in _INVISIBLE or visible_to(
                    table, request.tenant_pk, agent, row.capability)):
                # A dry run explains only agents the caller may see: another tenant's
                # private agent is never named, not even as dropped.
                dropped.append(Dropped(agent.name, capability_id, reason[0], reason[1],
                                       row.instance.pk if row.instance else None))
        if len(kept) > 1:
            kept = self._prefer_answering(kept, capability_id, dropped if explain else None)
        if not kept:
            if not explain:  # say why, in full, only when there is nothing to route to
                return self._route_capability(table, request, capability_id, matches,
                                              pick=False, exclude=exclude)
            # Every candidate failed a capability-level check: the capability is not
            # offered to this caller; otherwise instances exist but none is healthy.
            agent_level = all(agent_reason[r.agent.pk] is not None for r in prepared.rows)
            # Every instance left out only because its breaker is open: say so (the
            # metrics' circuit_open reason), rather than "none healthy".
            error = "no_capability" if agent_level else "circuit_open" \
                if instance_reasons == {"circuit_open"} else "no_healthy_instance"
            return Decision(capability=capability_id, chosen=None, dropped=tuple(dropped),
                            matches=tuple(matches), error=error)

        if pick and request.prefer_instance is not None:
            preferred = [r for r in kept if r.instance.pk == request.prefer_instance]
            if preferred:
                return Decision(capability=capability_id,
                                chosen=self._candidate(preferred[0],
                                                       self._weights(preferred)[0],
                                                       match_score),
                                matches=tuple(matches), others=len(kept) - 1)
        if pick and len(kept) == 1 and request.cost_preference != "cheapest":
            # One candidate: nothing to rank or balance.
            only = kept[0]
            weight = self._weights(kept)[0]
            return Decision(capability=capability_id,
                            chosen=self._candidate(only, weight, match_score),
                            matches=tuple(matches))
        weights = self._weights(kept)
        tier = min(r.agent.priority for r in kept)
        pool = [i for i, r in enumerate(kept) if r.agent.priority == tier]
        if request.cost_preference == "cheapest":
            cheapest = min(price_of(kept[i].agent) for i in pool)
            if explain:
                for i in pool:
                    if price_of(kept[i].agent) > cheapest:
                        r = kept[i]
                        dropped.append(Dropped(r.agent.name, capability_id, "not_cheapest",
                                               f"price {price_of(r.agent)} > {cheapest}",
                                               r.instance.pk))
            pool = [i for i in pool if price_of(kept[i].agent) == cheapest]
        if explain:
            for r in kept:
                if r.agent.priority != tier:
                    dropped.append(Dropped(r.agent.name, capability_id, "lower_priority",
                                           f"priority {r.agent.priority} waits for tier {tier}",
                                           r.instance.pk))
            candidates = [self._candidate(r, w, match_score) for r, w in zip(kept, weights,
                                                                             strict=True)]
            ranked = tuple(sorted(candidates, key=lambda c: (-c.score, c.instance.pk)))
            return Decision(capability=capability_id, chosen=None, candidates=ranked,
                            dropped=tuple(dropped), matches=tuple(matches))
        chosen = self._pick(capability_id, [kept[i] for i in pool], [weights[i] for i in pool])
        return Decision(capability=capability_id,
                        chosen=self._candidate(chosen[0], chosen[1], match_score),
                        matches=tuple(matches), others=len(kept) - 1)

    def _with_live_load(self, table: RouteTable, row: _Row) -> _Row:
        """``row`` with the load and lease of a heartbeat newer than the table's version.

        Rebuilt only when that heartbeat (or the row) changed, not on every call."""
        report = table.live[row.instance.pk]
        cached = self._live_rows.get(row.instance.pk)
        if cached is not None and cached[0] is row and cached[1] is report:
            return cached[2]
        current = table.current(row.instance)
        fresh = row if current is row.instance else _Row(
            row.agent, row.capability, current, row.static_reason,
            base_score(row.agent, current) if row.base else 0.0)
        self._live_rows[row.instance.pk] = (row, report, fresh)
        return fresh

    def _prefer_answering(self, kept: list[_Row], capability_id: str,
                          dropped: list[Dropped] | None) -> list[_Row]:
        """``kept`` without the instances that leave calls unanswered, unless that would
        leave nobody (see ``Feedback``)."""
        unanswered = self.feedback.unanswered
        answering = [r for r in kept
                     if not unanswered(r.instance.pk, r.instance.lease_expires_at)]
        if not answering or len(answering) == len(kept):
            return kept
        if dropped is not None:
            kept_ids = {id(r) for r in answering}
            for r in kept:
                if id(r) not in kept_ids:
                    dropped.append(Dropped(r.agent.name, capability_id, "unanswered",
                                           "leaves calls unanswered: the others first",
                                           r.instance.pk))
        return answering

    def _weights(self, kept: list[_Row]) -> list[tuple[float, float, float]]:
        """``(score, success_factor, latency_factor)`` per kept row."""
        feedback = self.feedback
        if not feedback.observed:
            return [(r.base, 1.0, 1.0) for r in kept]
        latencies = [feedback.latency(r.instance.pk) for r in kept]
        known = [x for x in latencies if x]
        fastest = min(known) if known else None
        out = []
        for row, latency in zip(kept, latencies, strict=True):
            success = max(0.05, feedback.success(row.instance.pk))
            latency_factor = (fastest / latency) ** 0.5 if (latency and fastest) else 1.0
            out.append((row.base * success * latency_factor, success, latency_factor))
        return out

    @staticmethod
    def _candidate(row: _Row, weight: tuple[float, float, float], match: float) -> Candidate:
        instance = row.instance
        return Candidate(
            agent=row.agent, capability=row.capability, instance=instance, match=match,
            health_factor=instance.weight_factor, load_pressure=load_pressure(instance),
            success_factor=weight[1], latency_factor=weight[2], score=weight[0],
        )

    def _pick(self, capability_id: str, pool: list[_Row],
              weights: list[tuple[float, float, float]]) -> tuple[_Row, tuple]:
        split = [r for r in pool if r.agent.traffic_percent]
        if split and len(split) < len(pool):
            # A/B: first choose the side by the declared shares, then an instance.
            shares: dict[object, int] = {("agent", r.agent.pk): r.agent.traffic_percent
                                         for r in split}
            shares["rest"] = max(1, 100 - sum(shares.values()))
            side = self.balancer.pick(("split", capability_id, tuple(sorted(shares, key=str))),
                                      list(shares.items()))
            keep = [(not r.agent.traffic_percent) if side == "rest" else r.agent.pk == side[1]
                    for r in pool]
            pool = [r for r, k in zip(pool, keep, strict=True) if k]
            weights = [w for w, k in zip(weights, keep, strict=True) if k]
        entries = [(r.instance.pk, max(1, round(w[0] * WEIGHT_SCALE)))
                   for r, w in zip(pool, weights, strict=True)]
        key = (capability_id, tuple(pk for pk, _ in entries))
        chosen_pk = self.balancer.pick(key, entries)
        for row, weight in zip(pool, weights, strict=True):
            if row.instance.pk == chosen_pk:
                return row, weight
        raise AssertionError("the balancer picked an instance outside the pool")


# ---- the intent index, built from a table --------------------------------------------------


def capability_texts(table: RouteTable) -> dict[str, CapabilityText]:
    """The texts of every capability id, by key (see ``capability_text``). Read from
    ``agents_by_capability``: the table is indexed."""
    return {text.key: text for cid in table.agents_by_capability
            for text in capability_text(table, cid)}


def capability_text(table: RouteTable, capability_id: str) -> list[CapabilityText]:
    """The texts of one capability id, none when no agent offers it. One tenant's agents
    offering the same id pool their words; when several tenants offer it, each tenant's
    agents make a text of their own (``owner``), so no tenant's hints steer another's
    routing. Agents pool in the order of their pks (``agents_by_capability``'s), so a
    text depends on who offers it, not on the order their entries reached the table."""
    by_owner: dict[int, list[CapabilityEntry]] = {}
    for pk in table.agents_by_capability.get(capability_id, ()):
        agent = table.agents[pk]
        by_owner.setdefault(agent.owner_tenant_pk, []).extend(
            cap for cap in agent.capabilities if cap.capability_id == capability_id)
    shared = len(by_owner) > 1
    return [_pooled(capability_id, caps, owner if shared else None)
            for owner, caps in by_owner.items() if caps]


def _pooled(capability_id: str, caps: list[CapabilityEntry], owner: int | None
            ) -> CapabilityText:
    return CapabilityText(
        capability_id,
        next((c.display_name for c in caps if c.display_name), ""),
        " ".join(d for d in dict.fromkeys(c.description for c in caps) if d),
        tuple(dict.fromkeys(k for c in caps for k in c.keywords)),
        any(c.directions for c in caps),
        examples=tuple(dict.fromkeys(e for c in caps for e in c.examples)),
        not_for=tuple(dict.fromkeys(n for c in caps for n in c.not_for)),
        owner=owner,
    )


def changed_agents(before: Mapping[int, AgentEntry],
                   after: Mapping[int, AgentEntry]) -> set[int]:
    """The pks of the agents added, replaced or removed. A new table shares the entries
    it did not change with the old one, so identity tells: pointer compares only."""
    if before is after:
        return set()
    changed = {pk for pk, agent in after.items() if before.get(pk) is not agent}
    added = sum(1 for pk in changed if pk not in before)
    if len(before) > len(after) - added:  # some were removed
        changed.update(pk for pk in before if pk not in after)
    return changed


def capabilities_of(agent_pks, before: RouteTable, after: RouteTable) -> set[str]:
    """The capability ids the agents ``agent_pks`` offered in ``before`` or offer in
    ``after``: the texts their change may have moved."""
    return {cap.capability_id for pk in agent_pks
            for agent in (before.agents.get(pk), after.agents.get(pk)) if agent is not None
            for cap in agent.capabilities}


def touched_capabilities(before: RouteTable, after: RouteTable) -> set[str]:
    """The capability ids whose text may differ between the tables: those the changed
    agents offered or offer."""
    return {
        cap.capability_id
        for pk in changed_agents(before.agents, after.agents)
        for agent in (before.agents.get(pk), after.agents.get(pk)) if agent is not None
        for cap in agent.capabilities
    }


# Tenants x table versions whose visible-capability masks a router keeps.
ALLOWED_CACHE = 256
SYNC_FIRST_BUILD_MAX = 1000  # capability ids: about 0.1 s to index by words
# With the sentence encoder each capability is some five texts to embed (about 1 ms each).
SYNC_FIRST_BUILD_MAX_EMBEDDED = 100


class IntentIndexHolder:
    """Keeps the intent index of the latest table: a change re-reads only the capability
    ids the changed agents touch, and updates the index for the texts that changed, so
    its cost is that agent's, not the fleet's; a heartbeat's state change costs nothing.

    ``follow`` updates in a background thread, latest table wins, so neither the
    bus nor a caller waits for an update; until it lands, calls match against the
    previous index and resolve candidates from the current table.
    """

    def __init__(self, **index_kwargs) -> None:
        self._kwargs = index_kwargs
        self._table: RouteTable | None = None
        self.index: IntentIndex | None = None
        self._lock = threading.Lock()  # guards _latest and _pending
        self._update_lock = threading.Lock()
        self._pending: frozenset[int] | None = frozenset()
        self._latest: RouteTable | None = None
        self._wake = threading.Event()
        self._after_first: Callable[[], None] | None = None

    def follow(self, subscriber, *, after_first: Callable[[], None] | None = None) -> None:
        """Keep up with ``subscriber``'s table. A small first index is built at once; a
        large one (1 s at 10,000 capabilities) in the background, so a gateway serves
        calls that name their capability at once, and intent calls answer 503 with
        Retry-After until the index is there. ``after_first`` runs once the first index
        exists (the process gives back the memory its build freed)."""
        self._after_first = after_first
        limit = SYNC_FIRST_BUILD_MAX_EMBEDDED if self._kwargs.get("embedder") \
            else SYNC_FIRST_BUILD_MAX
        if len(subscriber.table.agents_by_capability) <= limit:
            self.update(subscriber.table)
        else:
            self._schedule(subscriber.table)
        subscriber.on_change(self._schedule)
        threading.Thread(target=self._rebuild_loop, name="intent-index", daemon=True).start()

    def _schedule(self, table: RouteTable) -> None:
        # Every table passes here in order, the update loop takes the latest: the agents
        # changed meanwhile are gathered for it (None: not known, compare the tables).
        with self._lock:
            changed = table.changed_agents
            self._pending = None if changed is None or self._pending is None \
                else self._pending | changed
            self._latest = table
        self._wake.set()

    def _rebuild_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                table, changed = self._latest, self._pending
                self._pending = frozenset()
            if table is not None:
                self.update(table, changed)

    def update(self, table: RouteTable, changed: frozenset[int] | None = None) -> None:
        """Index ``table``'s texts: only those of the ``changed`` agents' capabilities when
        given (the cost of those agents), else those the tables' agents differ in."""
        with self._update_lock:
            if self.index is None:
                self.index = IntentIndex(list(capability_texts(table).values()), **self._kwargs)
                after, self._after_first = self._after_first, None
                if after is not None:
                    after()
            else:
                # Only ids the changed agents touch; updated() skips texts that came out
                # the same (a change of weight or instances, a heartbeat's state).
                touched = touched_capabilities(self._table, table) if changed is None \
                    else capabilities_of(changed, self._table, table)
                texts = [t for cid in touched for t in capability_text(table, cid)]
                keys = {t.key for t in texts}
                self.index = self.index.updated(texts, [
                    key for cid in touched for key in self.index.keys_of(cid)
                    if key not in keys])
            self._table = table

    def __call__(self) -> IntentIndex | None:
        return self.index

    def current(self) -> bool:
        """The index is built from the latest table this holder was given."""
        with self._lock:
            latest = self._latest
        return self.index is not None and (latest is None or self._table is latest)
