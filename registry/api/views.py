from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import Q
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.models import AuditAction, AuditSource
from audit.services import audit_record
from reach_core import keys
from reach_platform.api import StrictListParams, TenantScopedViewSet
from reach_platform.endpoints import endpoint_policy
from reach_platform.parsers import StrictJSONParser
from registry import heartbeats
from registry.api.parsers import TextYAMLParser, XYAMLParser, YAMLTextParser
from registry.api.serializers import (
    AgentSerializer,
    CapabilitySerializer,
    HeartbeatSerializer,
    InstanceSerializer,
    NamespaceSerializer,
    ParameterSynonymSerializer,
    RegistrationSerializer,
)
from registry.cards import fetch_agent_card
from registry.descriptors import detect_and_parse, parse_agent_card
from registry.models import Agent, Capability, Instance, Namespace, ParameterSynonym
from registry.services import (
    RegistrationConflict,
    agent_register,
    instance_deregister,
    instance_drain,
    instance_heartbeat,
    instance_resume,
)
from registry.spec import DescriptorError
from tenants.choices import ApiKeyScope
from tenants.models import Tenant
from tenants.permissions import TenantPermission
from tenants.principal import principal_for_request


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"
    default_detail = "The request conflicts with the current state."


class NamespaceViewSet(StrictListParams, viewsets.ModelViewSet):
    """Namespaces are shared by every tenant; only superusers create or change them."""

    queryset = Namespace.objects.all()
    serializer_class = NamespaceSerializer
    permission_classes = [TenantPermission]
    global_writes_only = True
    lookup_field = "name"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]


class ParameterSynonymViewSet(NamespaceViewSet):
    """The synonym table: parameter names agents use -> the canonical name."""

    queryset = ParameterSynonym.objects.all()
    serializer_class = ParameterSynonymSerializer
    lookup_field = "pk"


@extend_schema(
    parameters=[
        OpenApiParameter("q", str, description="Search name, description and capabilities."),
        OpenApiParameter("capability", str, description="Only agents offering this capability."),
        OpenApiParameter("namespace", str),
    ]
)
class AgentViewSet(TenantScopedViewSet):
    """Agents you own, public agents and agents granted to you. Only owners change them;
    deleting an agent deregisters it (its instances stop receiving calls at once)."""

    queryset = Agent.objects.select_related("namespace", "owner_tenant").prefetch_related(
        "capabilities", "instances", "credentials__tenant"
    )
    serializer_class = AgentSerializer
    agent_token_actions = ("list", "retrieve", "destroy")
    list_filters = frozenset({"namespace", "capability", "q"})

    def get_queryset(self):
        principal = self.principal
        queryset = self.queryset.all()
        if principal.agent_pk is not None:
            queryset = queryset.for_principal(principal)
        else:
            queryset = queryset.visible_to(principal.tenant_ids)
        params = self.request.query_params
        if params.get("namespace"):
            queryset = queryset.filter(namespace__name=params["namespace"])
        if params.get("capability"):
            queryset = queryset.filter(capabilities__capability_id=params["capability"])
        if params.get("q"):
            term = params["q"]
            queryset = queryset.filter(
                Q(name__icontains=term) | Q(description__icontains=term)
                | Q(capabilities__capability_id__icontains=term)
                | Q(capabilities__display_name__icontains=term)
                | Q(capabilities__description__icontains=term)
            )
        return queryset.distinct()


class CapabilityViewSet(TenantScopedViewSet):
    queryset = Capability.objects.select_related("agent")
    serializer_class = CapabilitySerializer
    agent_token_actions = ("list", "retrieve")


class InstanceViewSet(TenantScopedViewSet):
    queryset = Instance.objects.select_related("agent")
    serializer_class = InstanceSerializer
    agent_token_actions = ("list", "retrieve", "heartbeat", "deregister")

    @extend_schema(request=None, responses={200: InstanceSerializer})
    @action(detail=True, methods=["post"])
    @transaction.atomic
    def drain(self, request, pk=None):
        """Stop routing new calls to this instance; calls in flight finish."""
        instance = self.get_object()
        self.check_object_permissions(request, instance)
        instance_drain(instance=instance)
        audit_record(
            principal=self.principal, source=AuditSource.API, action=AuditAction.ACTION,
            obj=instance, changes={"state": instance.state},
        )
        return Response(self.get_serializer(instance).data)

    @extend_schema(request=None, responses={200: InstanceSerializer})
    @action(detail=True, methods=["post"])
    @transaction.atomic
    def resume(self, request, pk=None):
        """Lift a drain: calls may be routed here again. A deregistered instance is not
        resumed (the agent left; it comes back by registering)."""
        instance = self.get_object()
        self.check_object_permissions(request, instance)
        before = instance.state
        instance_resume(instance=instance)
        if instance.state != before:
            audit_record(
                principal=self.principal, source=AuditSource.API, action=AuditAction.ACTION,
                obj=instance, changes={"state": instance.state},
            )
        return Response(self.get_serializer(instance).data)

    @extend_schema(
        request=HeartbeatSerializer,
        responses={200: inline_serializer("HeartbeatReply", {
            "state": serializers.CharField(), "health_tier": serializers.CharField(),
            "lease_expires_at": serializers.DateTimeField(),
            "heartbeat_interval_seconds": serializers.IntegerField(),
        })},
    )
    @action(detail=True, methods=["post"])
    @transaction.atomic
    def heartbeat(self, request, pk=None):
        """Renew this instance's lease and report its load. Send every
        ``heartbeat_interval_seconds``; three missed and it is ``unknown``."""
        instance = self.get_object()
        if not self.principal.can_manage(instance.agent.owner_tenant_id) and (
            self.principal.agent_pk != instance.agent_id
        ):
            raise exceptions.PermissionDenied()
        body = HeartbeatSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        instance = instance_heartbeat(instance=instance, heartbeat=body.to_heartbeat())
        if self.principal.agent_pk == instance.agent_id:
            # The agent's own token: its next steady beats need not come here.
            token = request.headers.get("Authorization", "").partition(" ")[2].strip()
            transaction.on_commit(lambda: heartbeats.seed_token(keys.hash_key(token),
                                                                instance.agent_id))
        return Response({
            "state": instance.state, "health_tier": instance.health_tier,
            "lease_expires_at": instance.lease_expires_at,
            "heartbeat_interval_seconds": instance.agent.heartbeat_interval_seconds,
        })

    @extend_schema(request=None, responses={200: InstanceSerializer})
    @action(detail=True, methods=["post"])
    @transaction.atomic
    def deregister(self, request, pk=None):
        """Graceful exit: no new calls from now on; the instance is removed after a grace
        period that lets calls in flight finish."""
        instance = self.get_object()
        if not self.principal.can_manage(instance.agent.owner_tenant_id) and (
            self.principal.agent_pk != instance.agent_id
        ):
            raise exceptions.PermissionDenied()
        instance_deregister(instance=instance)
        audit_record(
            principal=self.principal, source=AuditSource.API, action=AuditAction.ACTION,
            obj=instance, changes={"state": instance.state},
        )
        return Response(self.get_serializer(instance).data)


