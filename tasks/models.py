"""Asynchronous tasks, their history, their callback deliveries and the secrets that sign them.

A task row is the truth about a task: the gateway commits it before answering 202, workers
claim it with a conditional update and a lease, results are written to it before any
callback is attempted, and a delivery row stays until its receiver acknowledged it.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from reach_platform.scoping import TenantScopedQuerySet
from tasks.choices import DeliveryStatus, TaskState


class SigningSecret(models.Model):
    """A tenant's secret for signing callbacks (HMAC-SHA256). Stored encrypted (the
    platform signs with it); its plaintext is shown once, in the answer that creates it."""

    tenant_path = "tenant_id"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE,
                               related_name="signing_secrets")
    name = models.SlugField(max_length=63, default="default")
    secret_ciphertext = models.BinaryField(editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"],
                                               name="signing_secret_unique_name")]

    def __str__(self) -> str:
        return f"{self.tenant} / {self.name}"


class Task(models.Model):
    tenant_path = "tenant_id"
    agent_path = "agent_id"  # an agent's token sees the tasks its agent holds

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="tasks")
    request_id = models.CharField(max_length=128)
    # The caller's Idempotency-Key, or one made for the task: it travels to the agent on
    # every attempt and in every callback, so each can tell a repeat.
    idempotency_key = models.CharField(max_length=255)
    caller_key = models.BooleanField(default=False, help_text="The key is the caller's own.")
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the submitted body.")
    request = models.JSONField(help_text="The call as submitted: capability or intent, "
                                         "input, params, namespace, min_version, cost.")
    capability = models.CharField(max_length=200, blank=True)
    state = models.CharField(max_length=16, choices=TaskState, default=TaskState.SUBMITTED)
    message = models.TextField(blank=True, help_text="The agent's latest word to the caller.")
    progress = models.FloatField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    agent = models.ForeignKey("registry.Agent", on_delete=models.SET_NULL, null=True,
                              blank=True, related_name="tasks")
    # Not a foreign key: instances come and go; a continuation goes back to this one
    # while it is alive.
    instance_id = models.BigIntegerField(null=True, blank=True)
    agent_task_id = models.CharField(max_length=255, blank=True)
    agent_context_id = models.CharField(max_length=255, blank=True)
    messages = models.JSONField(default=list, blank=True,
                                help_text="What the caller sent to continue the task.")
    attempts = models.PositiveIntegerField(default=0)
    # The claim of the worker running an attempt (empty while nobody runs it: submitted,
    # held by the agent, or interrupted) and how long it holds without renewal.
    claim = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    run_after = models.DateTimeField(help_text="Not claimed before this (a retry's backoff).")
    deadline_at = models.DateTimeField()
    callback_url = models.CharField(max_length=2048, blank=True)
    signing_secret = models.ForeignKey(SigningSecret, on_delete=models.SET_NULL, null=True,
                                       blank=True, related_name="tasks")
    push_token_hash = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["tenant", "idempotency_key"],
                                               name="task_unique_idempotency_key")]
        indexes = [
            models.Index(fields=["state", "run_after"], name="task_claimable"),
            models.Index(fields=["state", "lease_expires_at"], name="task_leases"),
            models.Index(fields=["tenant", "state", "created_at"], name="task_by_tenant"),
        ]

    def __str__(self) -> str:
        return f"task {self.pk} ({self.state})"


class TaskEvent(models.Model):
    """One state change of a task (or a progress report): its history, and what
    ``/v1/tasks/<id>/events`` streams."""

    tenant_path = "task__tenant_id"

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=TaskState)
    message = models.TextField(blank=True)
    progress = models.FloatField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.task_id} {self.state} at {self.at:%H:%M:%S}"


class Delivery(models.Model):
    """One signed announcement POSTed until its receiver answers 2xx: the machinery task
    callbacks and alerts (``metering.AlertDelivery``) share. Its id is the delivery id a
    receiver sees on every attempt, so it can acknowledge a repeat as a repeat."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    status = models.CharField(max_length=16, choices=DeliveryStatus,
                              default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    # A sender's hold on the delivery while it posts (a crashed sender's hold lapses).
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        abstract = True
        ordering = ["created_at"]


class CallbackDelivery(Delivery):
    """One announcement of a task's state to its callback URL."""

    tenant_path = "task__tenant_id"

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(max_length=16, choices=TaskState,
                             help_text="The task state this delivery announces.")

    class Meta(Delivery.Meta):
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_due",
                                condition=Q(status="pending"))]

    def __str__(self) -> str:
        return f"delivery {self.pk} of {self.task_id} ({self.status})"
