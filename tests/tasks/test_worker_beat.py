"""The worker's embedded beat leaves with its worker, even one killed with SIGKILL."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from django.conf import settings

from tests.gateway.conftest import database_url
from tests.support.servers import platform_env
from tests.support.waiting import wait_for
from tests.tasks.conftest import Worker, needs_services

pytestmark = needs_services


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_the_embedded_beat_exits_when_its_worker_is_killed(tmp_path):
    env = platform_env(
        tmp_path, DATABASE_URL=database_url(), REDIS_URL=settings.REDIS_URL,
        REACH_REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX,
        REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS),
        REACH_SECRET_KEY=settings.SECRET_KEY, REACH_CELERY_QUEUE=f"q-{uuid.uuid4().hex[:8]}",
        CELERY_BROKER_URL=settings.REDIS_URL)
    worker = Worker(env, tmp_path / "worker.log").start()
    beat = None
    try:
        beat = wait_for(lambda: next(iter(_children(worker.proc.pid)), None), timeout=30,
                        interval=0.1, message="the worker to start its beat")
        worker.kill()  # SIGKILL: the worker cannot stop its children itself
        wait_for(lambda: not _alive(beat), timeout=10, interval=0.1,
                 message="the orphaned beat to exit")
    finally:
        worker.stop()
        if beat is not None and _alive(beat):
            os.kill(beat, 9)
