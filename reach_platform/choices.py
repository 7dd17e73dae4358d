"""Django's view of the core's kinds: ``TextChoices`` built from ``reach_core.kinds``."""

from __future__ import annotations

from django.db import models

from reach_core.kinds import Kind


def django_choices(kind: type[Kind]) -> type[models.TextChoices]:
    """The ``TextChoices`` with ``kind``'s members, values and labels (for model fields)."""
    return models.TextChoices(kind.__name__,
                              [(member.name, (member.value, member.label)) for member in kind])
