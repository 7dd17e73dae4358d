"""SDK agents, tunnels and the sidecar against a real platform: the task platform (a gateway
serving the API too, and a Celery worker), plus gateway-only processes where a test needs
several, all on this run's PostgreSQL and Redis."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from django.conf import settings

from registry.models import Instance
from tests.gateway.conftest import database_url
from tests.support.servers import (
    GATEWAY_ONLY,
    ROOT,
    free_port,
    platform_env,
    uvicorn_args,
    wait_until_serving,
)
from tests.tasks.conftest import needs_services, platform  # noqa: F401  (the fixture)

__all__ = ["GatewayProcess", "needs_services", "sdk_agent_process"]


class GatewayProcess:
    """A gateway-only process on a fixed port, which a test can stop and start again."""

    def __init__(self, tmp_path, name: str, env_extra: dict | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"{name}.log"
        self.env = platform_env(
            tmp_path, DATABASE_URL=database_url(), REDIS_URL=settings.REDIS_URL,
            REACH_REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX,
            REACH_CREDENTIAL_KEYS=",".join(settings.CREDENTIAL_KEYS),
            REACH_SECRET_KEY=settings.SECRET_KEY, **(env_extra or {}))
        self.proc: subprocess.Popen | None = None

    def start(self) -> GatewayProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, *uvicorn_args(self.port,
                                                                        GATEWAY_ONLY)],
                                         cwd=ROOT, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT)
        wait_until_serving(self.base, self.proc)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def sdk_agent_process(platform_url: str, key: str, reach: str, gateway: str | None = None,
                      grace_s: str | None = None):
    """``tests.agents.sdk_agent`` in a process of its own; yields ``(proc, instance id)``."""
    args = [sys.executable, "-m", "tests.agents.sdk_agent", platform_url, key, reach]
    if gateway:
        args.append(gateway)
    env = {**os.environ, **({"SDK_AGENT_GRACE_S": grace_s} if grace_s else {})}
    log = open(os.environ.get("SDK_AGENT_LOG", os.devnull), "a")  # noqa: SIM115
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
                            env=env)
    try:
        line = proc.stdout.readline().strip()
        if not line.startswith("READY"):
            proc.kill()
            raise RuntimeError(f"the SDK agent did not start: {line!r}")
        yield proc, int(line.split()[1])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        log.close()


def instance(pk: int) -> Instance:
    return Instance.objects.get(pk=pk)
