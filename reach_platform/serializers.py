"""Serializer building blocks shared by every app's API."""

from __future__ import annotations

import copy

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from tenants.principal import principal_for_request


class CleanModelSerializer(serializers.ModelSerializer):
    """Runs the model's ``clean()`` so the API and the admin enforce the same rules."""

    def validate(self, attrs):
        attrs = super().validate(attrs)
        model = self.Meta.model
        names = {f.name for f in model._meta.concrete_fields}
        candidate = copy.copy(self.instance) if self.instance is not None else model()
        for name, value in attrs.items():
            if name in names:
                setattr(candidate, name, value)
        try:
            candidate.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(
                exc.message_dict if hasattr(exc, "error_dict") else {"__all__": exc.messages}
            ) from exc
        return attrs


class _ScopedMixin:
    """Offers only rows the requesting principal can read: others look nonexistent."""

    def get_queryset(self):
        queryset = super().get_queryset()
        request = self.context.get("request")
        if request is None:
            return queryset.none()
        return queryset.for_tenants(principal_for_request(request).tenant_ids)


class ScopedPrimaryKeyField(_ScopedMixin, serializers.PrimaryKeyRelatedField):
    pass


class ScopedSlugField(_ScopedMixin, serializers.SlugRelatedField):
    pass


class TenantDefault:
    """Default for a ``tenant`` field: the caller's only tenant (an API key has one)."""

    requires_context = True

    def __call__(self, serializer_field):
        request = serializer_field.context["request"]
        principal = principal_for_request(request)
        ids = principal.manage_tenant_ids or principal.tenant_ids
        if ids is not None and len(ids) == 1:
            from tenants.models import Tenant

            return Tenant.objects.get(pk=next(iter(ids)))
        raise serializers.ValidationError("Name the tenant: you have access to several.")
