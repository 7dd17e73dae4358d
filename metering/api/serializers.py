from __future__ import annotations

from typing import Any

from rest_framework import serializers

from metering.choices import ERROR_REASONS
from metering.models import UsageDaily, UsageEvent
from metering.reports import DEFAULT_GROUP_BY, PeriodError, parse_group_by, resolve_period
from metering.selectors import GROUP_KEYS, MISSING
from reach_core.kinds import Outcome


class UsageEventSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = UsageEvent
        fields = [
            "event_id", "request_id", "tenant", "agent", "capability", "instance", "outcome",
            "input_tokens", "output_tokens", "cost", "latency_ms", "occurred_at",
        ]
        read_only_fields = fields


class UsageDailySerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = UsageDaily
        fields = [
            "id", "day", "tenant", "agent", "capability", "requests", "errors",
            "errors_by_reason", "input_tokens", "output_tokens", "cost", "latency_ms_total",
        ]
        read_only_fields = fields


# ---- reports ---------------------------------------------------------------------------


def _cost_field(**kw) -> serializers.DecimalField:
    return serializers.DecimalField(max_digits=24, decimal_places=6, read_only=True, **kw)


class UsageEventQuerySerializer(serializers.Serializer):
    """Filters of the usage events list; validation only. Any other query parameter is
    refused: a filter silently ignored reads as one applied."""

    tenant = serializers.SlugField(
        required=False, help_text="Only this tenant (its slug); default: every tenant you read.")
    outcome = serializers.ChoiceField(choices=[o.value for o in Outcome], required=False,
                                      help_text="Only calls that ended so.")
    capability = serializers.CharField(max_length=128, required=False,
                                       help_text="Only calls of this capability id.")
    agent = serializers.CharField(max_length=128, required=False,
                                  help_text="Only calls served by the agent of this name.")
    since = serializers.DateTimeField(required=False, help_text="Calls at or after this time.")
    until = serializers.DateTimeField(required=False, help_text="Calls before this time.")


class UsagePeriodQuerySerializer(serializers.Serializer):
    """Query parameters of the usage reports; validation only, never saved."""

    start = serializers.DateField(
        required=False, help_text="First day (UTC), inclusive. Default: the 1st of end's month."
    )
    end = serializers.DateField(
        required=False, help_text="Last day (UTC), inclusive. Default: today."
    )
    tenant = serializers.SlugField(
        required=False, help_text="Only this tenant (its slug); default: every tenant you read."
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        try:
            attrs["start"], attrs["end"] = resolve_period(attrs.get("start"), attrs.get("end"))
        except PeriodError as exc:
            raise serializers.ValidationError({exc.field: [exc.message]}) from exc
        return attrs


class UsageReportQuerySerializer(UsagePeriodQuerySerializer):
    group_by = serializers.CharField(
        required=False,
        help_text=f"Comma-separated subset of {', '.join(GROUP_KEYS)}, in column order. "
        f"Default: {','.join(DEFAULT_GROUP_BY)}.",
    )

    def validate_group_by(self, value: str) -> list[str]:
        try:
            return parse_group_by(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        attrs.setdefault("group_by", list(DEFAULT_GROUP_BY))
        return attrs


class UsageReportTotalsSerializer(serializers.Serializer):
    requests = serializers.IntegerField(read_only=True)
    errors = serializers.IntegerField(
        read_only=True,
        help_text="Calls whose outcome was not success (client_cancelled included).",
    )
    errors_by_reason = serializers.DictField(
        child=serializers.IntegerField(), read_only=True,
        help_text="The errors per outcome, only outcomes that occurred (adds up to errors), "
        f"e.g. {{\"upstream_error\": 3, \"rate_limited\": 2}}. Outcomes: "
        f"{', '.join(ERROR_REASONS)}.",
    )
    input_tokens = serializers.IntegerField(read_only=True)
    output_tokens = serializers.IntegerField(read_only=True)
    cost = _cost_field()
    latency_ms_avg = serializers.FloatField(read_only=True)


class UsageReportRowSerializer(UsageReportTotalsSerializer):
    """A group's metrics; only the keys named in ``group_by`` are present."""

    # Not read_only: drf-spectacular marks read-only fields required, and these
    # are absent from rows not grouped by them. The serializer only renders.
    tenant = serializers.CharField(required=False, help_text="Tenant slug.")
    agent = serializers.CharField(
        required=False,
        help_text=f'Agent name, or "{MISSING["agent"]}" (refused before routing, or the '
        "agent was deleted since).",
    )
    capability = serializers.CharField(
        required=False,
        help_text=f'Capability id, or "{MISSING["capability"]}" (refused before routing, or '
        "the capability was deleted since).",
    )
    day = serializers.DateField(required=False, help_text="UTC day.")

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        # Group keys first, as in the CSV.
        ordered = [*GROUP_KEYS, *(name for name in fields if name not in GROUP_KEYS)]
        return {name: fields[name] for name in ordered}


class UsageReportSerializer(serializers.Serializer):
    start = serializers.DateField(read_only=True)
    end = serializers.DateField(read_only=True)
    group_by = serializers.ListField(
        child=serializers.ChoiceField(choices=GROUP_KEYS), read_only=True
    )
    rows = UsageReportRowSerializer(many=True, read_only=True)
    totals = UsageReportTotalsSerializer(read_only=True)


class UsageAllocationRowSerializer(serializers.Serializer):
    tenant = serializers.CharField(read_only=True, help_text="Tenant slug.")
    requests = serializers.IntegerField(read_only=True)
    cost = _cost_field()
    share = serializers.DecimalField(
        max_digits=7, decimal_places=6, read_only=True,
        help_text="Fraction of total_cost; the shares add up to exactly 1 when it is not 0.",
    )


class UsageAllocationSerializer(serializers.Serializer):
    start = serializers.DateField(read_only=True)
    end = serializers.DateField(read_only=True)
    total_cost = _cost_field()
    tenants = UsageAllocationRowSerializer(many=True, read_only=True)


class ToolUsageRowSerializer(serializers.Serializer):
    tool = serializers.CharField(read_only=True, allow_null=True)
    tenant = serializers.CharField(read_only=True)
    caller = serializers.CharField(read_only=True, help_text="The calling agent's name, or "
                                   "'(tenant key)'.")
    calls = serializers.IntegerField(read_only=True)
    errors = serializers.IntegerField(read_only=True)
    refused_by_service = serializers.IntegerField(
        read_only=True, help_text="Calls the external service answered with a 4xx.")
    latency_ms_avg = serializers.FloatField(read_only=True)


class ToolUsageSerializer(serializers.Serializer):
    start = serializers.DateField(read_only=True)
    end = serializers.DateField(read_only=True)
    rows = ToolUsageRowSerializer(many=True, read_only=True)
