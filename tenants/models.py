from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from reach_core import envrefs, filerefs
from reach_platform.scoping import TenantScopedQuerySet
from tenants.choices import ApiKeyScope, CredentialKind, MembershipRole

_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
# Headers the gateway owns; a credential must not be able to overwrite them.
RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "x-request-id"}
)


class Tenant(models.Model):
    tenant_path = "id"

    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=63, unique=True)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Where the tenant's alerts go (budget thresholds, an agent without a healthy
    # instance): a signed POST, retried like task callbacks; empty: shown in the console
    # only. Checked against the endpoint policy at every delivery.
    alert_webhook_url = models.CharField(
        max_length=500, blank=True,
        help_text="HTTPS (or allowed internal) URL receiving this tenant's alerts, signed "
                  "with its signing secret named 'alerts' (else 'default').")

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """Links a staff user to a tenant; the admin and the API scope by these rows."""

    tenant_path = "tenant_id"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reach_memberships"
    )
    role = models.CharField(max_length=16, choices=MembershipRole, default=MembershipRole.ADMIN)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class ApiKey(models.Model):
    """A tenant's API key. Only ``prefix`` and the SHA-256 of the whole key are stored."""

    tenant_path = "tenant_id"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"

    def clean(self) -> None:
        bad = [s for s in self.scopes or [] if s not in ApiKeyScope.values]
        if bad:
            raise ValidationError({"scopes": f"Unknown scopes: {', '.join(bad)}"})

    def is_expired(self, now=None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or timezone.now())

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def is_usable(self, now=None) -> bool:
        return not self.is_revoked and not self.is_expired(now) and self.tenant.is_active

    def status(self, now=None) -> str:
        if self.is_revoked:
            return "revoked"
        if self.is_expired(now):
            return "expired"
        return "active"


class Grant(models.Model):
    """Tenant ``tenant`` may reach ``agent`` (all its capabilities) or one ``capability``.

    The agent's owner gives and takes grants; the grantee sees them, accepts them and may
    give them up. A grant the owner gives on its own is an offer (``accepted_at`` empty)
    until the grantee accepts it: a granted agent counts as the grantee's own in routing,
    so an unasked grant let a tenant publish an agent under another's capability id and
    draw that tenant's calls, inputs and bills to it (a break test).
    """

    tenant_path = "agent__owner_tenant_id"
    tenant_read_paths = (
        "tenant_id", "agent__owner_tenant_id", "capability__agent__owner_tenant_id"
    )

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="grants")
    agent = models.ForeignKey(
        "registry.Agent", null=True, blank=True, on_delete=models.CASCADE, related_name="grants"
    )
    capability = models.ForeignKey(
        "registry.Capability", null=True, blank=True, on_delete=models.CASCADE,
        related_name="grants",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    accepted_at = models.DateTimeField(
        null=True, blank=True, default=timezone.now,
        help_text="When the grantee accepted the grant; empty: offered, not yet in force.",
    )
    accepted_capabilities = models.JSONField(
        null=True, blank=True, editable=False,
        help_text="The capability ids the grant covered when accepted: what the agent "
                  "offers later, or a capability renamed, needs accepting again.",
    )

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(agent__isnull=False, capability__isnull=True)
                    | models.Q(agent__isnull=True, capability__isnull=False)
                ),
                name="grant_agent_xor_capability",
            ),
            models.UniqueConstraint(
                fields=["tenant", "agent"], condition=models.Q(agent__isnull=False),
                name="grant_unique_agent",
            ),
            models.UniqueConstraint(
                fields=["tenant", "capability"], condition=models.Q(capability__isnull=False),
                name="grant_unique_capability",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} → {self.agent or self.capability}"

    def save(self, *args, **kwargs):
        # Accepted (by the grantee's consent or by an operator) without saying what:
        # what is offered now, never whatever the agent offers later.
        if self.accepted_at is not None and self.accepted_capabilities is None:
            self.accepted_capabilities = self.offered_capabilities()
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "accepted_capabilities"}
        super().save(*args, **kwargs)

    def offered_capabilities(self) -> list[str]:
        """The capability ids the grant would cover if accepted now."""
        if self.capability_id is not None:
            return [self.capability.capability_id]
        if self.agent_id is not None:
            return sorted(self.agent.capabilities.values_list("capability_id", flat=True))
        return []  # neither: refused by ``clean`` and the check constraint

    def offered_but_not_own(self) -> list[str]:
        """The offer less the ids the grantee's own agents offer (an offer may include
        them to draw the grantee's calls)."""
        agents = self._meta.get_field("agent").related_model.objects
        own = set(agents.filter(owner_tenant_id=self.tenant_id)
                  .values_list("capabilities__capability_id", flat=True))
        return [c for c in self.offered_capabilities() if c not in own]

    def owning_tenant_id(self) -> int | None:
        if self.agent_id:
            return self.agent.owner_tenant_id
        if self.capability_id:
            return self.capability.agent.owner_tenant_id
        return None

    def clean(self) -> None:
        if (self.agent_id is None) == (self.capability_id is None):
            raise ValidationError("A grant names exactly one of: an agent, a capability.")


