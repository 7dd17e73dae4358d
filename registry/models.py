from __future__ import annotations

import re
import unicodedata
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import (
    MaxValueValidator,
    MinValueValidator,
    RegexValidator,
    URLValidator,
)
from django.db import models
from django.db.models.functions import Lower

from reach_platform.scoping import TenantScopedQuerySet
from registry.choices import (
    CapabilityKind,
    FeedbackSource,
    HealthTier,
    InstanceState,
    Protocol,
    ReachMode,
    Visibility,
)
from registry.spec import MAX_HINT_CHARS, MAX_HINTS

AGENT_PATH = RegexValidator(r"\A/\S*\Z", "Must start with / and hold no spaces.")

capability_id_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9_.\-]{0,127}$",
    "Lower-case letters, digits, '.', '_' and '-', starting with a letter or digit.",
)
name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$",
    "Letters, digits, '.', '_' and '-', starting with a letter or digit.",
)


def normalise_agent_name(name: str) -> str:
    """Agent names are compared after Unicode NFC normalisation, case-insensitively."""
    return unicodedata.normalize("NFC", name) if isinstance(name, str) else name


class Namespace(models.Model):
    """Isolates agents (e.g. ``dev`` / ``prod``); reaching across one needs a grant."""

    # The descriptors' rule (lower case): "Sales", created through the API, could never
    # hold an agent (helper-48).
    name = models.SlugField(max_length=63, unique=True, validators=[RegexValidator(
        r"^[a-z0-9][a-z0-9_\-]{0,62}\Z",
        "A namespace name is a slug of lower-case letters, digits, '_' or '-'.")])
    description = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AgentQuerySet(TenantScopedQuerySet):
    def visible_to(self, tenant_ids):
        """Agents a tenant may discover: its own, public ones, and those granted to it
        (grants it accepted; an offer shows nothing)."""
        if tenant_ids is None:
            return self
        ids = list(tenant_ids)
        granted = models.Q(grants__tenant_id__in=ids, grants__accepted_at__isnull=False) | \
            models.Q(capabilities__grants__tenant_id__in=ids,
                     capabilities__grants__accepted_at__isnull=False)
        return self.filter(
            models.Q(owner_tenant_id__in=ids) | models.Q(visibility=Visibility.PUBLIC) | granted
        ).distinct()


