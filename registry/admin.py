from __future__ import annotations

import json
import unicodedata

from django.contrib import admin, messages
from django.db.models import Count, F, Q
from django.urls import reverse
from django.utils.html import format_html

from audit.models import AuditAction
from reach_platform.admin_base import (
    OperatorWritesMixin,
    ReadOnlyTenantScopedAdmin,
    TenantScopedAdmin,
    audit_admin_write,
    badge,
)
from registry.choices import InstanceState
from registry.learning import learned_phrases_set_active
from registry.models import (
    Agent,
    AgentToken,
    Capability,
    Instance,
    LearnedPhrase,
    Namespace,
    ParameterSynonym,
    RouteFeedback,
)
from registry.services import instance_drain, instance_resume
from tenants.principal import principal_for_request


class SharedAdmin(OperatorWritesMixin, admin.ModelAdmin):
    """Rows shared by every tenant: everyone with a tenant reads, superusers write."""

    def has_module_permission(self, request) -> bool:
        principal = principal_for_request(request)
        return principal.is_global or bool(principal.tenant_ids)

    def has_view_permission(self, request, obj=None) -> bool:
        return self.has_module_permission(request)


@admin.register(Namespace)
class NamespaceAdmin(SharedAdmin):
    list_display = ["name", "description"]
    search_fields = ["name"]


@admin.register(ParameterSynonym)
class ParameterSynonymAdmin(SharedAdmin):
    list_display = ["synonym", "canonical"]
    list_filter = ["canonical"]
    search_fields = ["synonym", "canonical"]


def _then_the_rest(model, layout: list) -> list:
    """``layout`` followed by every other editable, non-relation field of ``model``."""
    placed = {name for row in layout for name in ([row] if isinstance(row, str) else row)}
    rest = [
        f.name for f in model._meta.fields
        if f.editable and not f.primary_key and not f.is_relation and f.name not in placed
    ]
    return [*layout, *rest]


class CapabilityInline(admin.StackedInline):
    model = Capability
    extra = 0
    show_change_link = True
    # Related fields share a row; a model field not placed here still shows, last.
    fields = _then_the_rest(Capability, [
        ("capability_id", "display_name", "kind", "version"),
        "description", "keywords", ("examples", "not_for"),
        ("languages", "directions", "formats", "max_input_chars"),
        ("timeout_ms", "qps", "burst"), "path",
        "input_schema", "output_schema", "param_map",
    ])
    classes = ["collapse"]


class InstanceInline(admin.TabularInline):
    model = Instance
    extra = 0
    show_change_link = True
    fields = ["endpoint", "reach_mode", "state", "health", "last_heartbeat_at", "lease_expires_at"]
    # Heartbeats, the sweep and the drain action write these; a form would save stale ones.
    readonly_fields = ["state", "health", "last_heartbeat_at", "lease_expires_at"]

    @admin.display(description="health")
    def health(self, obj: Instance):
        return badge(obj.health_tier) if obj.pk else "-"


