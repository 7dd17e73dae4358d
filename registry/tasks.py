"""Periodic registry jobs. Thin: each calls one service. Celery beat runs them in
production; the run command's in-process scheduler runs the same functions."""

from __future__ import annotations

from celery import shared_task

from registry.probe import instances_probe
from registry.services import instances_sweep


@shared_task(name="registry.sweep_leases", ignore_result=True)
def sweep_leases() -> dict[str, int]:
    return instances_sweep()


@shared_task(name="registry.probe_instances", ignore_result=True)
def probe_instances() -> dict[str, int]:
    return instances_probe()
