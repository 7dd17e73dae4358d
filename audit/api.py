from __future__ import annotations

from rest_framework import serializers

from audit.models import AuditEntry
from reach_platform.api import TenantScopedReadOnlyViewSet


class AuditEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEntry
        fields = [
            "id", "at", "source", "action", "actor", "tenant", "object_type", "object_id",
            "object_repr", "changes", "request_id",
        ]
        read_only_fields = fields


class AuditEntryViewSet(TenantScopedReadOnlyViewSet):
    """Who changed what, through the admin or the API. Never holds a secret."""

    queryset = AuditEntry.objects.all()
    serializer_class = AuditEntrySerializer
