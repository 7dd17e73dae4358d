from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from metering import selectors
from metering.choices import Outcome
from metering.models import Alert, AlertDelivery, BudgetAlert, UsageDaily, UsageEvent
from metering.reports import PeriodError, cost_chart, readable_tenants, resolve_period
from reach_platform.admin_base import ReadOnlyTenantScopedAdmin, badge
from tenants.models import Tenant
from tenants.principal import principal_for_request

# Offers only tenants with rows the user can see: the plain related filter would
# list every tenant's slug to every staff user.
_TENANT_FILTER = ("tenant", admin.RelatedOnlyFieldListFilter)
_REASON_LABELS = dict(Outcome.choices)


@admin.register(UsageEvent)
class UsageEventAdmin(ReadOnlyTenantScopedAdmin):
    """The call log: every metered call, from the usage events (so it also has the calls
    the gateways served while the control plane was down), searchable by request id."""

    list_display = [
        "occurred_at", "request_id", "tenant", "agent", "capability", "tool", "caller_agent",
        "outcome_badge", "instance_id", "retries", "route_score", "timings", "input_tokens",
        "output_tokens", "cost",
    ]
    list_filter = ["outcome", _TENANT_FILTER, ("agent", admin.RelatedOnlyFieldListFilter),
                   ("capability", admin.RelatedOnlyFieldListFilter),
                   ("tool", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["tenant", "agent__namespace", "capability", "tool",
                           "caller_agent__namespace"]
    search_fields = ["=request_id"]
    search_help_text = "A request id (X-Request-ID), exactly."
    date_hierarchy = "occurred_at"

    @admin.display(description="instance", ordering="instance_id")
    def instance_id(self, obj: UsageEvent):
        return obj.instance_id

    @admin.display(description="route / upstream / total ms", ordering="latency_ms")
    def timings(self, obj: UsageEvent) -> str:
        def ms(value):
            return "–" if value is None else f"{value:.1f}"

        return f"{ms(obj.route_ms)} / {ms(obj.upstream_ms)} / {obj.latency_ms}"

    @admin.display(description="outcome", ordering="outcome")
    def outcome_badge(self, obj: UsageEvent):
        return badge("healthy" if obj.outcome == "success" else "offline", obj.outcome)


class UsageReportForm(forms.Form):
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    tenant = forms.ModelChoiceField(
        queryset=Tenant.objects.none(), required=False, to_field_name="slug",
        empty_label="All my tenants",
    )

    def __init__(self, *args: Any, tenants: QuerySet[Tenant], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Only the user's tenants are valid choices: another slug is a form error.
        self.fields["tenant"].queryset = tenants

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if "start" in cleaned and "end" in cleaned:
            try:
                cleaned["start"], cleaned["end"] = resolve_period(
                    cleaned["start"], cleaned["end"]
                )
            except PeriodError as exc:
                self.add_error(exc.field, exc.message)
        return cleaned


@admin.register(UsageDaily)
class UsageDailyAdmin(ReadOnlyTenantScopedAdmin):
    list_display = [
        "day", "tenant", "agent", "capability", "requests", "errors", "reasons",
        "input_tokens", "output_tokens", "cost",
    ]
    list_filter = [_TENANT_FILTER]
    list_select_related = ["tenant", "agent__namespace", "capability"]
    date_hierarchy = "day"

    @admin.display(description="errors by reason")
    def reasons(self, obj: UsageDaily) -> str:
        return ", ".join(f"{reason} {count}" for reason, count in obj.errors_by_reason.items())

    def get_urls(self) -> list[URLPattern]:
        report = path(
            "report/", self.admin_site.admin_view(self.report_view),
            name="metering_usagedaily_report",
        )
        # Before the defaults: their "<path:object_id>/" would swallow "report/".
        return [report, *super().get_urls()]

    def report_view(self, request: HttpRequest) -> HttpResponse:
        """Usage, errors by reason and cost over a period for ops and finance."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        principal = principal_for_request(request)
        tenants = readable_tenants(principal.tenant_ids)
        default_start, default_end = resolve_period(None, None)
        form = UsageReportForm(
            request.GET or None, tenants=tenants,
            initial={"start": default_start, "end": default_end},
        )
        context: dict[str, Any] = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Usage report",
            "form": form,
            "report": None,
        }
        if not form.is_bound:
            context["report"] = self._report(
                principal.tenant_ids, tenants, None, default_start, default_end
            )
        elif form.is_valid():
            data = form.cleaned_data
            context["report"] = self._report(
                principal.tenant_ids, tenants, data["tenant"], data["start"], data["end"]
            )
        return TemplateResponse(request, "admin/metering/report.html", context)

    def _report(
        self, readable: frozenset[int] | None, tenants: QuerySet[Tenant],
        tenant: Tenant | None, start: dt.date, end: dt.date,
    ) -> dict[str, Any]:
        tenant_ids = frozenset({tenant.pk}) if tenant else readable
        # A tenant column only when the rows can mix tenants.
        many = tenant is None and (readable is None or len(readable) > 1)
        group_by = ["tenant", "agent", "capability", "day"] if many else [
            "agent", "capability", "day"
        ]
        period = {"start": start, "end": end}
        allocation = selectors.cost_allocation(tenant_ids=readable, **period)
        query = {"start": start.isoformat(), "end": end.isoformat(),
                 "group_by": ",".join(group_by)}
        if tenant is not None:
            query["tenant"] = tenant.slug
        totals = selectors.usage_totals(tenant_ids=tenant_ids, **period)
        return {
            **period,
            "tenant": tenant,
            "group_by": group_by,
            "rows": selectors.usage_report(tenant_ids=tenant_ids, group_by=group_by, **period),
            "totals": totals,
            # The period's errors per reason, most frequent first, with the admin's wording.
            "reasons": [
                {"reason": reason, "label": _REASON_LABELS.get(reason, reason), "count": count,
                 "percent": round(100 * count / totals["requests"], 1)}
                for reason, count in sorted(totals["errors_by_reason"].items(),
                                            key=lambda item: (-item[1], item[0]))
            ],
            "chart": cost_chart(selectors.daily_cost(tenant_ids=tenant_ids, **period)),
            "allocation": allocation,
            "allocation_total": selectors.allocation_total(allocation),
            "csv_url": f"{reverse('usage-report-csv')}?{urlencode(query)}",
        }


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ReadOnlyTenantScopedAdmin):
    list_display = ["month_label", "tenant", "metric", "used_of_budget", "threshold",
                    "created_at"]
    list_filter = ["metric", _TENANT_FILTER]
    list_select_related = ["tenant"]
    date_hierarchy = "month"

    @admin.display(description="month", ordering="month")
    def month_label(self, obj: BudgetAlert) -> str:
        return f"{obj.month:%Y-%m}"

    @admin.display(description="used / budget")
    def used_of_budget(self, obj: BudgetAlert) -> str:
        share = f" ({obj.used / obj.budget:.0%})" if obj.budget else ""
        return f"{_plain(obj.used)} / {_plain(obj.budget)}{share}"


def _plain(value: Decimal) -> str:
    # 1200.000000 -> "1200": budgets in requests or tokens are whole numbers.
    return f"{value.normalize():f}"


class AlertDeliveryInline(admin.TabularInline):
    model = AlertDelivery
    extra = 0
    can_delete = False
    fields = ["id", "event", "status", "attempts", "last_status", "last_error",
              "next_attempt_at", "delivered_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Alert)
class AlertAdmin(ReadOnlyTenantScopedAdmin):
    """Budget thresholds reached and agents without a healthy instance, with their
    deliveries to the tenant's webhook (``metering.alerts``)."""

    list_display = ["opened_at", "tenant", "kind", "message", "state", "delivered"]
    list_filter = ["kind", _TENANT_FILTER]
    list_select_related = ["tenant"]
    search_fields = ["subject", "message"]
    date_hierarchy = "opened_at"
    inlines = [AlertDeliveryInline]

    @admin.display(description="state", ordering="resolved_at")
    def state(self, obj: Alert):
        return badge("offline", "open") if obj.resolved_at is None else \
            badge("healthy", f"resolved {obj.resolved_at:%Y-%m-%d %H:%M}")

    @admin.display(description="webhook")
    def delivered(self, obj: Alert) -> str:
        statuses = [d.status for d in obj.deliveries.all()]
        return ", ".join(statuses) or "–"

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("deliveries")