class Agent(models.Model):
    tenant_path = "owner_tenant_id"
    agent_path = "pk"

    namespace = models.ForeignKey(Namespace, on_delete=models.PROTECT, related_name="agents")
    name = models.CharField(max_length=100, validators=[name_validator])
    version = models.CharField(max_length=40, default="1.0.0")
    description = models.TextField(blank=True)
    protocol = models.CharField(max_length=16, choices=Protocol, default=Protocol.HTTP)
    owner_tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="agents"
    )
    team = models.CharField(max_length=100, blank=True)
    visibility = models.CharField(
        max_length=16, choices=Visibility, default=Visibility.PRIVATE,
        help_text="Private agents are seen and reached by their owner and granted tenants only.",
    )
    internal_only = models.BooleanField(
        default=False, help_text="Reachable only by tenants and networks allowed for it."
    )
    weight = models.PositiveIntegerField(default=100, help_text="Routing weight, relative.")
    priority = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1)],
        help_text="Priority tier: 1 is used before 2 while any of tier 1 is healthy.",
    )
    traffic_percent = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(99)],
        help_text="A/B split: the share of its capabilities' calls this agent takes "
        "(e.g. 10 for a new version); agents without a share split the rest.",
    )
    # Held to what a descriptor may say, also when changed through the API: a negative
    # price credits callers (a break test PATCHed -1), pools are bounded as there.
    price_input_per_1k = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal(0), validators=[MinValueValidator(0)],
        help_text="Price per 1,000 input tokens.",
    )
    price_output_per_1k = models.DecimalField(
        max_digits=12, decimal_places=6, default=Decimal(0), validators=[MinValueValidator(0)],
        help_text="Price per 1,000 output tokens.",
    )
    price_per_call = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal(0),
                                         validators=[MinValueValidator(0)])
    pool_max_connections = models.PositiveIntegerField(
        default=64, validators=[MinValueValidator(1), MaxValueValidator(4096)])
    pool_idle_seconds = models.PositiveIntegerField(
        default=90, validators=[MaxValueValidator(86_400)])
    # A day at most: a lease is a promise that a silent instance soon stops getting calls.
    heartbeat_interval_seconds = models.PositiveIntegerField(
        default=10, validators=[MinValueValidator(1), MaxValueValidator(86_400)])
    lease_ttl_seconds = models.PositiveIntegerField(
        default=30, validators=[MinValueValidator(1), MaxValueValidator(86_400)],
        help_text="An instance without a heartbeat for this long becomes unknown."
    )
    # Paths on the agent's own host: a change through the API is held to what a
    # descriptor may say (a break test PATCHed "@169.254.169.254/..." in).
    probe_path = models.CharField(
        max_length=200, default="/healthz", validators=[AGENT_PATH],
        help_text="Path the active health probe GETs."
    )
    # The last descriptor as its author sent it (secrets are refused there, so none
    # is stored): informational fields live only here, and GET shows the source.
    # Registered from an operator's agents file (registry.agents_file): only these are
    # removed when the file no longer lists them (reach_apply --prune).
    managed = models.BooleanField(default=False, editable=False)
    descriptor = models.JSONField(default=dict, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = AgentQuerySet.as_manager()

    class Meta:
        ordering = ["namespace__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["namespace", "name"], name="agent_unique_name"),
            # "ACCA-XA" and "acca-xa" are one name: callers and the OpenAI ``model``
            # field do not agree on case, so two agents may not differ only by it.
            models.UniqueConstraint(
                Lower("name"), "namespace", name="agent_unique_name_ci",
                violation_error_message="An agent with this name in any letter case already "
                "exists in this namespace.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace_id and self.namespace.name}/{self.name}"

    def save(self, *args, **kwargs) -> None:
        self.name = normalise_agent_name(self.name)
        super().save(*args, **kwargs)

    def clean(self) -> None:
        self.name = normalise_agent_name(self.name)
        if self.namespace_id is not None and self.name:
            clash = (Agent.objects.filter(namespace_id=self.namespace_id,
                                          name__iexact=self.name)
                     .exclude(pk=self.pk).values_list("name", flat=True).first())
            if clash is not None:
                # The taken spelling and its owner are not said: the caller may not see it.
                raise ValidationError({"name": (
                    f"The name {self.name!r} is taken in this namespace; names are unique "
                    "regardless of letter case."
                )})
        if self.lease_ttl_seconds < 3 * self.heartbeat_interval_seconds:
            raise ValidationError(
                {"lease_ttl_seconds": "Must be at least 3 x the heartbeat interval."}
            )


class Capability(models.Model):
    """One capability of an agent: the declaration the others are read from.

    Registration writes every ``registry.spec.CapabilitySpec`` field to the field
    of the same name here, and ``registry.snapshot`` builds each
    ``routing.table.CapabilityEntry`` from the same-named attributes; the API and
    the admin show every field.
    """

    tenant_path = "agent__owner_tenant_id"
    agent_path = "agent_id"

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="capabilities")
    capability_id = models.CharField(max_length=128, validators=[capability_id_validator])
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    keywords = models.JSONField(default=list, blank=True)
    # Example requests the team expects, and negative hints ("parcel tracking (use
    # logistics.track)"): the intent router reads both.
    examples = models.JSONField(default=list, blank=True)
    not_for = models.JSONField(default=list, blank=True)
    languages = models.JSONField(default=list, blank=True, help_text='e.g. ["en", "zh"]')
    directions = models.JSONField(default=list, blank=True, help_text='e.g. ["en->zh"]')
    formats = models.JSONField(default=list, blank=True, help_text='e.g. ["text", "markdown"]')
    max_input_chars = models.PositiveIntegerField(null=True, blank=True)
    input_schema = models.JSONField(default=dict, blank=True)
    output_schema = models.JSONField(default=dict, blank=True)
    # Canonical parameter name -> the agent's own, so the gateway can map back.
    param_map = models.JSONField(default=dict, blank=True)
    # Plain-HTTP agents: request template and response mapping (envelope unwrapping).
    adapter = models.JSONField(default=dict, blank=True)
    # Path on the instance, always POSTed to; "" means the protocol's default.
    path = models.CharField(max_length=300, blank=True, validators=[AGENT_PATH])
    timeout_ms = models.PositiveIntegerField(default=30_000, validators=[MinValueValidator(1)])
    qps = models.PositiveIntegerField(null=True, blank=True)
    burst = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=16, choices=CapabilityKind, default=CapabilityKind.SYNC)
    version = models.CharField(max_length=40, default="1.0.0")

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["capability_id"]
        verbose_name_plural = "capabilities"
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "capability_id"], name="capability_unique_per_agent"
            )
        ]

    def __str__(self) -> str:
        return self.capability_id

    def clean(self) -> None:
        for name in ("keywords", "examples", "not_for", "languages", "directions", "formats"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
                raise ValidationError({name: "Must be a list of strings."})
        for name in ("examples", "not_for"):
            value = getattr(self, name)
            if len(value) > MAX_HINTS:
                raise ValidationError({name: f"At most {MAX_HINTS} entries."})
            if any(len(v) > MAX_HINT_CHARS for v in value):
                raise ValidationError({name: f"Each entry at most {MAX_HINT_CHARS} characters."})
        from reach_core.schemas import schema_problems

        errors = {}
        for field in ("input_schema", "output_schema"):
            problems = schema_problems(getattr(self, field) or {})
            if problems:
                errors[field] = "; ".join(problems)
        if errors:
            raise ValidationError(errors)


class Instance(models.Model):
    tenant_path = "agent__owner_tenant_id"
    agent_path = "agent_id"

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="instances")
    # A CharField, not URLField: the form field of URLField guesses a scheme.
    endpoint = models.CharField(
        max_length=500,
        help_text="Base URL of this instance, e.g. http://10.0.0.5:8080/ (a tunnelled "
                  "instance: tunnel://<its instance key>)",
    )
    reach_mode = models.CharField(max_length=16, choices=ReachMode, default=ReachMode.DIRECT)
    state = models.CharField(max_length=16, choices=InstanceState, default=InstanceState.HEALTHY)
    health_tier = models.CharField(
        max_length=16, choices=HealthTier, default=HealthTier.HEALTHY
    )
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    cpu = models.FloatField(default=0.0, help_text="0..1")
    memory = models.FloatField(default=0.0, help_text="0..1")
    queue_depth = models.PositiveIntegerField(default=0)
    in_flight = models.PositiveIntegerField(default=0)
    processed_recent = models.PositiveIntegerField(default=0)
    errors_recent = models.PositiveIntegerField(default=0)
    # Capability ids this instance serves now; empty means all of the agent's.
    capabilities_available = models.JSONField(default=list, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    # Recoveries from unknown within 2 x TTL: each lowers the weight instead of
    # removing the instance; reset after a quiet 2 x TTL.
    flaps = models.PositiveSmallIntegerField(default=0)
    last_flap_at = models.DateTimeField(null=True, blank=True)
    # Set by deregistration: the row goes at this time whatever heartbeats still come
    # (calls in flight finish meanwhile). Null for an operator's drain.
    remove_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["agent_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "endpoint"], name="instance_unique_endpoint")
        ]

    def __str__(self) -> str:
        return f"{self.agent.name} @ {self.endpoint}"

    def clean(self) -> None:
        super().clean()
        if self.reach_mode == ReachMode.TUNNEL:
            if not TUNNEL_ENDPOINT.fullmatch(self.endpoint or ""):
                raise ValidationError({"endpoint": "A tunnelled instance's endpoint is "
                                                   "tunnel://<instance key>."})
        else:
            URLValidator(schemes=["http", "https"])(self.endpoint)


TUNNEL_ENDPOINT = re.compile(r"tunnel://[A-Za-z0-9_-]{8,64}")


class AgentToken(models.Model):
    """A token that may act for one agent only: re-register, heartbeat, deregister.

    Issued in exchange for a registration token (an API key with the
    ``register`` scope); stored like API keys, as prefix + SHA-256.
    """

    tenant_path = "agent__owner_tenant_id"

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tokens")
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.prefix}… for {self.agent_id}"


