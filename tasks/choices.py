from django.db import models

from reach_core import kinds
from reach_platform.choices import django_choices

TaskState = django_choices(kinds.TaskState)


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending (due, or waiting to retry)"
    DELIVERED = "delivered", "Delivered (acknowledged with a 2xx)"
    EXHAUSTED = "exhausted", "Undelivered (retries exhausted)"