@admin.register(Agent)
class AgentAdmin(TenantScopedAdmin):
    list_display = [
        "name", "namespace", "version", "protocol", "owner_tenant", "team", "internal_only",
        "instances_health", "priority", "weight", "activity",
    ]
    list_filter = ["namespace", "protocol", "visibility", "internal_only",
                   ("owner_tenant", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["namespace", "owner_tenant"]
    search_fields = ["name", "description", "team", "capabilities__capability_id"]
    inlines = [CapabilityInline, InstanceInline]
    fieldsets = [
        (None, {"fields": [
            ("namespace", "name", "version"), "description", "protocol",
            ("owner_tenant", "team"), ("visibility", "internal_only"),
        ]}),
        ("Routing", {"fields": [("weight", "priority", "traffic_percent")]}),
        ("Liveness", {"fields": [
            ("heartbeat_interval_seconds", "lease_ttl_seconds", "probe_path"),
        ]}),
        ("Prices", {"fields": [("price_input_per_1k", "price_output_per_1k", "price_per_call")]}),
        ("Connection pool", {"fields": [("pool_max_connections", "pool_idle_seconds")]}),
        ("Source", {"fields": ["source_descriptor"], "classes": ["collapse"]}),
    ]
    readonly_fields = ["source_descriptor"]

    @admin.display(description="activity")
    def activity(self, obj: Agent):
        return format_html('<a href="{}">success, latency, health</a>',
                           reverse("console-agent", args=[obj.pk]))

    @admin.display(description="last descriptor registered")
    def source_descriptor(self, obj: Agent):
        # Secrets are refused in descriptors, so the source is safe to show as sent.
        return format_html("<pre>{}</pre>", json.dumps(obj.descriptor, indent=2,
                                                       ensure_ascii=False))

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            healthy_count=Count("instances", filter=Q(instances__state=InstanceState.HEALTHY)),
            instance_count=Count("instances"),
        )

    @admin.display(description="instances")
    def instances_health(self, obj: Agent):
        if not obj.instance_count:
            return badge("offline", "no instances")
        state = "healthy" if obj.healthy_count == obj.instance_count else (
            "unknown" if obj.healthy_count else "offline"
        )
        return badge(state, f"{obj.healthy_count}/{obj.instance_count} healthy")


@admin.register(Capability)
class CapabilityAdmin(TenantScopedAdmin):
    list_display = ["capability_id", "display_name", "agent", "kind", "version", "timeout_ms"]
    list_filter = ["kind", "agent__namespace"]
    list_select_related = ["agent__namespace"]
    search_fields = ["capability_id", "display_name", "description", "agent__name"]
    autocomplete_fields = ["agent"]


@admin.register(Instance)
class InstanceAdmin(TenantScopedAdmin):
    list_display = [
        "agent", "endpoint", "reach_mode", "state_badge", "tier_badge", "load",
        "last_heartbeat_at", "lease_expires_at",
    ]
    list_filter = ["state", "health_tier", "reach_mode", "agent__namespace"]
    list_select_related = ["agent__namespace"]
    search_fields = ["endpoint", "agent__name"]
    autocomplete_fields = ["agent"]
    # Heartbeats, the sweep and the drain action write these; a form would save stale ones.
    readonly_fields = [
        "state", "state_changed_at", "health_tier", "lease_expires_at", "last_heartbeat_at",
        "cpu", "memory", "queue_depth", "in_flight", "processed_recent", "errors_recent",
        "capabilities_available", "flaps", "last_flap_at", "created_at",
    ]
    actions = ["drain", "resume"]

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: Instance):
        return badge(obj.state)

    @admin.display(description="health tier", ordering="health_tier")
    def tier_badge(self, obj: Instance):
        return badge(obj.health_tier)

    @admin.display(description="load")
    def load(self, obj: Instance) -> str:
        return f"cpu {obj.cpu:.0%} · mem {obj.memory:.0%} · queue {obj.queue_depth}"

    @admin.action(description="Drain selected instances (no new calls)")
    def drain(self, request, queryset):
        principal = principal_for_request(request)
        drained = 0
        for instance in queryset.select_related("agent"):
            if principal.can_manage(instance.agent.owner_tenant_id):
                instance_drain(instance=instance)
                audit_admin_write(request, instance, AuditAction.ACTION, None)
                drained += 1
        self.message_user(request, f"Draining {drained} instance(s).", messages.SUCCESS)

    @admin.action(description="Resume selected drained instances (calls again)")
    def resume(self, request, queryset):
        principal = principal_for_request(request)
        resumed = 0
        for instance in queryset.select_related("agent"):
            if principal.can_manage(instance.agent.owner_tenant_id):
                before = instance.state
                instance_resume(instance=instance)
                if instance.state != before:
                    audit_admin_write(request, instance, AuditAction.ACTION, None)
                    resumed += 1
        self.message_user(request, f"Resumed {resumed} instance(s).", messages.SUCCESS)


@admin.register(AgentToken)
class AgentTokenAdmin(TenantScopedAdmin):
    """Agent tokens are issued by registration only; here they are seen and revoked."""

    list_display = ["prefix", "agent", "status_badge", "created_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["agent__namespace"]
    search_fields = ["prefix", "agent__name"]
    readonly_fields = ["prefix", "agent", "created_at", "revoked_at"]
    fields = readonly_fields
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.display(description="status")
    def status_badge(self, obj: AgentToken):
        return badge("revoked" if obj.revoked_at else "active")

    @admin.action(description="Revoke selected agent tokens")
    def revoke(self, request, queryset):
        from django.utils import timezone

        principal = principal_for_request(request)
        revoked = 0
        for token in queryset.select_related("agent"):
            if principal.can_manage(token.agent.owner_tenant_id) and token.revoked_at is None:
                token.revoked_at = timezone.now()
                token.save(update_fields=["revoked_at"])
                audit_admin_write(request, token, AuditAction.ACTION, None)
                revoked += 1
        self.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS)


