"""The embedded mode's in-process scheduler: Celery beat's schedule, run in one thread."""

from __future__ import annotations

import logging
import threading
import time

from django.db import close_old_connections

logger = logging.getLogger(__name__)


class InProcessScheduler:
    def __init__(self, jobs: dict[str, tuple[float, callable]]) -> None:
        self._jobs = jobs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reach-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        if not self._jobs:
            return
        due = {name: time.monotonic() for name in self._jobs}
        while not self._stop.is_set():
            now = time.monotonic()
            for name, (period, job) in self._jobs.items():
                if now < due[name]:
                    continue
                due[name] = now + period
                try:
                    job()
                except Exception:
                    logger.exception("scheduled job %s failed", name)
                finally:
                    close_old_connections()
            self._stop.wait(max(0.05, min(due.values()) - time.monotonic()))


def registry_jobs() -> dict[str, tuple[float, callable]]:
    """Celery beat's registry jobs, as ``{name: (period, function)}``."""
    from reach_platform.celery import PERIODIC
    from registry.probe import instances_probe
    from registry.services import instances_sweep
    from registry.tasks import apply_agents_file

    functions = {"registry.sweep_leases": instances_sweep,
                 "registry.probe_instances": instances_probe,
                 "registry.apply_agents_file": apply_agents_file}
    return {name: (PERIODIC[name], function) for name, function in functions.items()}


def metering_jobs(usage_queue) -> dict[str, tuple[float, callable]]:
    """The embedded mode's metering: drain the gateway's usage queue into the database
    (production ships it through a Redis stream to Celery), roll up, check budgets."""
    from django.utils import timezone

    from metering.alerts import alerts_check, deliver_alerts
    from metering.ingest import usage_queue_drain
    from metering.rollups import rollup_recent
    from reach_platform.celery import PERIODIC

    return {
        "metering.drain_usage": (PERIODIC["metering.consume_usage"],
                                 lambda: usage_queue_drain(usage_queue)),
        "metering.rollup": (PERIODIC["metering.rollup"],
                            lambda: rollup_recent(timezone.now())),
        "metering.check_alerts": (PERIODIC["metering.check_alerts"],
                                  lambda: alerts_check(now=timezone.now())),
        "metering.deliver_alerts": (PERIODIC["metering.deliver_alerts"], deliver_alerts),
    }


def learning_jobs(feedback_queue) -> dict[str, tuple[float, callable]]:
    """The embedded mode's route learning: drain the gateway's route-feedback queue into
    the database (production ships it through a Redis stream to Celery), and fold it into
    learned phrases."""
    from reach_platform.celery import PERIODIC
    from registry.learning import route_feedback_learn, route_feedback_queue_drain

    return {
        "registry.drain_route_feedback": (PERIODIC["registry.consume_route_feedback"],
                                          lambda: route_feedback_queue_drain(feedback_queue)),
        "registry.learn_routes": (PERIODIC["registry.learn_routes"], route_feedback_learn),
    }


def task_jobs() -> dict[str, tuple[float, callable]]:
    """Celery beat's task jobs: the sweep (lapsed claims, deadlines) and callback
    deliveries. The tasks themselves run in the gateway's in-process engine."""
    from reach_platform.celery import PERIODIC
    from tasks.callbacks import deliver_due
    from tasks.services import tasks_sweep

    functions = {"tasks.sweep": tasks_sweep, "tasks.deliver_callbacks": deliver_due}
    return {name: (PERIODIC[name], function) for name, function in functions.items()}
