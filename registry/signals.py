"""Every write to a row the data plane reads schedules a route-table delta.

Signals rather than service calls so that nothing can bypass publication:
the admin, the API, services and a shell session all go through ``save()``.
Bulk ``update()`` calls skip signals and must call ``routes.changed``.
"""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver

from registry import heartbeats, routes
from registry.models import Agent, AgentToken, Capability, Instance, LearnedPhrase
from tenants.models import ApiKey, Credential, Grant, Quota, Tenant

_KINDS = {Tenant: "tenant", ApiKey: "api_key", Grant: "grant", Credential: "credential",
          Quota: "quota", LearnedPhrase: "learned"}


@receiver(pre_save)
def _remember_the_agent(sender, instance, **kwargs) -> None:
    """A capability or an instance moved to another agent leaves the one it was on: that
    agent is published too (a break test: a capability moved away, then deleted, was
    still served by its first agent on every gateway)."""
    if sender not in (Capability, Instance) or instance.pk is None or kwargs.get("raw"):
        return
    fields = kwargs.get("update_fields")
    if fields is not None and not {"agent", "agent_id"} & set(fields):
        return  # a save naming its fields, the agent not among them (heartbeats)
    instance._agent_before = sender.objects.filter(pk=instance.pk).values_list(
        "agent_id", flat=True).first()


@receiver([post_save, post_delete])
def _route_change(sender, instance, **kwargs) -> None:
    if kwargs.get("raw"):
        return  # fixtures loading
    if sender is Agent:
        routes.changed("agent", instance.pk)
        # Its lease TTL or interval may have changed: each instance's next beat is
        # judged by the database (deleted instances are forgotten one by one).
        heartbeats.forget_on_commit(*instance.instances.values_list("pk", flat=True))
    elif sender in (Capability, Instance):
        routes.changed("agent", instance.agent_id)
        before = getattr(instance, "_agent_before", None)
        if before is not None and before != instance.agent_id:
            routes.changed("agent", before)
        if sender is Instance:
            # Any write but a heartbeat's: the next beat is judged by the database.
            heartbeats.forget_on_commit(instance.pk)
    elif sender in _KINDS:
        routes.changed(_KINDS[sender], instance.pk)
    if sender is AgentToken:
        heartbeats.forget_tokens_on_commit(instance.key_hash)
    elif sender is Tenant:
        # Disabled (or changed): its agents' tokens go back to the view, which refuses
        # them if the tenant is disabled.
        heartbeats.forget_tokens_on_commit(*AgentToken.objects.filter(
            agent__owner_tenant_id=instance.pk).values_list("key_hash", flat=True))
