from __future__ import annotations

from rest_framework import serializers

from reach_platform.serializers import CleanModelSerializer, ScopedPrimaryKeyField
from registry.models import Agent, Capability, Instance, Namespace
from tenants.api.serializers import tenant_field


class NamespaceSerializer(serializers.ModelSerializer):
    class Meta:
        model = Namespace
        fields = ["id", "name", "description"]
        read_only_fields = ["id"]


class CapabilitySerializer(CleanModelSerializer):
    agent = ScopedPrimaryKeyField(queryset=Agent.objects.all())

    class Meta:
        model = Capability
        fields = [
            "id", "agent", "capability_id", "display_name", "description", "keywords",
            "input_schema", "output_schema", "timeout_ms", "qps", "burst", "kind", "version",
        ]
        read_only_fields = ["id"]


class InstanceSerializer(CleanModelSerializer):
    agent = ScopedPrimaryKeyField(queryset=Agent.objects.all())

    class Meta:
        model = Instance
        fields = [
            "id", "agent", "endpoint", "reach_mode", "state", "health_tier",
            "lease_expires_at", "last_heartbeat_at", "cpu", "memory", "queue_depth",
            "in_flight", "capabilities_available", "created_at",
        ]
        read_only_fields = [
            "id", "health_tier", "lease_expires_at", "last_heartbeat_at", "cpu", "memory",
            "queue_depth", "in_flight", "created_at",
        ]


class AgentSerializer(CleanModelSerializer):
    namespace = serializers.SlugRelatedField(slug_field="name", queryset=Namespace.objects.all())
    owner_tenant = tenant_field()
    capabilities = CapabilitySerializer(many=True, read_only=True)
    instances = InstanceSerializer(many=True, read_only=True)

    class Meta:
        model = Agent
        fields = [
            "id", "namespace", "name", "version", "description", "protocol", "owner_tenant",
            "team", "internal_only", "weight", "priority", "price_input_per_1k",
            "price_output_per_1k", "price_per_call", "pool_max_connections",
            "pool_idle_seconds", "schema_version", "capabilities", "instances",
            "created_at", "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]


