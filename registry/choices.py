from django.db import models


class Protocol(models.TextChoices):
    OPENAI = "openai", "OpenAI-compatible chat"
    HTTP = "http", "Plain HTTP/JSON"
    A2A = "a2a", "A2A JSON-RPC"


class CapabilityKind(models.TextChoices):
    SYNC = "sync", "Synchronous"
    STREAM = "stream", "Streaming"
    ASYNC = "async", "Asynchronous"


class ReachMode(models.TextChoices):
    DIRECT = "direct", "Direct"
    TUNNEL = "tunnel", "Reverse tunnel"


class InstanceState(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    UNKNOWN = "unknown", "Unknown (missed heartbeats)"
    OFFLINE = "offline", "Offline"
    DRAINING = "draining", "Draining"


class HealthTier(models.TextChoices):
    HEALTHY = "healthy", "Healthy (full weight)"
    OVERLOADED = "overloaded", "Overloaded (half weight)"
    SUB_HEALTHY = "sub_healthy", "Sub-healthy (probe traffic only)"


class Visibility(models.TextChoices):
    PRIVATE = "private", "Private (owner and granted tenants)"
    PUBLIC = "public", "Public (every tenant may discover and reach it)"