_TENANT_FILTER = ("tenant", admin.RelatedOnlyFieldListFilter)


def shown_intent(text: str) -> str:
    """A caller's intent as an operator should read it: format characters (bidi
    overrides, zero-width spaces) named, not obeyed (a break test's "\u202egist of memo"
    was listed reversed)."""
    if text.isascii():
        return text
    return "".join(f"<U+{ord(c):04X}>" if unicodedata.category(c) == "Cf" else c
                   for c in text)


@admin.register(RouteFeedback)
class RouteMissAdmin(ReadOnlyTenantScopedAdmin):
    """Route misses: feedback whose capability is not what the router chose (or the
    router chose nothing), with what learning made of it (``registry.learning``).
    Confirmations teach nothing and are left out."""

    list_display = ["created_at", "tenant", "short_intent", "routed_to_or_none",
                    "capability_id", "source", "resolution"]
    list_filter = ["source", _TENANT_FILTER, ("learned", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant", "learned"]
    search_fields = ["intent", "capability_id", "routed_to"]
    date_hierarchy = "created_at"

    def get_queryset(self, request):
        return super().get_queryset(request).exclude(routed_to=F("capability_id"))

    @admin.display(description="intent")
    def short_intent(self, obj: RouteFeedback) -> str:
        return shown_intent(obj.intent if len(obj.intent) <= 80 else obj.intent[:79] + "…")

    @admin.display(description="routed to", ordering="routed_to")
    def routed_to_or_none(self, obj: RouteFeedback) -> str:
        return obj.routed_to or "(nothing)"

    @admin.display(description="resolution")
    def resolution(self, obj: RouteFeedback):
        if obj.learned_at is None:
            return badge("unknown", "not learned yet")
        phrase = obj.learned
        if phrase is None:
            return "-"
        state = "active" if phrase.routable else "expired" if phrase.active else "revoked"
        label = ("routing" if phrase.routable else
                 "waiting for support" if phrase.active else "deactivated")
        url = reverse("admin:registry_learnedphrase_change", args=[phrase.pk])
        return format_html('<a href="{}">{}</a> ({}) {}', url, phrase.phrase[:60],
                           phrase.support, badge(state, label))


@admin.register(LearnedPhrase)
class LearnedPhraseAdmin(ReadOnlyTenantScopedAdmin):
    """Phrases learned from route feedback. Only the fold writes them; an operator
    deactivates (or reactivates) one, which the route table follows at once."""

    list_display = ["phrase", "tenant", "capability_id", "support", "explicit_support",
                    "status", "updated_at"]
    list_filter = ["routable", "active", _TENANT_FILTER]
    list_select_related = ["tenant"]
    search_fields = ["phrase", "capability_id"]
    actions = ["deactivate", "reactivate"]

    @admin.display(description="status")
    def status(self, obj: LearnedPhrase):
        if obj.routable:
            return badge("active", "routing")
        return badge("expired", "waiting for support") if obj.active else \
            badge("revoked", "deactivated")

    def _set_active(self, request, queryset, active: bool) -> int:
        principal = principal_for_request(request)
        mine = [p for p in queryset if principal.can_manage(p.tenant_id)]
        changed = learned_phrases_set_active(phrases=mine, active=active)
        for phrase in mine:
            audit_admin_write(request, phrase, AuditAction.ACTION, None)
        return changed

    @admin.action(description="Deactivate selected learned phrases (stop routing by them)")
    def deactivate(self, request, queryset):
        changed = self._set_active(request, queryset, False)
        self.message_user(request, f"Deactivated {changed} phrase(s).", messages.SUCCESS)

    @admin.action(description="Reactivate selected learned phrases")
    def reactivate(self, request, queryset):
        changed = self._set_active(request, queryset, True)
        self.message_user(request, f"Reactivated {changed} phrase(s).", messages.SUCCESS)
