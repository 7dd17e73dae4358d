"""The Celery app: workers and beat for production (``REDIS_URL`` as broker by default).

    celery -A reach_platform worker -B

In embedded mode the run command's in-process scheduler calls the same task
functions instead (``reach_platform.scheduler``).
"""

from __future__ import annotations

import os
import threading
import time

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "reach_platform.settings")

app = Celery("reach_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Periods in seconds; shared with the in-process scheduler.
PERIODIC = {
    "registry.sweep_leases": 2.0,
    "registry.probe_instances": 10.0,
    "registry.consume_route_feedback": 2.0,
    "registry.learn_routes": 60.0,
    "registry.apply_agents_file": 1.0,
    "metering.consume_usage": 1.0,
    "metering.rollup": 60.0,
    # Budgets (80 %, 100 %) and agents without a healthy instance; then their webhooks.
    "metering.check_alerts": 30.0,
    "metering.deliver_alerts": 1.0,
    "metering.restore_budget_counters": 60.0,
    "tasks.sweep": 2.0,
    "tasks.deliver_callbacks": 1.0,
}
app.conf.beat_schedule = {
    name: {"task": name, "schedule": period} for name, period in PERIODIC.items()
}


def _exit_with_parent(parent: int, poll_s: float = 0.5) -> None:
    """Exit this process once ``parent`` is gone (we are re-parented)."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    os._exit(0)


def _follow_the_parent() -> None:
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),),
                     name="follows-its-worker", daemon=True).start()


@worker_init.connect
def _children_follow_the_worker(**_) -> None:
    """``worker -B`` runs beat as a forked child, which outlives a worker killed with
    SIGKILL: restarted workers then each add a beat, and the extra beats flood the queue
    with periodic jobs until sweeps and callbacks fall minutes behind. Every child forked
    from here leaves once its worker is gone (set at the fork, so no start-up window)."""
    os.register_at_fork(after_in_child=_follow_the_parent)
