"""The Celery app: workers and beat for production (``REDIS_URL`` as broker by default).

    celery -A reach_platform worker -B

In embedded mode the run command's in-process scheduler calls the same task
functions instead (``reach_platform.scheduler``).
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")

app = Celery("reach_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Periods in seconds; shared with the in-process scheduler.
PERIODIC = {
    "registry.sweep_leases": 2.0,
    "registry.probe_instances": 10.0,
    "metering.consume_usage": 1.0,
    "metering.rollup": 60.0,
    "metering.check_budgets": 60.0,
    "metering.restore_budget_counters": 60.0,
    "tasks.sweep": 2.0,
    "tasks.deliver_callbacks": 1.0,
}
app.conf.beat_schedule = {
    name: {"task": name, "schedule": period} for name, period in PERIODIC.items()
}
