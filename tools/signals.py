"""A tool's every change, and its grants', reaches the gateways as a route-table delta
(as agents' do: ``registry.signals``)."""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from registry import routes
from tools.models import Tool, ToolGrant


@receiver([post_save, post_delete], sender=Tool)
def _tool_changed(sender, instance, **kwargs) -> None:
    if not kwargs.get("raw"):
        routes.changed("tool", instance.pk)


@receiver([post_save, post_delete], sender=ToolGrant)
def _grant_changed(sender, instance, **kwargs) -> None:
    if not kwargs.get("raw"):
        routes.changed("tool", instance.tool_id)
