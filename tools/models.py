"""Tools: the external APIs agents call through the gateway, registered like agents.

A tool is a manual for a model (what it does, when to use it and when not, its input
JSON Schema, an example) and a recipe for the gateway (the upstream URL template, method
and request mapping, its authentication, timeout and quotas). The tool's secret lives
here encrypted (or as an environment variable's name) and only the gateway uses it:
agents never see it, no API or admin page renders it.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

from reach_core import envrefs, filerefs
from reach_core.schemas import schema_problems
from reach_platform.scoping import TenantScopedQuerySet
from tenants.choices import CredentialKind

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,128}")
METHODS = [(m, m) for m in ("GET", "POST", "PUT", "PATCH", "DELETE")]
AUTH_KINDS = [("none", "None"), *CredentialKind.choices]


class Tool(models.Model):
    tenant_path = "owner_tenant_id"
    secret_fields = ("secret_ciphertext", "secret")

    owner_tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE,
                                     related_name="tools")
    name = models.CharField(
        max_length=64, unique=True,
        validators=[RegexValidator(NAME_PATTERN, "lower-case letters, digits, '-' and '_', "
                                                 "64 at most, starting with a letter or digit")],
        help_text="How callers and models name it: POST /v1/tools/<name>/call.")
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(help_text="What it does, in one or two sentences.")
    when_to_use = models.TextField(blank=True)
    when_not_to_use = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict, blank=True,
                                    help_text="JSON Schema of the arguments (an object).")
    output_description = models.TextField(blank=True)
    output_schema = models.JSONField(default=dict, blank=True)
    examples = models.JSONField(default=list, blank=True, help_text=(
        'e.g. [{"arguments": {"sku": "A-100"}, "use": "stock of one article"}]'))
    timeout_ms = models.PositiveIntegerField(default=10_000)
    visibility = models.CharField(max_length=16, default="private", choices=[
        ("private", "Private (owner, granted tenants and agents)"),
        ("public", "Public (every tenant)")])
    # The upstream: "{name}" in the template takes the argument of that name (path);
    # query_arguments go to the query string; the rest form the JSON body (not for GET
    # and DELETE, where they go to the query string too).
    url_template = models.CharField(max_length=500, help_text=(
        "e.g. https://inventory.internal/api/stock/{sku}"))
    method = models.CharField(max_length=8, choices=METHODS, default="GET")
    query_arguments = models.JSONField(default=list, blank=True)
    # Authentication towards the external system, applied by the gateway only.
    auth_kind = models.CharField(max_length=16, choices=AUTH_KINDS, default="none")
    auth_field_name = models.CharField(max_length=128, blank=True,
                                       help_text="Header or query parameter name.")
    secret_ciphertext = models.BinaryField(null=True, blank=True, editable=False)
    value_env = models.CharField(max_length=128, blank=True, help_text=(
        "Or: the environment variable of the gateway processes holding the secret."))
    client_cert_path = models.CharField(max_length=500, blank=True)
    client_key_path = models.CharField(max_length=500, blank=True)
    ca_file = models.CharField(max_length=500, blank=True)
    # Quotas: per caller (an agent, or a tenant calling with its key) and in total
    # towards the external system, shared by every gateway process. Empty: no limit.
    caller_calls_per_minute = models.PositiveIntegerField(null=True, blank=True)
    calls_per_minute = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def has_secret(self) -> bool:
        return bool(self.secret_ciphertext) or bool(self.value_env)

    def clean(self) -> None:
        problems = {}
        if self.input_schema and self.input_schema.get("type", "object") != "object":
            problems["input_schema"] = "must describe an object (the arguments)"
        for name in ("input_schema", "output_schema"):
            found = schema_problems(getattr(self, name) or {})
            if found:
                problems[name] = "; ".join(found)
        if any(c in self.auth_field_name for c in "\r\n\x00:") or (
                self.auth_field_name and not _TOKEN.fullmatch(self.auth_field_name)):
            problems["auth_field_name"] = "must be a header or parameter name (letters, " \
                "digits and !#$%&'*+-.^_`|~)"
        if not isinstance(self.examples, list):
            problems["examples"] = "must be a list"
        if not isinstance(self.query_arguments, list) or not all(
                isinstance(a, str) for a in self.query_arguments):
            problems["query_arguments"] = "must be a list of argument names"
        if self.auth_kind in ("header", "query") and not self.auth_field_name:
            problems["auth_field_name"] = f"is needed for {self.auth_kind} authentication"
        if self.auth_kind == "mtls" and not self.client_cert_path:
            problems["client_cert_path"] = "is needed for mTLS"
        owner = self.owner_tenant.slug if self.owner_tenant_id else ""
        why = self.value_env and envrefs.refusal(self.value_env, settings.CREDENTIAL_ENV,
                                                 owner)
        if why:
            problems["value_env"] = why
        problems.update(filerefs.problems(self, settings.CREDENTIAL_FILES, owner))
        if problems:
            raise ValidationError(problems)


class ToolGrant(models.Model):
    """Tenant ``tenant`` (with its keys and agents) or one ``agent`` may call ``tool``."""

    tenant_path = "tool__owner_tenant_id"
    tenant_read_paths = ("tool__owner_tenant_id", "tenant_id", "agent__owner_tenant_id")

    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, related_name="grants")
    tenant = models.ForeignKey("tenants.Tenant", null=True, blank=True,
                               on_delete=models.CASCADE, related_name="tool_grants")
    agent = models.ForeignKey("registry.Agent", null=True, blank=True,
                              on_delete=models.CASCADE, related_name="tool_grants")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(tenant__isnull=False, agent__isnull=True)
                | models.Q(tenant__isnull=True, agent__isnull=False),
                name="tool_grant_tenant_or_agent"),
            # One grant per grantee: a second would be revoked by nobody (deleting one
            # would leave the access in place).
            models.UniqueConstraint(fields=["tool", "tenant"], name="tool_grant_unique_tenant",
                                    condition=models.Q(tenant__isnull=False)),
            models.UniqueConstraint(fields=["tool", "agent"], name="tool_grant_unique_agent",
                                    condition=models.Q(agent__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.tool} → {self.tenant or self.agent}"
