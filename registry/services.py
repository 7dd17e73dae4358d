"""Writes for the registry."""

from __future__ import annotations

from registry.choices import InstanceState
from registry.models import Instance


def instance_drain(*, instance: Instance) -> Instance:
    """Stop new traffic to ``instance``; calls in flight finish. Draining twice is a no-op."""
    if instance.state != InstanceState.DRAINING:
        instance.state = InstanceState.DRAINING
        instance.save(update_fields=["state"])
    return instance
