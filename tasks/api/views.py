"""The control plane's doors to tasks: operators read them and re-trigger callbacks, agents
report on the tasks they hold, A2A agents push their task status, tenants keep the secrets
their callbacks are signed with. Callers use ``/v1/tasks`` on the gateway."""

from __future__ import annotations

import uuid

from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.models import AuditAction, AuditSource
from audit.services import audit_record
from reach_platform.api import TenantScopedReadOnlyViewSet, TenantScopedViewSet
from tasks.api.serializers import (
    SigningSecretIssuedSerializer,
    SigningSecretSerializer,
    TaskReportSerializer,
    TaskSerializer,
)
from tasks.choices import TaskState
from tasks.models import SigningSecret, Task
from tasks.selectors import task_view
from tasks.services import (
    Report,
    TaskRefused,
    delivery_retrigger,
    push_token_matches,
    signing_secret_create,
    task_report,
)


def _refused(refused: TaskRefused):
    if refused.code == "not_found":
        return exceptions.NotFound(refused.message)
    if refused.code == "conflict":
        error = exceptions.APIException(refused.message)
        error.status_code = status.HTTP_409_CONFLICT
        error.default_code = "conflict"
        return error
    return exceptions.ValidationError({"state": [refused.message]})


class TaskViewSet(TenantScopedReadOnlyViewSet):
    """Your tenants' asynchronous tasks, newest first, with their history and callback
    deliveries. ``?state=`` filters. An agent token sees the tasks its agent holds."""

    queryset = Task.objects.select_related("agent", "signing_secret").prefetch_related(
        "events", "deliveries")
    serializer_class = TaskSerializer
    agent_token_actions = ("list", "retrieve", "status")
    list_filters = frozenset({"state"})

    def get_queryset(self):
        rows = super().get_queryset()
        state = self.request.query_params.get("state")
        if state and state not in TaskState.values:
            raise exceptions.ValidationError(
                {"state": [f"not a task state: one of {', '.join(TaskState.values)}"]})
        return rows.filter(state=state) if state else rows

    @extend_schema(parameters=[OpenApiParameter("state", str, description="Only tasks in "
                                                "this state (submitted, working, ...).")])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(request=TaskReportSerializer, responses={200: TaskSerializer})
    @action(detail=True, methods=["post"])
    def status(self, request, pk=None):
        """The agent holding this task reports on it (agent token only): progress while
        ``working``, ``input-required`` with the question, or the final state with its
        ``output`` (completed) or ``error`` (failed, rejected). A final task takes no more
        reports (409); another agent's task is 404."""
        task = self.get_object()
        if self.principal.agent_pk is None:
            raise exceptions.PermissionDenied("Only the agent holding the task reports on it; "
                                              "use its agent token.")
        body = TaskReportSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            task = task_report(task=task, agent_id=self.principal.agent_pk,
                               report=Report(**body.validated_data))
        except TaskRefused as refused:
            raise _refused(refused) from None
        return Response(task_view(Task.objects.select_related(
            "agent", "signing_secret").get(pk=task.pk), for_agent=True))

    @extend_schema(request=None, responses={200: TaskSerializer})
    @action(detail=True, methods=["post"])
    @transaction.atomic
    def redeliver(self, request, pk=None):
        """Deliver the task's callbacks that were not acknowledged (exhausted or still
        pending) again, now, with fresh retries and the same delivery ids."""
        task = self.get_object()
        if not self.principal.can_manage(task.tenant_id):
            self.permission_denied(request, "You may not manage tasks of that tenant.")
        undelivered = [d for d in task.deliveries.all() if d.status != "delivered"]
        if not task.callback_url or not undelivered:
            raise _refused(TaskRefused("conflict", "The task has no undelivered callback."))
        for delivery in undelivered:
            delivery_retrigger(delivery=delivery)
        audit_record(principal=self.principal, source=AuditSource.API,
                     action=AuditAction.ACTION, obj=task,
                     changes={"redelivered": [str(d.pk) for d in undelivered]})
        return Response(task_view(Task.objects.select_related(
            "agent", "signing_secret").get(pk=task.pk)))


class TaskPushView(APIView):
    """An A2A agent's push notification about a task it holds (the URL and token the
    platform gave it in ``pushNotificationConfig``). The body is the A2A Task (or a
    ``status-update`` event); the token goes in ``X-A2A-Notification-Token``."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(request=inline_serializer("A2APush", {"status": serializers.JSONField()}),
                   responses={200: inline_serializer("A2APushAck",
                                                     {"state": serializers.CharField()})})
    def post(self, request, pk):
        task = Task.objects.filter(pk=pk).select_related("agent").first() \
            if _is_uuid(pk) else None
        token = request.headers.get("X-A2A-Notification-Token")
        if task is None or not push_token_matches(task, token):
            # One answer for an unknown task and a wrong token: neither is confirmed.
            raise exceptions.NotFound("No such task for this token.")
        report = _a2a_report(request.data)
        try:
            task = task_report(task=task, agent_id=task.agent_id, report=report)
        except TaskRefused as refused:
            raise _refused(refused) from None
        return Response({"state": task.state})


def _is_uuid(value) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def _a2a_report(body) -> Report:
    """The task's status from an A2A Task object (or a status-update event)."""
    if not isinstance(body, dict):
        raise exceptions.ValidationError({"status": ["the body must be an A2A Task"]})
    result = body.get("result") if isinstance(body.get("result"), dict) else body
    status_ = result.get("status")
    if not isinstance(status_, dict) or not isinstance(status_.get("state"), str):
        raise exceptions.ValidationError({"status": ["an A2A task status is required"]})
    texts, data = [], None
    message = status_.get("message")
    parts = list(message.get("parts") or []) if isinstance(message, dict) else []
    for artifact in result.get("artifacts") or []:
        if isinstance(artifact, dict):
            parts.extend(artifact.get("parts") or [])
    for part in parts:
        if isinstance(part, dict) and part.get("kind") == "text" and isinstance(
                part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part, dict) and part.get("kind") == "data":
            data = part.get("data")
    state = status_["state"]
    if state in ("submitted", "unknown"):
        state = "working"
    text = "".join(texts)[:4000]
    return Report(state=state, message=text, output=data,
                  error=text if state in ("failed", "rejected") else "")


class SigningSecretViewSet(TenantScopedViewSet):
    """Secrets your callbacks are signed with (HMAC-SHA256, ``X-Reach-Signature``). The
    secret appears once, in the response to create; a task names one with
    ``callback_secret`` (default ``default``)."""

    queryset = SigningSecret.objects.select_related("tenant")
    serializer_class = SigningSecretSerializer
    http_method_names = ["get", "post", "delete", "head", "options"]

    @extend_schema(request=SigningSecretSerializer,
                   responses={201: SigningSecretIssuedSerializer})
    @transaction.atomic
    def create(self, request):
        serializer = SigningSecretSerializer(data=request.data,
                                             context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if not self.principal.can_manage(data["tenant"].pk):
            self.permission_denied(request, "You may not manage secrets of that tenant.")
        try:
            secret, plaintext = signing_secret_create(tenant=data["tenant"],
                                                      name=data.get("name", "default"))
        except TaskRefused as refused:
            raise _refused(refused) from None
        audit_record(principal=self.principal, source=AuditSource.API,
                     action=AuditAction.CREATE, obj=secret, changes={"name": secret.name})
        body = SigningSecretIssuedSerializer(secret,
                                             context=self.get_serializer_context()).data
        body["secret"] = plaintext
        return Response(body, status=status.HTTP_201_CREATED)

