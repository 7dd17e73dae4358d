from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from reach_core.endpoints import EndpointRefused, check_registration
from reach_platform.endpoints import endpoint_policy
from reach_platform.serializers import (
    CleanModelSerializer,
    ScopedPrimaryKeyField,
    ScopedSlugField,
    StrictCharField,
    StrictModelSerializer,
    StrictSlugRelatedField,
    TenantDefault,
    check_secret,
)
from tenants.choices import ApiKeyScope
from tenants.models import ApiKey, Credential, Grant, Quota, Tenant


def _related(model, field: str):
    """The queryset a relation of ``model`` points into, found through the ORM: the
    tenant x agent relations name registry's models without importing them (tenants
    is a leaf app)."""
    return model._meta.get_field(field).related_model.objects.all()


def tenant_field() -> ScopedSlugField:
    return ScopedSlugField(
        slug_field="slug", queryset=Tenant.objects.all(), default=TenantDefault(),
        help_text="Tenant slug; defaults to the caller's tenant when it has only one.",
    )


class TenantSerializer(StrictModelSerializer):
    class Meta:
        model = Tenant
        fields = ["id", "name", "slug", "is_active", "alert_webhook_url", "created_at"]
        read_only_fields = ["id", "created_at"]

    def validate_slug(self, value: str) -> str:
        """Fixed once the tenant exists: the slug names it in the environment variables
        lent to it (``{tenant}`` in REACH_CREDENTIAL_ENV). A tenant that could rename
        itself could take over a freed or provisioned name's secrets (a break test: beta
        renamed itself alpha-x after alpha-x moved, and read alpha-x's lent token)."""
        if self.instance is not None and value != self.instance.slug:
            raise serializers.ValidationError(
                "A tenant's slug cannot change through the API: an operator renames a "
                "tenant in the admin (and moves its lent environment variables).")
        return value

    def validate_alert_webhook_url(self, value: str) -> str:
        """Where alerts may be sent is where agents may be: the endpoint policy (checked
        again at every delivery, against what the name resolves to then)."""
        if not value:
            return value
        try:
            return check_registration(value, endpoint_policy())
        except EndpointRefused as exc:
            raise serializers.ValidationError(str(exc)) from exc


class ApiKeySerializer(StrictModelSerializer):
    tenant = tenant_field()
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ApiKeyScope.choices), allow_empty=False,
        default=lambda: [ApiKeyScope.INVOKE],
    )
    status = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = [
            "id", "tenant", "name", "prefix", "scopes", "expires_at", "revoked_at",
            "last_used_at", "created_at", "status",
        ]
        read_only_fields = ["id", "prefix", "revoked_at", "last_used_at", "created_at"]

    @extend_schema_field(serializers.ChoiceField(choices=["active", "revoked", "expired"]))
    def get_status(self, obj: ApiKey) -> str:
        return obj.status()


class ApiKeyIssuedSerializer(ApiKeySerializer):
    key = serializers.CharField(
        read_only=True, help_text="The key itself. Shown in this response only; store it now."
    )

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]


class GrantSerializer(CleanModelSerializer):
    tenant = StrictSlugRelatedField(
        slug_field="slug", queryset=Tenant.objects.filter(is_active=True),
        help_text="The tenant that may reach the agent or capability (the grantee).",
    )
    agent = ScopedPrimaryKeyField(
        queryset=_related(Grant, "agent"), required=False, allow_null=True
    )
    capability = ScopedPrimaryKeyField(
        queryset=_related(Grant, "capability"), required=False, allow_null=True
    )

    offered_capabilities = serializers.SerializerMethodField(
        help_text="The capability ids the grant reaches now: what the grantee may accept.")

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_offered_capabilities(self, grant: Grant) -> list[str]:
        return grant.offered_capabilities()

    class Meta:
        model = Grant
        fields = ["id", "tenant", "agent", "capability", "created_at", "accepted_at",
                  "offered_capabilities", "accepted_capabilities"]
        read_only_fields = ["id", "created_at", "accepted_at", "accepted_capabilities"]
        # DRF makes the fields of each unique constraint required, so a grant of an agent
        # had to say "capability": null (a re-test found it); the one check is below.
        validators = []

    def validate(self, attrs):
        attrs = super().validate(attrs)
        tenant, agent, capability = (attrs.get(name, getattr(self.instance, name, None))
                                     for name in ("tenant", "agent", "capability"))
        held = Grant.objects.filter(tenant=tenant, agent=agent, capability=capability)
        if self.instance is not None:
            held = held.exclude(pk=self.instance.pk)
        if held.exists():
            raise serializers.ValidationError({"tenant": [
                f"{tenant.slug} already holds this grant."]})
        return attrs


class GrantAcceptSerializer(serializers.Serializer):
    capabilities = serializers.ListField(
        child=serializers.CharField(max_length=200), allow_empty=False, max_length=1000,
        help_text="The capability ids accepted, among the grant's offered_capabilities: "
                  "the grant covers these and no other, whatever the agent offers later.")


class CredentialSerializer(CleanModelSerializer):
    """``secret`` is write-only: responses say where the secret comes from, never what it is."""

    tenant = tenant_field()
    agent = ScopedPrimaryKeyField(queryset=_related(Credential, "agent"))
    secret = StrictCharField(
        write_only=True, required=False, allow_blank=False, max_length=8192,
        trim_whitespace=False, style={"input_type": "password"},
        help_text="The downstream secret; stored encrypted. Omit to keep the stored one.",
    )
    has_secret = serializers.BooleanField(read_only=True)
    secret_source = serializers.CharField(read_only=True)

    class Meta:
        model = Credential
        fields = [
            "id", "tenant", "agent", "kind", "field_name", "secret", "value_env",
            "client_cert_path", "client_key_path", "ca_file", "has_secret", "secret_source",
            "created_at", "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]

    def validate(self, attrs):
        attrs = super().validate(attrs)
        check_secret(attrs, self.instance, kind_field="kind")
        return attrs

    def create(self, validated_data):
        from tenants.services import credential_save

        secret = validated_data.pop("secret", None)
        return credential_save(credential=Credential(**validated_data), secret=secret)

    def update(self, instance, validated_data):
        from tenants.services import credential_save

        secret = validated_data.pop("secret", None)
        for name, value in validated_data.items():
            setattr(instance, name, value)
        return credential_save(credential=instance, secret=secret)


class QuotaSerializer(CleanModelSerializer):
    tenant = tenant_field()
    agent = ScopedPrimaryKeyField(
        queryset=_related(Quota, "agent"), required=False, allow_null=True
    )
    capability = ScopedPrimaryKeyField(
        queryset=_related(Quota, "capability"), required=False, allow_null=True
    )

    class Meta:
        model = Quota
        fields = [
            "id", "tenant", "agent", "capability", "requests_per_minute", "burst",
            "monthly_requests", "monthly_tokens", "monthly_cost", "created_at",
        ]
        read_only_fields = ["id", "created_at"]
