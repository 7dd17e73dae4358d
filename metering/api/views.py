from __future__ import annotations

import datetime as dt
from typing import Any

from django.http import Http404, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, renderers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from metering import selectors
from metering.api.serializers import (
    ToolUsageSerializer,
    UsageAllocationSerializer,
    UsageDailySerializer,
    UsageEventQuerySerializer,
    UsageEventSerializer,
    UsagePeriodQuerySerializer,
    UsageReportQuerySerializer,
    UsageReportSerializer,
)
from metering.models import UsageDaily, UsageEvent
from metering.reports import REASON_COLUMNS, narrow_to_tenant, report_csv
from reach_platform.api import NOT_FILTERS, TenantScopedReadOnlyViewSet
from tenants.models import Tenant
from tenants.principal import principal_for_request


class UsageEventViewSet(TenantScopedReadOnlyViewSet):
    """One row per call through the gateway, newest first. ``/usage/events/<request id>/``
    finds a call by the X-Request-ID it carried (the newest, if a caller reused one)."""

    queryset = UsageEvent.objects.select_related("tenant")
    serializer_class = UsageEventSerializer
    list_filters = None  # checked with its query serializer (``_validated``)
    lookup_field = "request_id"
    # Any request id the gateway accepts (dots included), up to the next slash.
    lookup_value_regex = "[^/]+"

    @extend_schema(parameters=[UsageEventQuerySerializer])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def filter_queryset(self, queryset):
        queryset = super().filter_queryset(queryset)
        if self.action != "list":
            return queryset
        query = _validated(UsageEventQuerySerializer, self.request, also=NOT_FILTERS)
        if "tenant" in query:
            queryset = queryset.filter(tenant_id__in=_scope(self.request, query["tenant"]))
        if "outcome" in query:
            queryset = queryset.filter(outcome=query["outcome"])
        if "capability" in query:
            queryset = queryset.filter(capability__capability_id=query["capability"])
        if "agent" in query:
            queryset = queryset.filter(agent__name=query["agent"])
        if "since" in query:
            queryset = queryset.filter(occurred_at__gte=query["since"])
        if "until" in query:
            queryset = queryset.filter(occurred_at__lt=query["until"])
        return queryset

    def get_object(self):
        # A caller chooses its request ids and may repeat one: never MultipleObjectsReturned.
        event = self.filter_queryset(self.get_queryset()).filter(
            request_id=self.kwargs["request_id"]).order_by("-occurred_at", "-pk").first()
        if event is None:
            raise Http404
        self.check_object_permissions(self.request, event)
        return event


class UsageDailyViewSet(TenantScopedReadOnlyViewSet):
    """Daily totals per tenant, agent and capability."""

    queryset = UsageDaily.objects.select_related("tenant")
    serializer_class = UsageDailySerializer
    # No filters here (the report has them): one given is refused, not ignored (a break
    # test read its own rows back for ?tenant=beta and took them for beta's).


def _validated(serializer_class: type, request: Request,
               also: frozenset[str] = frozenset({"format"})) -> dict[str, Any]:
    """The query parameters, checked: each known (a filter silently ignored, ``tz=`` or a
    misspelt ``tenat=``, reads as one applied; ``also`` names the non-filters, such as
    DRF's ``format``), each given once, each valid."""
    accepted = set(serializer_class().fields)
    unknown = sorted(set(request.query_params) - accepted - also)
    if unknown:
        known = f"use {', '.join(sorted(accepted))}" if accepted else "this list has no filters"
        raise exceptions.ValidationError({name: [f"not a parameter here; {known}"]
                                          for name in unknown[:10]})
    # A plain dict, not the QueryDict: DRF reads a blank form value of an optional field
    # as "not sent", so ``?tenant=`` would report on every tenant instead of being a 400.
    # One value each: the last silently winning reads as both applied.
    repeated = [name for name in request.query_params
                if len(request.query_params.getlist(name)) > 1]
    if repeated:
        raise exceptions.ValidationError({name: ["give it once"] for name in repeated[:10]})
    query = serializer_class(data=request.query_params.dict())
    query.is_valid(raise_exception=True)
    return dict(query.validated_data)


