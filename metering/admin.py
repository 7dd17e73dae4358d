from __future__ import annotations

from django.contrib import admin

from metering.models import UsageDaily, UsageEvent
from reach_platform.admin_base import ReadOnlyTenantScopedAdmin, badge


@admin.register(UsageEvent)
class UsageEventAdmin(ReadOnlyTenantScopedAdmin):
    list_display = [
        "occurred_at", "request_id", "tenant", "agent", "capability", "outcome_badge",
        "input_tokens", "output_tokens", "cost", "latency_ms",
    ]
    list_filter = ["outcome", "tenant"]
    list_select_related = ["tenant", "agent__namespace", "capability"]
    search_fields = ["request_id"]
    date_hierarchy = "occurred_at"

    @admin.display(description="outcome", ordering="outcome")
    def outcome_badge(self, obj: UsageEvent):
        return badge("healthy" if obj.outcome == "success" else "offline", obj.outcome)


@admin.register(UsageDaily)
class UsageDailyAdmin(ReadOnlyTenantScopedAdmin):
    list_display = [
        "day", "tenant", "agent", "capability", "requests", "errors", "input_tokens",
        "output_tokens", "cost",
    ]
    list_filter = ["tenant"]
    list_select_related = ["tenant", "agent__namespace", "capability"]
    date_hierarchy = "day"
