"""Serializer building blocks shared by every app's API."""

from __future__ import annotations

import copy

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.utils import html

from tenants.principal import principal_for_request

# --- JSON types as published --------------------------------------------------------------
#
# DRF coerces: a CharField takes 5 as "5", an IntegerField "5", a BooleanField 0, "yes" or
# "on", a PrimaryKeyRelatedField "5". The OpenAPI document says string, integer, boolean:
# a client that sends another type has a bug we must report, not guess around. Query
# strings and form data are text by nature, so they keep DRF's parsing.


class JSONTyped:
    """Mixin for a DRF field: in a JSON body, a value of another JSON type than
    ``json_types`` is invalid (``bool`` never counts as a number)."""

    json_types: tuple[type, ...] = ()
    default_error_messages = {"invalid_type": "Must be {expected}."}

    def to_internal_value(self, data):
        wrong = not isinstance(data, self.json_types) or (
            isinstance(data, bool) and bool not in self.json_types)
        if wrong and not html.is_html_input(getattr(self.root, "initial_data", None)):
            self.fail("invalid_type", expected=self.json_type_name)
        return super().to_internal_value(data)

    @property
    def json_type_name(self) -> str:
        return {str: "a string", int: "an integer", float: "a number",
                bool: "a boolean"}[self.json_types[-1]]


class StrictCharField(JSONTyped, serializers.CharField):
    json_types = (str,)


class StrictIntegerField(JSONTyped, serializers.IntegerField):
    json_types = (int,)


class StrictFloatField(JSONTyped, serializers.FloatField):
    json_types = (int, float)


class StrictBooleanField(JSONTyped, serializers.BooleanField):
    json_types = (bool,)


_STRICT_TYPES: list[tuple[type, tuple[type, ...]]] = [
    (serializers.BooleanField, (bool,)),
    (serializers.IntegerField, (int,)),
    (serializers.FloatField, (int, float)),
    (serializers.CharField, (str,)),
]
_strict_classes: dict[type, type] = {}


def strict_field_class(field_class: type) -> type:
    """``field_class`` with ``JSONTyped`` mixed in when it is a string, integer, number or
    boolean field (``SlugField``, ``URLField``… included); any other class unchanged."""
    for base, json_types in _STRICT_TYPES:
        if issubclass(field_class, base) and not issubclass(field_class, JSONTyped):
            if field_class not in _strict_classes:
                _strict_classes[field_class] = type(
                    f"Strict{field_class.__name__}", (JSONTyped, field_class),
                    {"json_types": json_types, "__module__": __name__})
            return _strict_classes[field_class]
    return field_class


class StrictModelSerializer(serializers.ModelSerializer):
    """A ``ModelSerializer`` whose generated fields take only their published JSON type."""

    def build_standard_field(self, field_name, model_field):
        field_class, kwargs = super().build_standard_field(field_name, model_field)
        return strict_field_class(field_class), kwargs


class KnownFieldsOnly:
    """Refuses keys the serializer does not declare, each at its own name.

    DRF drops them silently, so a misspelt field (``wieght``) would "succeed" and change
    nothing. Read-only fields are declared, so a GET body sent back as a PUT still works.
    """

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                known = ", ".join(name for name, f in self.fields.items() if not f.read_only)
                raise serializers.ValidationError(
                    {name: [f"is not a known field (known here: {known})"] for name in unknown})
        return super().to_internal_value(data)


class CleanModelSerializer(KnownFieldsOnly, StrictModelSerializer):
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


class ScopedPrimaryKeyField(JSONTyped, _ScopedMixin, serializers.PrimaryKeyRelatedField):
    json_types = (int,)


class StrictSlugRelatedField(JSONTyped, serializers.SlugRelatedField):
    json_types = (str,)


class ScopedSlugField(_ScopedMixin, StrictSlugRelatedField):
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


# --- downstream secrets (credentials and tools) ----------------------------------------------

# Kinds that send a secret with every call (mTLS sends a certificate instead).
_SENDS_SECRET = ("header", "query", "bearer")


def check_secret(attrs: dict, instance, *, kind_field: str) -> None:
    """A credential's or a tool's secret is given once: stored (``secret``) or named
    (``value_env``), not both; and a kind that sends one on every call has one, or every
    call would fail: refused here, where the mistake is made."""
    if attrs.get("secret") and attrs.get("value_env"):
        raise serializers.ValidationError(
            {"secret": "Give either a secret or value_env, not both."})
    kind = attrs.get(kind_field, getattr(instance, kind_field, None))
    value_env = attrs.get("value_env", getattr(instance, "value_env", ""))
    stored = bool(instance is not None and instance.secret_ciphertext)
    if kind in _SENDS_SECRET and not (attrs.get("secret") or value_env or stored):
        raise serializers.ValidationError(
            {"secret": "Give the secret, or value_env naming the gateway's environment "
             "variable that holds it."})
