from __future__ import annotations

from django.contrib import admin

from audit.models import AuditEntry
from reach_platform.admin_base import ReadOnlyTenantScopedAdmin


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyTenantScopedAdmin):
    list_display = ["at", "actor", "source", "action", "object_type", "object_repr", "tenant"]
    list_filter = ["source", "action", "object_type"]
    search_fields = ["actor", "object_repr", "object_id", "request_id"]
    readonly_fields = [f.name for f in AuditEntry._meta.fields]
    date_hierarchy = "at"
