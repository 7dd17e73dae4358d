from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from audit.models import AuditAction
from reach_platform.admin_base import (
    ReadOnlyTenantScopedAdmin,
    TenantScopedAdmin,
    audit_admin_write,
    badge,
)
from tasks.models import CallbackDelivery, SigningSecret, Task, TaskEvent
from tasks.services import delivery_retrigger, signing_secret_create
from tenants.principal import principal_for_request

_STATE_BADGES = {"completed": "healthy", "failed": "offline", "rejected": "offline",
                 "canceled": "expired", "working": "draining", "submitted": "draining",
                 "input-required": "overloaded", "auth-required": "overloaded",
                 "pending": "overloaded", "delivered": "healthy", "exhausted": "offline"}


class TaskEventInline(admin.TabularInline):
    model = TaskEvent
    fields = ["at", "state", "message", "progress"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class CallbackDeliveryInline(admin.TabularInline):
    model = CallbackDelivery
    verbose_name_plural = "callback deliveries"
    fields = ["id", "state", "status", "attempts", "last_status", "last_error",
              "next_attempt_at", "delivered_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Task)
class TaskAdmin(ReadOnlyTenantScopedAdmin):
    """Tasks, their history and callback deliveries; undelivered callbacks can be sent
    again from here (action) as from the API."""

    list_display = ["id", "tenant", "state_badge", "capability", "agent", "attempts",
                    "callback_badge", "created_at", "finished_at"]
    list_filter = ["state", ("tenant", admin.RelatedOnlyFieldListFilter),
                   "deliveries__status"]
    list_select_related = ["tenant", "agent__namespace"]
    search_fields = ["id", "request_id", "idempotency_key", "capability", "agent__name"]
    readonly_fields = ["id", "tenant", "state", "request_id", "idempotency_key", "capability",
                       "agent", "instance_id", "message", "progress", "result", "error",
                       "attempts", "callback_url", "signing_secret", "created_at",
                       "updated_at", "finished_at", "deadline_at"]
    exclude = ["request", "messages", "claim", "lease_expires_at", "run_after",
               "push_token_hash", "fingerprint", "caller_key", "agent_task_id",
               "agent_context_id"]
    inlines = [TaskEventInline, CallbackDeliveryInline]
    actions = ["redeliver_callbacks"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("deliveries").distinct()

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: Task):
        return badge(_STATE_BADGES.get(obj.state, obj.state), obj.state)

    @admin.display(description="callback")
    def callback_badge(self, obj: Task):
        if not obj.callback_url:
            return "-"
        statuses = {d.status for d in obj.deliveries.all()}
        for status in ("exhausted", "pending", "delivered"):
            if status in statuses:
                label = "undelivered" if status == "exhausted" else status
                return badge(_STATE_BADGES[status], label)
        return "-"

    @admin.action(description="Re-deliver undelivered callbacks")
    def redeliver_callbacks(self, request, queryset):
        principal = principal_for_request(request)
        sent = 0
        for task in queryset.prefetch_related("deliveries"):
            if not principal.can_manage(task.tenant_id):
                continue
            for delivery in task.deliveries.all():
                if delivery.status != "delivered":
                    delivery_retrigger(delivery=delivery)
                    audit_admin_write(request, task, AuditAction.ACTION, None)
                    sent += 1
        self.message_user(request, f"{sent} callback deliveries will be sent again now.",
                          messages.SUCCESS if sent else messages.WARNING)


class SigningSecretForm(forms.ModelForm):
    class Meta:
        model = SigningSecret
        fields = ["tenant", "name"]


@admin.register(SigningSecret)
class SigningSecretAdmin(TenantScopedAdmin):
    """The secret is generated here and shown once, on the page after saving."""

    form = SigningSecretForm
    list_display = ["name", "tenant", "created_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["tenant"]
    search_fields = ["name", "tenant__slug"]
    readonly_fields = ["created_at"]

    def get_readonly_fields(self, request, obj=None):
        return [*self.readonly_fields, "tenant", "name"] if obj else self.readonly_fields

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        if not principal_for_request(request).can_manage(obj.tenant_id):
            raise PermissionDenied
        secret, plaintext = signing_secret_create(tenant=obj.tenant, name=obj.name)
        obj.pk = secret.pk
        request._reach_issued_secret = (secret, plaintext)
        audit_admin_write(request, secret, AuditAction.CREATE, form)
        return None

    def response_add(self, request, obj, post_url_continue=None):
        issued = getattr(request, "_reach_issued_secret", None)
        if issued is None:
            return super().response_add(request, obj, post_url_continue)
        secret, plaintext = issued
        return TemplateResponse(request, "admin/tasks/signingsecret/issued.html", {
            **self.admin_site.each_context(request), "secret": secret,
            "plaintext": plaintext})
