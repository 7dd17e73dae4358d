from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from reach_platform.serializers import (
    CleanModelSerializer,
    KnownFieldsOnly,
    ScopedPrimaryKeyField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StrictModelSerializer,
)
from registry.models import Agent, Capability, Instance, Namespace, ParameterSynonym
from registry.spec import MAX_HINT_CHARS, MAX_HINTS
from tenants.api.serializers import tenant_field
from tenants.models import Credential
from tenants.principal import principal_for_request


class NamespaceSerializer(StrictModelSerializer):
    class Meta:
        model = Namespace
        fields = ["id", "name", "description"]
        read_only_fields = ["id"]


class CapabilitySerializer(CleanModelSerializer):
    agent = ScopedPrimaryKeyField(queryset=Agent.objects.all())
    # Declared for their published type (a list of strings); the model field is JSON.
    examples = serializers.ListField(
        child=StrictCharField(max_length=MAX_HINT_CHARS), max_length=MAX_HINTS, required=False,
        help_text="Example requests the capability expects; the intent router reads them.")
    not_for = serializers.ListField(
        child=StrictCharField(max_length=MAX_HINT_CHARS), max_length=MAX_HINTS, required=False,
        help_text='What the capability is not for, e.g. "parcel tracking (use '
                  'logistics.track)"; the intent router reads them.')

    class Meta:
        model = Capability
        # Every model field: a capability holds nothing secret, so a field added to
        # the model belongs in the API too.
        fields = "__all__"
        read_only_fields = ["id"]


class InstanceSerializer(CleanModelSerializer):
    agent = ScopedPrimaryKeyField(queryset=Agent.objects.all())

    class Meta:
        model = Instance
        fields = [
            "id", "agent", "endpoint", "reach_mode", "state", "health_tier",
            "lease_expires_at", "last_heartbeat_at", "cpu", "memory", "queue_depth",
            "in_flight", "processed_recent", "errors_recent", "capabilities_available",
            "flaps", "created_at",
        ]
        read_only_fields = [
            "id", "health_tier", "lease_expires_at", "last_heartbeat_at", "cpu", "memory",
            "queue_depth", "in_flight", "processed_recent", "errors_recent", "flaps",
            "created_at",
        ]

    def validate_endpoint(self, value: str) -> str:
        from reach_core.endpoints import EndpointRefused, check_registration
        from reach_platform.endpoints import endpoint_policy

        try:
            return check_registration(value, endpoint_policy())
        except EndpointRefused as exc:
            raise serializers.ValidationError(str(exc)) from exc


class AgentCredentialSerializer(serializers.ModelSerializer):
    """A credential reference as the agent's reader may see it: where the secret comes
    from, never the secret."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    secret_source = serializers.CharField(read_only=True)

    class Meta:
        model = Credential
        fields = ["id", "tenant", "kind", "field_name", "value_env", "client_cert_path",
                  "client_key_path", "ca_file", "secret_source"]
        read_only_fields = fields


class AgentSerializer(CleanModelSerializer):
    namespace = serializers.SlugRelatedField(slug_field="name", queryset=Namespace.objects.all())
    owner_tenant = tenant_field()
    capabilities = CapabilitySerializer(many=True, read_only=True)
    instances = InstanceSerializer(many=True, read_only=True)
    credentials = serializers.SerializerMethodField(
        help_text="Your tenants' credential references for this agent (never the secrets).")
    descriptor = serializers.SerializerMethodField(
        help_text="The last descriptor registered, as it was sent (to other tenants "
                  "without its auth blocks).")

    @extend_schema_field(AgentCredentialSerializer(many=True))
    def get_credentials(self, agent: Agent) -> list[dict]:
        request = self.context.get("request")
        if request is None:
            return []
        readable = principal_for_request(request).tenant_ids
        rows = [c for c in agent.credentials.all()
                if readable is None or c.tenant_id in readable]
        return AgentCredentialSerializer(rows, many=True).data

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_descriptor(self, agent: Agent):
        request = self.context.get("request")
        readable = principal_for_request(request).tenant_ids if request is not None else ()
        if readable is None or agent.owner_tenant_id in readable:
            return agent.descriptor
        # A grantee or a public agent's reader: the owner's credential references (the
        # variable names and file paths of its secrets) are the owner's business.
        return _without_auth(agent.descriptor)

    class Meta:
        model = Agent
        fields = [
            "id", "namespace", "name", "version", "description", "protocol", "owner_tenant",
            "team", "visibility", "internal_only", "weight", "priority", "traffic_percent",
            "price_input_per_1k",
            "price_output_per_1k", "price_per_call", "pool_max_connections",
            "pool_idle_seconds", "heartbeat_interval_seconds",
            "lease_ttl_seconds", "probe_path", "capabilities", "instances", "credentials",
            "descriptor", "created_at", "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]




def _without_auth(value):
    if isinstance(value, dict):
        return {k: _without_auth(v) for k, v in value.items() if k != "auth"}
    if isinstance(value, list):
        return [_without_auth(v) for v in value]
    return value


class ParameterSynonymSerializer(CleanModelSerializer):
    class Meta:
        model = ParameterSynonym
        fields = ["id", "synonym", "canonical"]
        read_only_fields = ["id"]


class RegistrationSerializer(serializers.Serializer):
    created = serializers.BooleanField()
    agent = AgentSerializer()
    instance = InstanceSerializer(allow_null=True)
    agent_token = serializers.CharField(
        source="token", allow_null=True,
        help_text="Issued when a tenant key registers; shown once. Use it for heartbeats.",
    )
    heartbeat_interval_seconds = serializers.IntegerField(
        source="agent.heartbeat_interval_seconds"
    )
    lease_ttl_seconds = serializers.IntegerField(source="agent.lease_ttl_seconds")


class HeartbeatSerializer(KnownFieldsOnly, serializers.Serializer):
    cpu = StrictFloatField(min_value=0.0, max_value=1.0, default=0.0)
    memory = StrictFloatField(min_value=0.0, max_value=1.0, default=0.0)
    # The columns' range: a larger count is a 400 here, not an overflow in the database.
    queue_depth = StrictIntegerField(min_value=0, max_value=2**31 - 1, default=0)
    in_flight = StrictIntegerField(min_value=0, max_value=2**31 - 1, default=0)
    processed_recent = StrictIntegerField(min_value=0, max_value=2**31 - 1, default=0)
    errors_recent = StrictIntegerField(min_value=0, max_value=2**31 - 1, default=0)
    capabilities_available = serializers.ListField(
        child=StrictCharField(max_length=128), required=False, max_length=1000,
        help_text="Capability ids this instance serves now; omit to leave unchanged.",
    )

    def to_heartbeat(self):
        from registry.health import Load
        from registry.services import Heartbeat

        data = dict(self.validated_data)
        available = data.pop("capabilities_available", None)
        return Heartbeat(load=Load(**data), capabilities_available=available)
