from __future__ import annotations

from rest_framework import serializers

from reach_platform.serializers import StrictCharField, StrictFloatField, StrictModelSerializer
from tasks.choices import DeliveryStatus
from tasks.models import SigningSecret, Task
from tasks.selectors import task_view
from tasks.services import REPORTABLE
from tenants.api.serializers import tenant_field


class SigningSecretSerializer(StrictModelSerializer):
    tenant = tenant_field()

    class Meta:
        model = SigningSecret
        fields = ["id", "tenant", "name", "created_at"]
        read_only_fields = ["id", "created_at"]


class SigningSecretIssuedSerializer(SigningSecretSerializer):
    secret = serializers.CharField(
        read_only=True, help_text="The secret itself. Shown in this response only; give it "
        "to your callback receivers now (they verify X-Reach-Signature with it).")

    class Meta(SigningSecretSerializer.Meta):
        fields = [*SigningSecretSerializer.Meta.fields, "secret"]


class TaskEventSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    state = serializers.CharField()
    at = serializers.DateTimeField()
    message = serializers.CharField(required=False)
    progress = serializers.FloatField(required=False)


class CallbackDeliverySerializer(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.CharField(help_text="The task state this delivery announces.")
    status = serializers.ChoiceField(choices=DeliveryStatus.choices)
    attempts = serializers.IntegerField()
    last_status = serializers.IntegerField(allow_null=True)
    last_error = serializers.CharField(allow_null=True)
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    delivered_at = serializers.DateTimeField(allow_null=True)


class TaskCallbackSerializer(serializers.Serializer):
    url = serializers.CharField()
    signing_secret = serializers.CharField(allow_null=True)
    deliveries = CallbackDeliverySerializer(many=True)


class TaskSerializer(serializers.ModelSerializer):
    """A task as ``GET /v1/tasks/<id>`` shows it (``tasks.selectors.task_view``)."""

    history = TaskEventSerializer(many=True, read_only=True)
    callback = TaskCallbackSerializer(read_only=True, required=False)
    agent = serializers.CharField(read_only=True, allow_null=True)
    result = serializers.JSONField(read_only=True, allow_null=True)
    error = serializers.JSONField(read_only=True, allow_null=True)

    class Meta:
        model = Task
        fields = ["id", "state", "request_id", "idempotency_key", "capability", "agent",
                  "message", "progress", "result", "error", "attempts", "created_at",
                  "updated_at", "finished_at", "deadline_at", "history", "callback"]
        read_only_fields = fields

    def to_representation(self, instance: Task) -> dict:
        view = self.context.get("view")
        principal = getattr(view, "principal", None)
        return task_view(instance, for_agent=getattr(principal, "agent_pk", None) is not None)


class TaskReportSerializer(serializers.Serializer):
    """An agent's word on a task it holds."""

    state = serializers.ChoiceField(choices=sorted(REPORTABLE))
    message = StrictCharField(required=False, allow_blank=True, max_length=4000, default="")
    progress = StrictFloatField(required=False, allow_null=True, min_value=0,
                                      max_value=1, default=None)
    output = serializers.JSONField(required=False, allow_null=True, default=None)
    error = StrictCharField(required=False, allow_blank=True, max_length=4000, default="")
