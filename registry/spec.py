"""The normalised form every descriptor format is parsed into.

JSON descriptors, ``capability.yaml`` files and A2A Agent Cards all become one
``AgentSpec``; the registration service only ever sees this type. Pure data:
no Django, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# ``examples`` and ``not_for`` of one capability: at most this many entries, each at
# most this many characters (descriptor schemas and ``Capability.clean`` both check).
MAX_HINTS = 20
MAX_HINT_CHARS = 300


@dataclass(frozen=True)
class CapabilitySpec:
    """What a descriptor says about one capability.

    Every field is written to the same-named ``registry.models.Capability`` field
    on registration (``registry.services``), so a field added here must exist there.
    Fields only an operator sets (``formats``, ``max_input_chars``) are not here, and
    re-registering leaves them as they are.
    """

    capability_id: str
    display_name: str = ""
    description: str = ""
    keywords: tuple[str, ...] = ()
    # Example requests the team expects, and negative hints such as "parcel tracking
    # (use logistics.track)": the intent router pools both per capability id.
    examples: tuple[str, ...] = ()
    not_for: tuple[str, ...] = ()
    # Natural languages the capability handles ("en", "zh"), and translation
    # directions ("en->zh"); empty means unconstrained.
    languages: tuple[str, ...] = ()
    directions: tuple[str, ...] = ()
    input_schema: dict = field(default_factory=dict)
    output_schema: dict = field(default_factory=dict)
    # Canonical parameter name -> the agent's own name, for every parameter
    # the synonym table renamed inside ``input_schema``.
    param_map: dict = field(default_factory=dict)
    timeout_ms: int = 30_000
    qps: int | None = None
    burst: int | None = None
    kind: str = "sync"  # registry.choices.CapabilityKind
    version: str = "1.0.0"
    # Path on the instance that serves this capability (always POSTed to); ""
    # means the agent's protocol default.
    path: str = ""
    # How the gateway speaks to a plain-HTTP capability: ``{"request": {"template":
    # …}, "response": {"envelope": {…}, "output": "…", "reply": "…"}}``.
    adapter: dict = field(default_factory=dict)


@dataclass(frozen=True)
class CredentialSpec:
    """How the gateway authenticates to the agent, as the owner tenant's credential.

    Only references: the name of an environment variable the gateway reads
    (``value_env``) and certificate file paths. Same fields as
    ``tenants.models.Credential``.
    """

    kind: str  # tenants.choices.CredentialKind
    field_name: str = ""
    value_env: str = ""
    client_cert_path: str = ""
    client_key_path: str = ""
    ca_file: str = ""


@dataclass(frozen=True)
class AgentSpec:
    """An agent as a descriptor states it.

    ``None`` in the routing and pool fields means "not stated": a new agent gets the
    model's default and re-registering keeps what an operator set.
    """

    name: str
    version: str = "1.0.0"
    description: str = ""
    protocol: str = "http"  # registry.choices.Protocol
    namespace: str = "default"
    team: str = ""
    capabilities: tuple[CapabilitySpec, ...] = ()
    # Where the first instance answers; None when the descriptor names no endpoint.
    endpoint: str | None = None
    # "tunnel": the instance holds a reverse tunnel to a gateway instead of listening;
    # ``instance_key`` (the agent's choice, one per running process) names it.
    reach_mode: str = "direct"
    instance_key: str | None = None
    weight: int | None = None
    priority: int | None = None
    internal_only: bool | None = None
    pool_max_connections: int | None = None
    pool_idle_seconds: int | None = None
    credential: CredentialSpec | None = None
    lease_ttl_seconds: int = 30
    heartbeat_interval_seconds: int = 10
    # "json", "yaml", "a2a" or "entry": which format this came from, for the audit log.
    source_format: str = "json"
    # The document as its author sent it (decoded), stored with the agent so fields
    # that are only for people (an SLA, a card's icon) are kept and GET shows the source.
    document: dict = field(default_factory=dict)


class DescriptorError(Exception):
    """A descriptor that cannot be registered. ``problems`` maps field paths to messages.

    Paths read like ``capabilities[2].timeout_ms``; every problem found is
    listed, not only the first.
    """

    def __init__(self, problems: dict[str, list[str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{p}: {' '.join(m)}" for p, m in problems.items()))
