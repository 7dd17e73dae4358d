"""Asynchronous tasks in the data plane: the ``/v1/tasks`` doors and the engine that runs
tasks through the same call pipeline as synchronous calls.

The task table is the truth (``TaskStore``, implemented over the control plane's database
by ``reach_platform.task_store``): a submission is answered 202 only once its row is
committed; an engine claims due rows with a conditional update and a lease, renews the
lease while it runs them, and writes each attempt's outcome back under its claim. Rings
(``TaskEngine.ring``) only shorten the wait; a lost ring costs a poll interval.

One attempt is one pipeline call: routing (back to the same instance for a continuation,
while it is alive), adapters, the deadline, the one retry, breakers, budgets and one usage
event. Every attempt carries the task's Idempotency-Key, so after a worker died an agent
that already had the call can tell the repeat, and ``X-Reach-Task-Id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from gateway.http_io import parse_json, sse_headers
from reach_core.errors import ReachError
from reach_core.kinds import FINAL_TASK_STATES, TaskState

logger = logging.getLogger(__name__)

TASK_STATES = frozenset(TaskState)


@dataclass(frozen=True)
class TaskRef:
    """What an attempt tells the agent about its task: the id (``X-Reach-Task-Id``), the
    agent's own task and context ids (A2A), and where to push status (A2A)."""

    task_id: str
    agent_task_id: str = ""
    agent_context_id: str = ""
    push_url: str = ""
    push_token: str = ""


@dataclass(frozen=True)
class Submission:
    tenant_pk: int
    request_id: str
    request: dict  # {"body": the invoke body, "namespace": ..., "internal": bool}
    capability: str
    fingerprint: str
    idempotency_key: str | None
    callback_url: str
    signing_secret: str


@dataclass(frozen=True)
class TaskClaim:
    """A claimed task, as the engine needs it."""

    task_id: str
    claim: str
    tenant_pk: int
    request: dict
    request_id: str
    idempotency_key: str
    attempt: int
    messages: tuple = ()
    instance_pk: int | None = None
    agent_task_id: str = ""
    agent_context_id: str = ""
    push_url: str = ""
    push_token: str = ""


@dataclass(frozen=True)
class TaskOutcome:
    state: str
    result: dict | None = None
    error: dict | None = None
    message: str = ""
    capability: str = ""
    agent_pk: int | None = None
    instance_pk: int | None = None
    agent_task_id: str = ""
    agent_context_id: str = ""
    retry_after_s: float | None = None
    # False when the failure came before any agent was called (no healthy instance, an
    # open breaker, a limit): such a try is not one of the task's attempts.
    reached_agent: bool = True


LIST_PARAMETERS = ("state", "limit", "offset")


class TaskStore(Protocol):
    """The task table. Every method raises ``ReachError`` for what the caller must hear
    (``not_found``, ``conflict``, ``idempotency_key_reused``, ``service_unavailable``)."""

    async def submit(self, submission: Submission) -> tuple[dict, bool]: ...
    async def get(self, tenant_pk: int, task_id: str) -> dict: ...
    async def list(self, tenant_pk: int, state: str | None, limit: int, offset: int
                   ) -> tuple[list[dict], int]: ...
    async def cancel(self, tenant_pk: int, task_id: str) -> dict: ...
    async def add_message(self, tenant_pk: int, task_id: str, message: dict) -> dict: ...
    async def events_after(self, tenant_pk: int, task_id: str, after: int
                           ) -> tuple[list[dict], str]: ...
    async def claim(self, worker: str, limit: int) -> list[TaskClaim]: ...
    async def renew(self, worker: str, task_ids: list[str]) -> set[str]: ...
    async def finish(self, claim: TaskClaim, outcome: TaskOutcome) -> bool: ...


# ---- the doors --------------------------------------------------------------------------

MAX_PAGE = 1000
EVENTS_POLL_S = 0.5
EVENTS_KEEPALIVE_S = 15.0
EVENTS_MAX_S = 3600.0