class AgentRegisterView(APIView):
    """Register or update an agent from a descriptor.

    The body is a JSON descriptor, an A2A Agent Card (JSON with ``skills``),
    ``{"card_url": "…/.well-known/agent-card.json"}`` to fetch a card, or a
    ``capability.yaml`` sent as ``application/yaml``. Idempotent by namespace
    and name. Authenticate with a tenant key holding the ``register`` (or
    ``manage``) scope to receive an agent token, or with that agent token to
    update the agent or add an instance.
    """

    parser_classes = [StrictJSONParser, YAMLTextParser, TextYAMLParser, XYAMLParser]
    permission_classes = []

    @extend_schema(
        request={"application/json": dict, "application/yaml": str},
        responses={200: RegistrationSerializer, 201: RegistrationSerializer},
    )
    def post(self, request):
        tenant, acting_agent = self._tenant_and_agent(request)
        try:
            spec = self._spec(request.data)
            registration = self._register(request, tenant=tenant, spec=spec,
                                          acting_agent=acting_agent)
        except DescriptorError as exc:
            raise serializers.ValidationError(exc.problems) from exc
        except RegistrationConflict as exc:
            raise Conflict(str(exc)) from exc
        body = RegistrationSerializer(registration, context={"request": request}).data
        return Response(
            body, status=status.HTTP_201_CREATED if registration.created else status.HTTP_200_OK
        )

    def _register(self, request, *, tenant, spec, acting_agent):
        try:
            return self._register_once(request, tenant=tenant, spec=spec,
                                       acting_agent=acting_agent)
        except IntegrityError:
            # Two registrations of one new name (or of two spellings of it) raced: neither
            # found a row to lock, both inserted, and the unique index made this one wait
            # for the winner's commit and then fail. Run again, it sees the winner's row and
            # gets what it would have got coming second: the update (200), another tenant's
            # name (409) or a name differing only in case (400). Once is enough: the row it
            # collided with is committed now, so a second IntegrityError is not this race.
            return self._register_once(request, tenant=tenant, spec=spec,
                                       acting_agent=acting_agent)

    @staticmethod
    def _register_once(request, *, tenant, spec, acting_agent):
        with transaction.atomic():
            registration = agent_register(tenant=tenant, spec=spec, acting_agent=acting_agent)
            audit_record(
                principal=principal_for_request(request), source=AuditSource.API,
                action=AuditAction.CREATE if registration.created else AuditAction.UPDATE,
                obj=registration.agent,
                changes={"format": spec.source_format, "version": spec.version,
                         "capabilities": [c.capability_id for c in spec.capabilities]},
            )
        return registration

    def _tenant_and_agent(self, request):
        principal = principal_for_request(request)
        if principal.agent_pk is not None:
            agent = Agent.objects.select_related("owner_tenant").get(pk=principal.agent_pk)
            return agent.owner_tenant, agent
        key = principal.api_key
        if key is not None:
            if not {ApiKeyScope.REGISTER, ApiKeyScope.MANAGE} & set(key.scopes):
                raise exceptions.PermissionDenied("This key may not register agents.")
            return key.tenant, None
        if principal.user is None:
            raise exceptions.NotAuthenticated()
        slug = request.query_params.get("tenant")
        manageable = Tenant.objects.for_tenants(principal.manage_tenant_ids)
        tenant = manageable.filter(slug=slug).first() if slug else None
        if tenant is None and not slug and manageable.count() == 1:
            tenant = manageable.get()
        if tenant is None:
            raise exceptions.PermissionDenied("Name a tenant you manage with ?tenant=<slug>.")
        return tenant, None

    def _spec(self, data):
        if isinstance(data, dict) and set(data) <= {"card_url", "namespace"} and "card_url" in data:
            url = data["card_url"]
            if not isinstance(url, str):
                raise DescriptorError({"card_url": ["must be a string"]})
            card = fetch_agent_card(url, endpoint_policy())
            card.setdefault("url", url.split("/.well-known/")[0] + "/")
            spec = parse_agent_card(card)
            if data.get("namespace"):
                from dataclasses import replace

                spec = replace(spec, namespace=data["namespace"])
            return spec
        if not isinstance(data, dict | str):
            raise DescriptorError({"$": ["must be a JSON object or a YAML document"]})
        return detect_and_parse(data)
