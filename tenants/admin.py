from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse

from audit.models import AuditAction
from reach_platform.admin_base import (
    OperatorWritesMixin,
    TenantScopedAdmin,
    audit_admin_write,
    badge,
)
from tenants.choices import ApiKeyScope
from tenants.models import ApiKey, Credential, Grant, Membership, Quota, Tenant
from tenants.principal import principal_for_request
from tenants.services import (
    api_key_issue,
    api_key_revoke,
    credential_set_secret,
    grant_accept,
    grant_given_at,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]

    # Memberships decide who sees which tenant: only superusers hand them out.
    def has_add_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_view_permission(self, request, obj=None) -> bool:
        return True


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    list_display = ["slug", "name", "active_badge", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]

    @admin.display(description="status", ordering="is_active")
    def active_badge(self, obj: Tenant):
        if obj.is_active:
            return badge("active")
        return badge("offline", "disabled")

    def has_add_permission(self, request) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser


class ApiKeyForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=ApiKeyScope.choices, widget=forms.CheckboxSelectMultiple,
        initial=[ApiKeyScope.INVOKE],
    )

    class Meta:
        model = ApiKey
        fields = ["tenant", "name", "scopes", "expires_at"]


@admin.register(ApiKey)
class ApiKeyAdmin(TenantScopedAdmin):
    form = ApiKeyForm
    list_display = [
        "prefix", "name", "tenant", "scope_list", "status_badge", "expires_at", "last_used_at",
        "created_at",
    ]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter),
                   ("revoked_at", admin.EmptyFieldListFilter)]
    list_select_related = ["tenant"]
    search_fields = ["prefix", "name", "tenant__slug"]
    readonly_fields = ["prefix", "revoked_at", "last_used_at", "created_at"]
    actions = ["revoke_keys"]

    def get_readonly_fields(self, request, obj=None):
        return [*self.readonly_fields, "tenant"] if obj else self.readonly_fields

    @admin.display(description="scopes")
    def scope_list(self, obj: ApiKey) -> str:
        return ", ".join(obj.scopes)

    @admin.display(description="status")
    def status_badge(self, obj: ApiKey):
        return badge(obj.status())

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        # A new key goes through the service so the plaintext exists only in
        # this response; it is never put in a message, session or log.
        request._reach_issued_plaintext = api_key_issue(api_key=obj)
        audit_admin_write(request, obj, AuditAction.CREATE, form)
        return None

    def response_add(self, request, obj, post_url_continue=None):
        plaintext = getattr(request, "_reach_issued_plaintext", None)
        if plaintext is None:
            return super().response_add(request, obj, post_url_continue)
        response = TemplateResponse(
            request, "admin/tenants/apikey/issued.html",
            {**self.admin_site.each_context(request), "api_key": obj, "plaintext": plaintext},
        )
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected API keys")
    def revoke_keys(self, request, queryset):
        principal = principal_for_request(request)
        revoked = 0
        for api_key in queryset:
            if principal.can_manage(api_key.tenant_id) and not api_key.is_revoked:
                api_key_revoke(api_key=api_key)
                audit_admin_write(request, api_key, AuditAction.ACTION, None)
                revoked += 1
        self.message_user(request, f"Revoked {revoked} key(s).", messages.SUCCESS)


@admin.register(Grant)
class GrantAdmin(TenantScopedAdmin):
    list_display = ["tenant", "agent", "capability", "offered", "created_at", "accepted_at",
                    "accepted_capabilities"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["tenant", "agent__namespace", "capability"]
    search_fields = ["tenant__slug", "agent__name", "capability__capability_id"]
    autocomplete_fields = ["agent", "capability"]
    # Only the grantee's acceptance sets it (``accept``), never the owner's form.
    readonly_fields = ["accepted_at"]
    actions = ["accept"]

    def save_model(self, request, obj, form, change):
        if not change:
            obj.accepted_at = grant_given_at(
                grantee_consents=principal_for_request(request).can_manage(obj.tenant_id))
        super().save_model(request, obj, form, change)

    def has_delete_permission(self, request, obj=None) -> bool:
        # The grantee may give a grant up.
        if obj is not None and principal_for_request(request).can_manage(obj.tenant_id):
            return True
        return super().has_delete_permission(request, obj)

    @admin.display(description="offers")
    def offered(self, grant: Grant) -> str:
        return ", ".join(grant.offered_capabilities())

    @admin.action(description="Accept the selected grants offered to your tenants "
                              "(never for capability ids your own agents offer)")
    def accept(self, request, queryset):
        # A form has no place to name the ids: what is offered, less the grantee's own
        # ids (an offer may include them to draw its calls; the API names ids instead).
        principal = principal_for_request(request)
        accepted = 0
        for grant in queryset:
            if grant.accepted_at is None and principal.can_manage(grant.tenant_id):
                grant_accept(grant=grant, capabilities=grant.offered_but_not_own())
                audit_admin_write(request, grant, AuditAction.ACTION, None)
                accepted += 1
        self.message_user(request, f"Accepted {accepted} grant(s).", messages.SUCCESS)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        # The grantee may be any tenant: granting is how agents cross tenants.
        if db_field.name == "tenant":
            kwargs["queryset"] = Tenant.objects.filter(is_active=True)
            return admin.ModelAdmin.formfield_for_foreignkey(self, db_field, request, **kwargs)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class CredentialForm(forms.ModelForm):
    secret = forms.CharField(
        required=False, strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Stored encrypted; leave empty to keep the stored secret.",
    )

    class Meta:
        model = Credential
        fields = [
            "tenant", "agent", "kind", "field_name", "secret", "value_env",
            "client_cert_path", "client_key_path",
        ]

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("secret") and cleaned.get("value_env"):
            self.add_error("secret", "Give either a secret or an environment variable, not both.")
        return cleaned

    def _post_clean(self):
        super()._post_clean()
        credential_set_secret(credential=self.instance, secret=self.cleaned_data.get("secret"))


@admin.register(Credential)
class CredentialAdmin(TenantScopedAdmin):
    form = CredentialForm
    list_display = ["tenant", "agent", "kind", "field_name", "secret_source", "updated_at"]
    list_filter = ["kind", ("tenant", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["tenant", "agent__namespace"]
    search_fields = ["tenant__slug", "agent__name", "field_name", "value_env"]
    autocomplete_fields = ["agent"]

    @admin.display(description="secret")
    def secret_source(self, obj: Credential) -> str:
        return obj.secret_source


@admin.register(Quota)
class QuotaAdmin(OperatorWritesMixin, TenantScopedAdmin):
    list_display = [
        "tenant", "agent", "capability", "requests_per_minute", "burst", "monthly_requests",
        "monthly_tokens", "monthly_cost",
    ]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["tenant", "agent__namespace", "capability"]
    search_fields = ["tenant__slug", "agent__name", "capability__capability_id"]
    autocomplete_fields = ["agent", "capability"]
    # Quotas are set by operators: tenant admins see their tenants' quotas, read only.