class Credential(models.Model):
    """A tenant's downstream secret for one agent.

    The secret is either ``secret_ciphertext`` (Fernet, keys from the
    environment) or ``value_env`` (the name of an environment variable the
    gateway reads). It is write-only: nothing renders it back.
    """

    tenant_path = "tenant_id"
    secret_fields = ("secret_ciphertext", "secret")

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="credentials")
    agent = models.ForeignKey(
        "registry.Agent", on_delete=models.CASCADE, related_name="credentials"
    )
    kind = models.CharField(max_length=16, choices=CredentialKind)
    # Header or query parameter name; unused for bearer and mTLS.
    field_name = models.CharField(max_length=128, blank=True)
    secret_ciphertext = models.BinaryField(null=True, blank=True, editable=False)
    value_env = models.CharField(max_length=128, blank=True)
    client_cert_path = models.CharField(max_length=500, blank=True)
    client_key_path = models.CharField(max_length=500, blank=True)
    # CA bundle that verifies the agent's server certificate (mTLS); empty = system CAs.
    ca_file = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "agent", "kind", "field_name"], name="credential_unique_slot"
            )
        ]

    def __str__(self) -> str:
        target = f" {self.field_name}" if self.field_name else ""
        return f"{self.tenant} → {self.agent}: {self.kind}{target}"

    @property
    def has_secret(self) -> bool:
        return bool(self.secret_ciphertext) or bool(self.value_env)

    @property
    def secret_source(self) -> str:
        if self.value_env:
            return f"environment variable {self.value_env}"
        if self.secret_ciphertext:
            return "stored encrypted"
        if self.kind == CredentialKind.MTLS:
            return "certificate files"
        return "not set"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.kind in (CredentialKind.HEADER, CredentialKind.QUERY):
            if not self.field_name:
                errors["field_name"] = "Required for header and query credentials."
            elif self.kind == CredentialKind.HEADER and (
                not _HEADER_NAME.match(self.field_name)
                or self.field_name.lower() in RESERVED_HEADERS
                or self.field_name.lower().startswith("x-reach-")
            ):
                errors["field_name"] = "Not a header name the gateway may set."
        elif self.field_name:
            errors["field_name"] = "Only header and query credentials have a field name."
        # The key is a file, or an environment variable holding the PEM text or a path.
        if self.kind == CredentialKind.MTLS and not (
            self.client_cert_path and (self.client_key_path or self.value_env)
        ):
            errors["client_cert_path"] = "mTLS needs a certificate and a key (file or value_env)."
        owner = self.tenant.slug if self.tenant_id else ""
        why = self.value_env and envrefs.refusal(self.value_env, settings.CREDENTIAL_ENV,
                                                 owner)
        if why:
            errors["value_env"] = why
        errors.update(filerefs.problems(self, settings.CREDENTIAL_FILES, owner))
        if errors:
            raise ValidationError(errors)


class Quota(models.Model):
    """Limits for a tenant, optionally narrowed to one agent or one capability."""

    tenant_path = "tenant_id"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="quotas")
    agent = models.ForeignKey(
        "registry.Agent", null=True, blank=True, on_delete=models.CASCADE, related_name="quotas"
    )
    capability = models.ForeignKey(
        "registry.Capability", null=True, blank=True, on_delete=models.CASCADE,
        related_name="quotas",
    )
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    burst = models.PositiveIntegerField(null=True, blank=True)
    monthly_requests = models.PositiveBigIntegerField(null=True, blank=True)
    monthly_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    monthly_cost = models.DecimalField(max_digits=14, decimal_places=4, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=~models.Q(agent__isnull=False, capability__isnull=False),
                name="quota_agent_or_capability_not_both",
            ),
        ]

    def __str__(self) -> str:
        scope = self.agent or self.capability or "all agents"
        return f"{self.tenant} · {scope}"

    def clean(self) -> None:
        if self.agent_id and self.capability_id:
            raise ValidationError("A quota narrows to an agent or a capability, not both.")
