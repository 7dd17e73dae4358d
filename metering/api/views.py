from __future__ import annotations

from metering.api.serializers import UsageDailySerializer, UsageEventSerializer
from metering.models import UsageDaily, UsageEvent
from reach_platform.api import TenantScopedReadOnlyViewSet


class UsageEventViewSet(TenantScopedReadOnlyViewSet):
    """One row per call through the gateway, newest first."""

    queryset = UsageEvent.objects.select_related("tenant")
    serializer_class = UsageEventSerializer
    lookup_field = "request_id"


class UsageDailyViewSet(TenantScopedReadOnlyViewSet):
    """Daily totals per tenant, agent and capability."""

    queryset = UsageDaily.objects.select_related("tenant")
    serializer_class = UsageDailySerializer