def _scope(request: Request, tenant_slug: str | None) -> frozenset[int] | None:
    """The tenants to report on: the caller's readable ones, or the one named."""
    try:
        return narrow_to_tenant(principal_for_request(request).tenant_ids, tenant_slug)
    except Tenant.DoesNotExist as exc:
        # Same answer for "no such tenant" and "not yours": existence is not confirmed.
        raise exceptions.NotFound(f"No tenant {tenant_slug!r} among the tenants you read.") from exc


def _report(request: Request) -> dict[str, Any]:
    query = _validated(UsageReportQuerySerializer, request)
    tenant_ids = _scope(request, query.get("tenant"))
    period: dict[str, dt.date] = {"start": query["start"], "end": query["end"]}
    return {
        **period,
        "group_by": query["group_by"],
        "rows": selectors.usage_report(tenant_ids=tenant_ids, group_by=query["group_by"],
                                       **period),
        "totals": selectors.usage_totals(tenant_ids=tenant_ids, **period),
    }


class UsageReportView(APIView):
    """Usage and cost of your tenants over a period, grouped as asked, with totals.

    Without start and end, the current month to date (UTC). Every row and the totals
    carry errors_by_reason: the calls that did not succeed, per outcome. Settled days
    come from the daily rollups, today, yesterday and days with events not rolled up
    yet from the raw events, so the report is current up to the last stored call.
    """

    @extend_schema(
        operation_id="usage_report", parameters=[UsageReportQuerySerializer],
        responses={200: UsageReportSerializer},
    )
    def get(self, request: Request) -> Response:
        return Response(UsageReportSerializer(_report(request)).data)


class CSVRenderer(renderers.BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        # The view builds the CSV itself; this renderer only lets
        # ``Accept: text/csv`` through content negotiation.
        return data


class UsageReportCSVView(APIView):
    """The usage report as CSV: a header row, then the same rows as the JSON report."""

    renderer_classes = [CSVRenderer]

    @extend_schema(
        operation_id="usage_report_csv", parameters=[UsageReportQuerySerializer],
        responses={(200, "text/csv"): OpenApiResponse(
            response=OpenApiTypes.STR,
            description="Columns: the group_by keys, then requests, errors, input_tokens, "
            "output_tokens, cost, latency_ms_avg, then errors_<outcome> for every outcome "
            f"but success, whether it occurred or not ({', '.join(REASON_COLUMNS)}).",
        )},
    )
    def get(self, request: Request) -> HttpResponse:
        report = _report(request)
        response = HttpResponse(
            report_csv(report["rows"], report["group_by"]), content_type="text/csv; charset=utf-8"
        )
        name = f"usage-{report['start']:%Y%m%d}-{report['end']:%Y%m%d}.csv"
        response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response

    def handle_exception(self, exc: Exception) -> Response:
        # Errors keep the project's JSON shape even when the client asked for CSV.
        self.request.accepted_renderer = renderers.JSONRenderer()
        self.request.accepted_media_type = renderers.JSONRenderer.media_type
        return super().handle_exception(exc)


class UsageAllocationView(APIView):
    """How the period's total cost splits across your tenants (shares add up to 1)."""

    @extend_schema(
        operation_id="usage_allocation", parameters=[UsagePeriodQuerySerializer],
        responses={200: UsageAllocationSerializer},
    )
    def get(self, request: Request) -> Response:
        query = _validated(UsagePeriodQuerySerializer, request)
        tenant_ids = _scope(request, query.get("tenant"))
        rows = selectors.cost_allocation(start=query["start"], end=query["end"],
                                         tenant_ids=tenant_ids)
        body = {"start": query["start"], "end": query["end"],
                "total_cost": selectors.allocation_total(rows), "tenants": rows}
        return Response(UsageAllocationSerializer(body).data)


class ToolUsageView(APIView):
    """Tool calls per tool and caller (an agent, or a tenant's keys) over a period: calls,
    errors, the external service's refusals, average latency."""

    @extend_schema(operation_id="usage_tools", parameters=[UsagePeriodQuerySerializer],
                   responses={200: ToolUsageSerializer})
    def get(self, request: Request) -> Response:
        query = _validated(UsagePeriodQuerySerializer, request)
        tenant_ids = _scope(request, query.get("tenant"))
        rows = selectors.tool_usage(tenant_ids=tenant_ids, start=query["start"],
                                    end=query["end"])
        return Response(ToolUsageSerializer(
            {"start": query["start"], "end": query["end"], "rows": rows}).data)
