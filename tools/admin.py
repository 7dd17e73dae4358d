from __future__ import annotations

from django import forms
from django.contrib import admin

from reach_platform.admin_base import TenantScopedAdmin
from tools.models import Tool, ToolGrant
from tools.services import tool_set_secret


class ToolForm(forms.ModelForm):
    secret = forms.CharField(
        required=False, strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Stored encrypted, used only by the gateway; leave empty to "
                  "keep the stored secret.",
    )

    class Meta:
        model = Tool
        fields = [
            "owner_tenant", "name", "display_name", "description", "visibility",
            "when_to_use", "when_not_to_use", "input_schema", "output_description",
            "output_schema", "examples", "url_template", "method", "query_arguments",
            "timeout_ms", "auth_kind", "auth_field_name", "secret", "value_env",
            "client_cert_path", "client_key_path", "ca_file", "calls_per_minute",
            "caller_calls_per_minute",
        ]

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("secret") and cleaned.get("value_env"):
            self.add_error("secret", "Give either a secret or an environment variable, not both.")
        return cleaned

    def _post_clean(self):
        super()._post_clean()
        tool_set_secret(tool=self.instance, secret=self.cleaned_data.get("secret"))


class ToolGrantInline(admin.TabularInline):
    model = ToolGrant
    extra = 0
    autocomplete_fields = ["agent"]


@admin.register(Tool)
class ToolAdmin(TenantScopedAdmin):
    form = ToolForm
    list_display = ["name", "owner_tenant", "method", "url_template", "auth_kind",
                    "secret_source", "visibility", "calls_per_minute",
                    "caller_calls_per_minute"]
    list_filter = ["visibility", "auth_kind", ("owner_tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["name", "display_name", "description"]
    inlines = [ToolGrantInline]
    fieldsets = [
        (None, {"fields": ["owner_tenant", "name", "display_name", "description",
                           "visibility"]}),
        ("For models", {"fields": ["when_to_use", "when_not_to_use", "input_schema",
                                   "output_description", "output_schema", "examples"]}),
        ("Upstream", {"fields": ["url_template", "method", "query_arguments", "timeout_ms"]}),
        ("Authentication (kept in the gateway)", {"fields": [
            "auth_kind", "auth_field_name", "secret", "value_env", "client_cert_path",
            "client_key_path", "ca_file"]}),
        ("Quotas", {"fields": ["calls_per_minute", "caller_calls_per_minute"]}),
    ]

    @admin.display(description="secret")
    def secret_source(self, obj: Tool) -> str:
        if obj.value_env:
            return f"env {obj.value_env}"
        return "stored (encrypted)" if obj.secret_ciphertext else "–"