class TaskDoors:
    """``/v1/tasks`` for callers: their tenant's tasks only (another tenant's id is 404).
    ``rings`` tell the workers work is due (a hint: they poll anyway)."""

    def __init__(self, store: TaskStore,
                 rings: Sequence[Callable[[], Awaitable[None]]] = ()) -> None:
        self.store = store
        self.rings = list(rings)
        self._ringing: set[asyncio.Future] = set()

    async def submitted(self, submission: Submission) -> tuple[dict, bool]:
        task, created = await self.store.submit(submission)
        if created:
            self._ring_soon()
        return task, created

    def _ring_soon(self) -> None:
        # The answer does not wait for the doorbell (a slow Redis would hold it).
        ringing = asyncio.ensure_future(self._ring_quietly())
        self._ringing.add(ringing)
        ringing.add_done_callback(self._ringing.discard)

    async def _ring_quietly(self) -> None:
        for ring in self.rings:
            try:
                await ring()
            except Exception as exc:  # the workers' poll finds it a moment later
                logger.warning("task doorbell failed (%s)", type(exc).__name__)

    async def get(self, tenant_pk: int, task_id: str) -> dict:
        return await self.store.get(tenant_pk, task_id)

    async def list(self, tenant_pk: int, given: dict[str, list[str]]) -> dict:
        """A page of the tenant's tasks. ``given``: the query's parameters, each a list of
        its values; one not known, or given twice, is a 400 (a filter silently ignored,
        or the last of two winning, reads as one applied)."""
        odd = {name: [f"not a parameter here; use {', '.join(LIST_PARAMETERS)}"]
               for name in given if name not in LIST_PARAMETERS}
        odd.update({name: ["give it once"] for name, values in given.items()
                    if name in LIST_PARAMETERS and len(values) > 1})
        if odd:
            raise ReachError("invalid_input", f"Unusable query parameters: "
                             f"{', '.join(sorted(odd))}.", details=odd)
        query = {name: values[0] for name, values in given.items()}
        state = query.get("state")
        if state is not None and state not in TASK_STATES:
            raise ReachError("invalid_input", "'state' must be one of "
                             f"{', '.join(sorted(str(s) for s in TASK_STATES))}.",
                             details={"state": ["not a task state"]})
        limit = _bounded_int(query, "limit", 100, 1, MAX_PAGE)
        offset = _bounded_int(query, "offset", 0, 0, 10**9)
        tasks, count = await self.store.list(tenant_pk, state, limit, offset)
        return {"count": count, "limit": limit, "offset": offset, "results": tasks}

    async def cancel(self, tenant_pk: int, task_id: str) -> dict:
        return await self.store.cancel(tenant_pk, task_id)

    async def message(self, tenant_pk: int, task_id: str, raw: bytes) -> dict:
        body = parse_json(raw)
        given = body.get("input")
        if not isinstance(given, dict):
            raise ReachError("invalid_input", "'input' must be a JSON object: the answer the "
                             "agent asked for.", details={"input": ["must be an object"]})
        task = await self.store.add_message(tenant_pk, task_id, {"input": given})
        self._ring_soon()
        return task

    async def events(self, tenant_pk: int, task_id: str, request_id: str, receive, send,
                     clock: Callable[[], float] = time.monotonic) -> None:
        """Stream the task's state changes as SSE (``event: state``), from the first, until
        the task is final or the caller goes away; a comment every 15 s keeps idle
        proxies from closing it."""
        events, state = await self.store.events_after(tenant_pk, task_id, 0)
        await send({"type": "http.response.start", "status": 200,
                    "headers": sse_headers(request_id)})
        gone = asyncio.ensure_future(_disconnected(receive))
        started = last_sent = clock()
        after = 0
        try:
            while True:
                if events:
                    after = events[-1]["seq"]
                    await send({"type": "http.response.body", "more_body": True, "body": b"".join(
                        b"event: state\ndata: " + orjson.dumps({"task_id": task_id, **e})
                        + b"\n\n" for e in events)})
                    last_sent = clock()
                # None: the task is gone (its tenant was deleted meanwhile).
                if state is None or state in FINAL_TASK_STATES or \
                        clock() - started > EVENTS_MAX_S:
                    break
                if clock() - last_sent >= EVENTS_KEEPALIVE_S:
                    await send({"type": "http.response.body", "body": b": keep-alive\n\n",
                                "more_body": True})
                    last_sent = clock()
                done, _ = await asyncio.wait({gone}, timeout=EVENTS_POLL_S)
                if done:
                    return
                try:
                    events, state = await self.store.events_after(tenant_pk, task_id, after)
                except ReachError as error:  # the database went away: say so, and end
                    await send({"type": "http.response.body", "more_body": True,
                                "body": error.sse_event(request_id)})
                    break
            await send({"type": "http.response.body", "body": b""})
        finally:
            gone.cancel()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _bounded_int(query: dict, name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ReachError("invalid_input", f"'{name}' must be an integer from {low} to {high}.",
                         details={name: ["out of range"]})
    return int(raw)


def task_path(path: str) -> tuple[str, str] | None:
    """``/v1/tasks/<id>[/<action>]`` as ``(id, action)`` (action "" for the task itself),
    None for any other path."""
    rest = path[len("/v1/tasks/"):] if path.startswith("/v1/tasks/") else None
    if not rest:
        return None
    task_id, _, action = rest.partition("/")
    if not task_id or "/" in action or action not in ("", "events", "cancel", "messages"):
        return None
    return task_id, action


# ---- the engine -------------------------------------------------------------------------

# Failures after which an attempt is worth repeating later: nothing was wrong with the
# request, and the agent gets the same key if it did see the call.
RETRY_LATER = frozenset({"no_healthy_instance", "circuit_open", "rate_limited", "upstream_busy",
                         "overloaded", "service_unavailable", "idempotency_unavailable",
                         "upstream_error", "upstream_timeout"})
RETRY_CAP_S = 60.0
# Refusals made before any agent is called (or by an agent that took no work): retried
# until the task's deadline without using up its attempts. A breaker open for 30 s must
# not fail every task queued behind it.
NOT_REACHED = frozenset({"no_healthy_instance", "circuit_open", "rate_limited",
                         "upstream_busy", "overloaded", "service_unavailable",
                         "idempotency_unavailable"})


@dataclass(frozen=True)
class EngineSettings:
    """A process that runs tasks: its name in claims, how many at once, the lease."""

    worker: str
    concurrency: int = 64
    lease_s: float = 15.0
    wakeups: Callable[[], AsyncIterator[object]] | None = None


@dataclass
class _Running:
    claim: TaskClaim
    job: asyncio.Future
    lost: bool = False  # its claim is gone: stopped on purpose, nothing to record


@dataclass
class TaskEngine:
    """Runs due tasks, at most ``concurrency`` at once, in the event loop it is started in.

    ``attempt(claim)`` runs one attempt and returns its outcome (``TaskRunner.attempt``);
    the engine claims, renews leases every third of ``lease_s`` and writes outcomes."""

    store: TaskStore
    attempt: Callable[[TaskClaim], Awaitable[TaskOutcome]]
    worker: str
    concurrency: int = 64
    lease_s: float = 15.0
    poll_s: float = 1.0
    # Rings from other processes (Redis pub/sub), each one a reason to claim now.
    wakeups: Callable[[], AsyncIterator[object]] | None = None
    _running: dict[str, _Running] = field(default_factory=dict)
    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def ring(self) -> None:
        """Work may be due: claim now rather than at the next poll. From any thread."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(wake.set)

    @property
    def running(self) -> int:
        return len(self._running)

    async def run_forever(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        helpers = [asyncio.ensure_future(self._renew_forever())]
        if self.wakeups is not None:
            helpers.append(asyncio.ensure_future(self._listen()))
        try:
            while True:
                await self._claim_and_start()
                await self._wait()
        finally:
            for helper in helpers:
                helper.cancel()
            jobs = [r.job for r in self._running.values()]
            for job in jobs:
                job.cancel()
            await asyncio.gather(*jobs, return_exceptions=True)

    async def _claim_and_start(self) -> None:
        free = self.concurrency - len(self._running)
        if free <= 0:
            return
        try:
            claims = await self.store.claim(self.worker, free)
        except Exception as exc:  # the database away: try again at the next poll
            logger.warning("task engine: claiming failed (%s)", type(exc).__name__)
            return
        for claim in claims:
            self._running[claim.task_id] = _Running(
                claim, asyncio.ensure_future(self._run(claim)))

    async def _wait(self) -> None:
        self._wake.clear()
        waiters = {asyncio.ensure_future(self._wake.wait())}
        if len(self._running) >= self.concurrency:  # full: a free slot is what matters
            waiters = {r.job for r in self._running.values()}
        try:
            await asyncio.wait(waiters, timeout=self.poll_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                if waiter not in {r.job for r in self._running.values()}:
                    waiter.cancel()

    async def _run(self, claim: TaskClaim) -> None:
        try:
            try:
                outcome = await self.attempt(claim)
            except asyncio.CancelledError:
                running = self._running.get(claim.task_id)
                if running is not None and running.lost:
                    return  # stopped by ``_renew_forever``: the task is not ours now
                raise  # the engine is stopping: the lease lapses and another runs it
            except Exception:
                logger.exception("task %s: attempt failed", claim.task_id)
                outcome = TaskOutcome(state=TaskState.FAILED, error={
                    "code": "internal_error", "message": "the task's attempt failed in the "
                    "platform; it has been logged"})
            await self._finish(claim, outcome)
        finally:
            self._running.pop(claim.task_id, None)
            if self._wake is not None:
                self._wake.set()  # a slot is free

    async def _finish(self, claim: TaskClaim, outcome: TaskOutcome) -> None:
        # The database may be away for a moment: the outcome is worth a few tries before
        # the lease lapses and the task is run again.
        for pause in (0.0, 0.5, 1.0, 2.0, 4.0):
            await asyncio.sleep(pause)
            try:
                if not await self.store.finish(claim, outcome):
                    logger.info("task %s: claim lost before the attempt finished "
                                "(canceled, or handed on)", claim.task_id)
                return
            except Exception as exc:
                logger.warning("task %s: recording the outcome failed (%s)", claim.task_id,
                               type(exc).__name__)

    async def _listen(self) -> None:
        async for _ in self.wakeups():
            self._wake.set()

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            ids = list(self._running)
            if not ids:
                continue
            try:
                held = await self.store.renew(self.worker, ids)
            except Exception as exc:  # a missed renewal shortens the lease, no more
                logger.warning("task engine: renewing leases failed (%s)",
                               type(exc).__name__)
                continue
            for task_id in ids:
                running = self._running.get(task_id)
                if task_id not in held and running is not None:
                    # Canceled, or handed on after a lapsed lease: its attempt is no
                    # longer wanted. Stopped, its agent's connection is dropped (the
                    # work stops) and the attempt is metered client_cancelled.
                    logger.info("task %s: claim gone (canceled, or handed on); "
                                "stopping its attempt", task_id)
                    running.lost = True
                    running.job.cancel()


def retry_after(error: ReachError, attempt: int) -> float:
    """How long to wait before running a task again after ``error`` on ``attempt``."""
    backoff = min(RETRY_CAP_S, 2.0 ** attempt)
    return float(max(error.retry_after or 0, backoff))


def outcome_of_state(state: str | None) -> str:
    """The task state an agent's answer leaves the task in: its own A2A state, or
    completed. An agent that says it has the task (``submitted``, ``working``,
    ``unknown``) holds it until it reports."""
    if state in (None, "", TaskState.COMPLETED):
        return TaskState.COMPLETED
    if state in TASK_STATES and state != TaskState.SUBMITTED:
        return state
    return TaskState.WORKING

