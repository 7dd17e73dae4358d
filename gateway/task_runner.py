"""One attempt of an asynchronous task: the task's call, through the call pipeline.

The call is the one ``POST /v1/invoke`` would make of the submitted body. A continued task
(the caller answered an agent that asked for input) goes back to the same instance while
it can take the call, with the answer folded in by the agent's protocol, and a key of its
own (``<task key>/<n>``: the agent must not take the answer for a repeat of the question).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import replace

from gateway.calls import CallContext
from gateway.doors import agent_response, invoke_call
from gateway.http_io import dumps_reply
from gateway.pipeline import Pipeline
from gateway.tasks import (
    NOT_REACHED,
    RETRY_LATER,
    TaskClaim,
    TaskOutcome,
    TaskRef,
    outcome_of_state,
    retry_after,
)
from reach_core import requestid
from reach_core.errors import ReachError
from reach_core.kinds import TaskState
from routing.table import RouteTable

# What the task holds of a reply, per state it leaves the task in.
_WITH_RESULT = frozenset({TaskState.COMPLETED, TaskState.INPUT_REQUIRED,
                          TaskState.AUTH_REQUIRED})
_AGENT_ERRORS = {TaskState.FAILED: "upstream_error", TaskState.REJECTED: "upstream_refused"}


class TaskRunner:
    def __init__(self, pipeline: Pipeline, table: Callable[[], RouteTable]) -> None:
        self._pipeline = pipeline
        self._table = table

    async def attempt(self, claim: TaskClaim) -> TaskOutcome:
        # The attempt's log lines carry the submission's request id (each attempt runs in
        # a task of its own, so this stays with it).
        requestid.current.set(claim.request_id)
        table = self._table()
        tenant = table.tenants.get(claim.tenant_pk)
        if tenant is None:  # a tenant newer than this worker's table: it is on its way
            return TaskOutcome(state=TaskState.FAILED, retry_after_s=2.0, reached_agent=False,
                               error={"code": "service_unavailable", "message": "this "
                                      "worker's route table does not know the tenant yet"})
        if not tenant.is_active:
            return TaskOutcome(state=TaskState.FAILED, error={
                "code": "forbidden", "message": "The task's tenant is not active."})
        try:
            call, key = self._call(claim)
        except ReachError as error:  # the stored body no longer makes a call (cannot be)
            return TaskOutcome(state=TaskState.FAILED,
                               error={"code": error.code, "message": error.message})
        ctx = CallContext(
            request_id=claim.request_id, tenant_pk=claim.tenant_pk, tenant_slug=tenant.slug,
            started=time.monotonic(), budget_ms=0, caller_budget_ms=None, idempotency_key=key,
            task=TaskRef(claim.task_id, claim.agent_task_id, claim.agent_context_id,
                         claim.push_url, claim.push_token))
        try:
            result = await self._pipeline.perform(table, call, ctx)
        except ReachError as error:
            chosen = ctx.candidate
            return TaskOutcome(
                state=TaskState.FAILED, error={"code": error.code, "message": error.message},
                capability=chosen.capability.capability_id if chosen else "",
                retry_after_s=retry_after(error, claim.attempt) if error.code in RETRY_LATER
                else None,
                # A refusal after a first try that failed (the retry found the breaker
                # open) still called an agent once.
                reached_agent=error.code not in NOT_REACHED or len(ctx.attempts) > 1)
        reply, chosen = result.reply, result.candidate
        state = outcome_of_state(reply.state)
        error = None
        if state in _AGENT_ERRORS:
            error = {"code": _AGENT_ERRORS[state],
                     "message": reply.reply_content or f"the agent answered {state}"}
        stored = agent_response(result) if state in _WITH_RESULT else None
        if stored is not None:
            try:  # what cannot be written back out must not be stored: every read would 500
                dumps_reply(stored)
            except ReachError as bad:
                return TaskOutcome(state=TaskState.FAILED,
                                   error={"code": bad.code, "message": bad.message},
                                   capability=chosen.capability.capability_id,
                                   reached_agent=True)
        return TaskOutcome(
            state=state, result=stored,
            error=error, message=reply.reply_content or "",
            capability=chosen.capability.capability_id, agent_pk=chosen.agent.pk,
            instance_pk=chosen.instance.pk, agent_task_id=reply.agent_task_id,
            agent_context_id=reply.agent_context_id)

    @staticmethod
    def _call(claim: TaskClaim):
        request = claim.request
        messages = [m["input"] for m in claim.messages]
        call = invoke_call(request["body"], claim.tenant_pk,
                           namespace=request.get("namespace"),
                           internal=bool(request.get("internal")),
                           prefer_instance=claim.instance_pk if messages else None)
        if not messages:
            return call, claim.idempotency_key
        first = call.payload(None)  # the submitted input, whatever the protocol

        def payload(protocol) -> dict:
            return functools.reduce(protocol.continued, messages, first)

        return replace(call, payload=payload), f"{claim.idempotency_key}/{len(messages)}"