class ParameterSynonym(models.Model):
    """Maps a parameter name agents use (``target_lang``) to the canonical one (``dest_lang``)."""

    synonym = models.CharField(max_length=100, unique=True)
    canonical = models.CharField(max_length=100, db_index=True)

    class Meta:
        ordering = ["canonical", "synonym"]

    def __str__(self) -> str:
        return f"{self.synonym} → {self.canonical}"

    def clean(self) -> None:
        self.synonym = self.synonym.strip().lower()
        self.canonical = self.canonical.strip().lower()
        if self.synonym == self.canonical:
            raise ValidationError({"synonym": "A name is not a synonym of itself."})


class RouteVersion(models.Model):
    """The single-row, global version counter of the route table.

    Bumped with a row lock, so versions are handed out one at a time and every
    published delta has a unique, gap-free number.
    """

    version = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"route table v{self.version}"


class RouteChange(models.Model):
    """Which row each route-table version changed: a subscriber that missed versions reads
    the rows changed since its own, not the whole table (a fleet of 10,000 agents takes
    2-3 s and tens of MB to reload). Kept for the last ``KEEP`` versions."""

    KEEP = 20_000

    version = models.BigIntegerField(primary_key=True)
    kind = models.CharField(max_length=16)
    row = models.BigIntegerField()

    def __str__(self) -> str:
        return f"v{self.version}: {self.kind} {self.row}"


