from __future__ import annotations

from rest_framework import serializers

from metering.models import UsageDaily, UsageEvent


class UsageEventSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = UsageEvent
        fields = [
            "request_id", "tenant", "agent", "capability", "instance", "outcome",
            "input_tokens", "output_tokens", "cost", "latency_ms", "occurred_at",
        ]
        read_only_fields = fields


class UsageDailySerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = UsageDaily
        fields = [
            "id", "day", "tenant", "agent", "capability", "requests", "errors", "input_tokens",
            "output_tokens", "cost", "latency_ms_total",
        ]
        read_only_fields = fields
