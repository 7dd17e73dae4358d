from __future__ import annotations

import re

from rest_framework import serializers

from reach_core.endpoints import EndpointRefused, check_registration
from reach_platform.endpoints import endpoint_policy
from reach_platform.serializers import (
    CleanModelSerializer,
    ScopedPrimaryKeyField,
    ScopedSlugField,
    StrictCharField,
    StrictSlugRelatedField,
    TenantDefault,
    check_secret,
)
from tenants.models import Tenant
from tools.models import Tool, ToolGrant
from tools.services import tool_save

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ToolSerializer(CleanModelSerializer):
    """A tool. ``secret`` is write-only: responses say where it comes from, never what it
    is; the gateway alone uses it."""

    owner_tenant = ScopedSlugField(
        slug_field="slug", queryset=Tenant.objects.all(), default=TenantDefault(),
        help_text="The owner tenant's slug; defaults to the caller's when it has one.")
    secret = StrictCharField(
        write_only=True, required=False, allow_blank=False, max_length=8192,
        trim_whitespace=False, style={"input_type": "password"},
        help_text="The external system's secret; stored encrypted. Omit to keep it.")
    has_secret = serializers.BooleanField(read_only=True)

    class Meta:
        model = Tool
        fields = [
            "id", "owner_tenant", "name", "display_name", "description", "when_to_use",
            "when_not_to_use", "input_schema", "output_description", "output_schema",
            "examples", "timeout_ms", "visibility", "url_template", "method",
            "query_arguments", "auth_kind", "auth_field_name", "secret", "value_env",
            "client_cert_path", "client_key_path", "ca_file", "calls_per_minute",
            "caller_calls_per_minute", "has_secret", "created_at", "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate_url_template(self, value: str) -> str:
        """The endpoint policy, as for agents: the template with each placeholder filled
        in must be a URL the gateway may call."""
        try:
            check_registration(_PLACEHOLDER.sub("x", value), endpoint_policy())
        except EndpointRefused as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return value

    def validate_secret(self, value: str) -> str:
        if any(c in value for c in "\r\n\x00"):
            raise serializers.ValidationError("must not contain line breaks or NUL")
        return value

    def validate(self, attrs):
        attrs = super().validate(attrs)
        check_secret(attrs, self.instance, kind_field="auth_kind")
        return attrs

    def create(self, validated_data):
        secret = validated_data.pop("secret", None)
        return tool_save(tool=Tool(**validated_data), secret=secret)

    def update(self, instance, validated_data):
        secret = validated_data.pop("secret", None)
        for name, value in validated_data.items():
            setattr(instance, name, value)
        return tool_save(tool=instance, secret=secret)


class ToolGrantSerializer(CleanModelSerializer):
    tool = ScopedPrimaryKeyField(queryset=Tool.objects.all())
    tenant = StrictSlugRelatedField(
        slug_field="slug", queryset=Tenant.objects.filter(is_active=True), required=False,
        allow_null=True, help_text="A tenant that may call the tool (its keys and agents).")
    agent = serializers.PrimaryKeyRelatedField(
        queryset=ToolGrant._meta.get_field("agent").related_model.objects.all(),
        required=False, allow_null=True, help_text="Or one agent that may call it.")

    class Meta:
        model = ToolGrant
        fields = ["id", "tool", "tenant", "agent", "created_at"]
        read_only_fields = ["id", "created_at"]
        # The grant's unique constraints are checked in validate(): DRF's own validators
        # for them would make both ``tenant`` and ``agent`` required.
        validators: list = []

    def validate(self, attrs):
        attrs = super().validate(attrs)
        tenant = attrs.get("tenant", getattr(self.instance, "tenant", None))
        agent = attrs.get("agent", getattr(self.instance, "agent", None))
        if (tenant is None) == (agent is None):
            raise serializers.ValidationError(
                {"tenant": "Grant to a tenant or to an agent: exactly one of them."})
        tool = attrs.get("tool", getattr(self.instance, "tool", None))
        grantee = {"tenant": tenant} if tenant is not None else {"agent": agent}
        if ToolGrant.objects.filter(tool=tool, **grantee).exclude(
                pk=getattr(self.instance, "pk", None)).exists():
            raise serializers.ValidationError(
                {next(iter(grantee)): "This grantee already has a grant on this tool."})
        return attrs