class RouteFeedback(models.Model):
    """One report that an intent should have reached ``capability_id``: sent by the caller
    (``POST /v1/route/feedback``) or inferred by the gateway (an explicit capability call
    soon after a dry run or a failed intent call by the same key). A miss when
    ``routed_to`` (what the router chose, empty for none) differs from it.

    ``event_id`` is the gateway's id for the event: events arrive at least once and are
    stored once. ``learned_at`` is set when ``registry.learning`` has folded the row into
    the learned phrases; ``learned`` is the phrase it produced, if any (the resolution)."""

    tenant_path = "tenant_id"

    event_id = models.CharField(max_length=64, unique=True)
    request_id = models.CharField(max_length=128, blank=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE,
                               related_name="route_feedback")
    intent = models.TextField()
    capability_id = models.CharField(max_length=128)
    routed_to = models.CharField(max_length=128, blank=True)
    source = models.CharField(max_length=16, choices=FeedbackSource)
    created_at = models.DateTimeField(db_index=True)
    learned_at = models.DateTimeField(null=True, blank=True)
    learned = models.ForeignKey("LearnedPhrase", null=True, blank=True,
                                on_delete=models.SET_NULL, related_name="feedback")

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "route feedback"
        indexes = [
            # The fold's claim: the oldest rows not learned yet.
            models.Index(fields=["id"], name="route_feedback_unlearned",
                         condition=models.Q(learned_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.intent[:60]} → {self.capability_id}"

    @property
    def is_miss(self) -> bool:
        return self.routed_to != self.capability_id


class LearnedPhrase(models.Model):
    """A normalised intent phrase a tenant's feedback taught for one capability.

    ``support`` counts the feedback behind it, ``explicit_support`` the part the caller
    reported itself. ``routable`` is decided by ``registry.learning`` (enough support,
    ``active``, among the best of its capability, the best capability for its phrase):
    only routable phrases are in the route table. ``active`` is the operator's switch."""

    tenant_path = "tenant_id"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE,
                               related_name="learned_phrases")
    capability_id = models.CharField(max_length=128)
    phrase = models.TextField()
    # SHA-256 of the phrase: unique with tenant and capability (a 1,000-character CJK
    # phrase is too long for a B-tree key of its own).
    phrase_hash = models.CharField(max_length=64, editable=False)
    support = models.PositiveIntegerField(default=0)
    explicit_support = models.PositiveIntegerField(default=0)
    active = models.BooleanField(default=True)
    routable = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "capability_id", "-support"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "capability_id", "phrase_hash"],
                                    name="learned_phrase_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.phrase[:60]} → {self.capability_id}"


class InstanceTransition(models.Model):
    """An instance's state changed (healthy, unknown, offline, draining): the console's
    health history. Kept when the instance goes (the agent's page still shows it left)."""

    tenant_path = "agent__owner_tenant_id"
    agent_path = "agent_id"

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="transitions")
    instance = models.ForeignKey(Instance, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="transitions")
    instance_pk = models.PositiveBigIntegerField(help_text="The instance, also once deleted.")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, choices=InstanceState)
    reason = models.CharField(max_length=64, blank=True)
    at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["agent", "at"], name="transition_agent_time")]

    def __str__(self) -> str:
        return f"{self.instance_pk}: {self.from_state or '∅'} → {self.to_state}"


class AppliedFile(models.Model):
    """The last content of a watched agents file that was applied (or refused), so each
    change is applied once (``registry.agents_file.watched_file_apply``)."""

    path = models.CharField(max_length=500, unique=True)
    digest = models.CharField(max_length=64)
    applied_at = models.DateTimeField()
    error = models.TextField(blank=True, help_text="Why the last content was refused.")

    def __str__(self) -> str:
        return self.path
