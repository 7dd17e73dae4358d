"""One base admin for every tenant-owned model: scoping, permissions and audit.

A superuser sees everything. A staff user sees rows of the tenants they are a
member of, and changes them only where their membership role is ``admin``.
Another tenant's row answers 403 on its change page, and foreign-key choices
only offer rows the user may see.
"""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils.html import format_html

from audit.models import AuditAction, AuditSource
from audit.services import audit_record
from reach_platform.scoping import tenant_id_of
from tenants.principal import principal_for_request

_BADGE_COLOURS = {
    "healthy": "#1a7f37",
    "active": "#1a7f37",
    "overloaded": "#9a6700",
    "unknown": "#9a6700",
    "draining": "#0969da",
    "sub_healthy": "#bc4c00",
    "expired": "#6e7781",
    "offline": "#cf222e",
    "revoked": "#cf222e",
}


def badge(value: str, label: str | None = None):
    colour = _BADGE_COLOURS.get(value, "#6e7781")
    return format_html(
        '<span class="reach-badge" style="background:{};color:#fff;padding:2px 8px;'
        'border-radius:10px;font-size:11px;white-space:nowrap">{}</span>',
        colour, label or value.replace("_", " "),
    )


class TenantScopedAdmin(admin.ModelAdmin):
    def get_queryset(self, request):
        principal = principal_for_request(request)
        return super().get_queryset(request).for_tenants(principal.tenant_ids)

    def get_object(self, request, object_id, from_field=None):
        # Look the row up unscoped so another tenant's row is a 403, not a
        # silent redirect to the index that hides what happened.
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            return obj
        model = self.model
        field = model._meta.get_field(from_field) if from_field else model._meta.pk
        try:
            obj = model._default_manager.get(**{field.name: field.to_python(object_id)})
        except (model.DoesNotExist, ValidationError, ValueError, TypeError):
            return None
        raise PermissionDenied

    # Django's model permissions are replaced by tenant membership for staff.
    def has_module_permission(self, request) -> bool:
        principal = principal_for_request(request)
        return principal.is_global or bool(principal.tenant_ids)

    def has_view_permission(self, request, obj=None) -> bool:
        principal = principal_for_request(request)
        if obj is None:
            return principal.is_global or bool(principal.tenant_ids)
        return principal.can_read(tenant_id_of(obj)) or principal.can_manage(tenant_id_of(obj))

    def has_add_permission(self, request) -> bool:
        return principal_for_request(request).can_manage_any

    def has_change_permission(self, request, obj=None) -> bool:
        principal = principal_for_request(request)
        if obj is None:
            return principal.can_manage_any
        return principal.can_manage(tenant_id_of(obj))

    def has_delete_permission(self, request, obj=None) -> bool:
        return self.has_change_permission(request, obj)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        related = db_field.related_model
        if hasattr(related, "tenant_path"):
            principal = principal_for_request(request)
            kwargs["queryset"] = related._default_manager.for_tenants(
                principal.manage_tenant_ids
            )
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not principal_for_request(request).can_manage(tenant_id_of(obj)):
            # The form only offers manageable tenants; this guards crafted posts.
            raise PermissionDenied
        audit_admin_write(request, obj, AuditAction.UPDATE if change else AuditAction.CREATE, form)

    def save_formset(self, request, form, formset, change):
        super().save_formset(request, form, formset, change)
        for obj in formset.new_objects:
            audit_admin_write(request, obj, AuditAction.CREATE, None)
        for obj, _changed in formset.changed_objects:
            audit_admin_write(request, obj, AuditAction.UPDATE, None)
        for obj in formset.deleted_objects:
            audit_admin_write(request, obj, AuditAction.DELETE, None)

    def delete_model(self, request, obj):
        audit_admin_write(request, obj, AuditAction.DELETE, None)
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            audit_admin_write(request, obj, AuditAction.DELETE, None)
        super().delete_queryset(request, queryset)


class ReadOnlyTenantScopedAdmin(TenantScopedAdmin):
    """For rows written by the platform itself (usage, audit): the admin only reads them."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


def audit_admin_write(request, obj, action, form) -> None:
    changes = {}
    if form is not None:
        changes = {name: form.cleaned_data.get(name) for name in form.changed_data}
    audit_record(
        principal=principal_for_request(request), source=AuditSource.ADMIN, action=action,
        obj=obj, changes=changes, object_id=str(obj.pk),
    )


class OperatorWritesMixin:
    """Rows only operators (superusers) may add, change or delete; who may see them is
    the admin's own rule."""

    def has_add_permission(self, request) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser
