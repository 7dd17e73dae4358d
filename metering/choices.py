from django.db import models


class Outcome(models.TextChoices):
    SUCCESS = "success", "Success"
    INVALID_INPUT = "invalid_input", "Invalid input"
    NO_CAPABILITY = "no_capability", "No capability"
    NO_HEALTHY_INSTANCE = "no_healthy_instance", "No healthy instance"
    RATE_LIMITED = "rate_limited", "Rate limited"
    QUOTA_EXCEEDED = "quota_exceeded", "Quota exceeded"
    DEADLINE_EXCEEDED = "deadline_exceeded", "Deadline exceeded"
    UPSTREAM_TIMEOUT = "upstream_timeout", "Upstream timeout"
    UPSTREAM_ERROR = "upstream_error", "Upstream error"
    UPSTREAM_BAD_RESPONSE = "upstream_bad_response", "Upstream bad response"
    CIRCUIT_OPEN = "circuit_open", "Circuit open"
    CLIENT_CANCELLED = "client_cancelled", "Client cancelled"
