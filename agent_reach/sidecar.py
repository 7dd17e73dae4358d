"""``reach-sidecar``: an existing HTTP service made an agent without changing it.

    reach-sidecar --config sidecar.yaml

The sidecar registers the service with the platform (its descriptor in the config, in the
capability.yaml format), probes the service's health endpoint and heartbeats on its behalf
with what it found: every probe counts as a call, every failed one as an error, so a
service that stops answering turns sub-healthy at the next heartbeat and gets no more
calls, and recovers when it answers again. With ``reach: tunnel`` it also holds the
tunnel for the service, which then needs no port anyone can reach. On SIGTERM it
deregisters the service and stops. Config::

    platform: http://127.0.0.1:8000     # the control plane (and the gateway, unless gateway:)
    key_env: REACH_REGISTER_KEY         # a key with the register scope, from the environment
    service: http://127.0.0.1:9000      # the service itself
    health: /healthz                    # probed every probe_interval_s (default 2 s)
    reach: direct                       # or tunnel
    agent:                              # the service as an agent (capability.yaml format,
                                        # or a JSON descriptor: one with agent_id)
      name: legacy-ocr
      capabilities:
        - id: ocr.invoice
          description: Read the fields of an invoice image
          examples: [Read the total of this invoice]   # optional routing hints,
          not_for: [receipts (use ocr.receipt)]         # as in capability.yaml
          endpoints: [{path: /ocr}]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from agent_reach.control import ControlPlane, ReachError, Registration, register_patiently
from agent_reach.tunnel import TunnelClient

logger = logging.getLogger("reach-sidecar")


CONFIG_KEYS = frozenset({"platform", "key", "key_env", "service", "health", "reach",
                         "gateway", "agent", "probe_interval_s", "heartbeat_s"})


@dataclass
class SidecarConfig:
    platform: str
    key: str
    service: str
    agent: dict
    health: str = "/healthz"
    reach: str = "direct"
    gateway: str | None = None
    probe_interval_s: float = 2.0
    heartbeat_s: float | None = None

    @classmethod
    def load(cls, path: str | Path) -> SidecarConfig:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise SystemExit(f"{path}: cannot read the config ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            raise SystemExit(f"{path}: not valid YAML ({exc})") from None
        problems = []
        if not isinstance(data, dict):
            raise SystemExit(f"{path}: the config is a YAML mapping")
        unknown = sorted(set(data) - CONFIG_KEYS)
        if unknown:
            problems.append(f"unknown setting(s) {', '.join(map(str, unknown))} (known: "
                            f"{', '.join(sorted(CONFIG_KEYS))})")
        for name in ("platform", "service", "agent"):
            if not data.get(name):
                problems.append(f"{name}: required")
        key = data.get("key") or os.environ.get(str(data.get("key_env") or ""), "")
        if not key:
            problems.append("key_env: names no set environment variable (or give key:)")
        if data.get("reach", "direct") not in ("direct", "tunnel"):
            problems.append("reach: direct or tunnel")
        agent = data.get("agent")
        if agent is not None and (not isinstance(agent, dict) or not (
                agent.get("name") or agent.get("agent_id"))):
            problems.append("agent: a capability.yaml mapping with a name")
        if problems:
            raise SystemExit(f"{path}: " + "; ".join(problems))
        return cls(platform=str(data["platform"]).rstrip("/"), key=key,
                   service=str(data["service"]).rstrip("/"), agent=agent,
                   health=str(data.get("health", "/healthz")),
                   reach=str(data.get("reach", "direct")), gateway=data.get("gateway"),
                   probe_interval_s=float(data.get("probe_interval_s", 2.0)),
                   heartbeat_s=data.get("heartbeat_s"))


class Sidecar:
    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        self.plane = ControlPlane(config.platform, token=config.key)
        self.registration: Registration | None = None
        self.instance_key = uuid.uuid4().hex
        self.tunnel: TunnelClient | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.probes = self.failures = 0
        self.healthy: bool | None = None
        self.beats = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def descriptor(self) -> str | dict:
        """The service as an agent: its capability.yaml, or its JSON descriptor (one with
        ``agent_id``), with where it is reached filled in."""
        document = dict(self.config.agent)
        if "agent_id" in document:
            reach = dict(document.get("reach") or {})
            reach.pop("endpoint", None)
            if self.config.reach == "tunnel":
                reach.update(mode="tunnel", instance=self.instance_key)
            else:
                reach["endpoint"] = self.config.service + "/"
            return {**document, "reach": reach}
        document.pop("endpoint", None)
        if self.config.reach == "tunnel":
            document["reach"] = {"mode": "tunnel", "instance": self.instance_key}
        else:
            document["endpoint"] = self.config.service + "/"
        return yaml.safe_dump(document, allow_unicode=True, sort_keys=False)

    def start(self, *, register_wait_s: float | None = 30.0) -> Sidecar:
        self.registration = register_patiently(self.plane, self.descriptor(),
                                               give_up_after_s=register_wait_s,
                                               stopped=self._stop.is_set)
        threading.Thread(target=self._probe_forever, name="sidecar-probe", daemon=True).start()
        threading.Thread(target=self._beat_forever, name="sidecar-beat", daemon=True).start()
        if self.config.reach == "tunnel":
            self.tunnel = TunnelClient(self.config.gateway or self.config.platform,
                                       token=self.registration.agent_token,
                                       instance_id=self.registration.instance_id,
                                       target=self.config.service)
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="sidecar-tunnel",
                             daemon=True).start()
            asyncio.run_coroutine_threadsafe(self.tunnel.run(), self._loop)
        logger.info("registered %s (instance %s, %s)",
                    self.config.agent.get("name") or self.config.agent.get("agent_id"),
                    self.registration.instance_id, self.config.reach)
        return self

    def _retunnel(self) -> None:
        """After registering again: the tunnel goes on with the new token and instance."""
        old = self.tunnel
        if old is None or self._loop is None or (old.token, old.instance_id) == (
                self.registration.agent_token, self.registration.instance_id):
            return
        self._loop.call_soon_threadsafe(old.stop)
        self.tunnel = TunnelClient(self.config.gateway or self.config.platform,
                                   token=self.registration.agent_token,
                                   instance_id=self.registration.instance_id,
                                   target=self.config.service)
        asyncio.run_coroutine_threadsafe(self.tunnel.run(), self._loop)

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(ReachError, httpx.HTTPError):
            if self.registration is not None:
                self.plane.deregister(self.registration)
        if self.tunnel is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.tunnel.stop)
        self.plane.close()

    def _probe_forever(self) -> None:
        url = self.config.service + "/" + self.config.health.lstrip("/")
        with httpx.Client(timeout=min(2.0, self.config.probe_interval_s * 2),
                          trust_env=False) as client:
            while not self._stop.is_set():
                try:
                    ok = 200 <= client.get(url).status_code < 300
                except httpx.HTTPError:
                    ok = False
                with self._lock:
                    self.probes += 1
                    self.failures += 0 if ok else 1
                if ok != self.healthy:
                    logger.info("service %s", "answers" if ok else "does not answer")
                    self.healthy = ok
                self._stop.wait(self.config.probe_interval_s)

    def _beat_forever(self) -> None:
        interval = self.config.heartbeat_s or self.registration.heartbeat_interval_seconds
        while not self._stop.wait(interval):
            with self._lock:
                probes, failures = self.probes, self.failures
                self.probes = self.failures = 0
            # The service's health as calls: a service that fails its probes is a
            # service whose calls fail (sub-healthy: no more callers until it answers).
            load = {"processed_recent": probes, "errors_recent": failures,
                    "in_flight": 0}
            try:
                self.plane.heartbeat(self.registration.instance_id, **load)
                self.beats += 1
            except ReachError as exc:
                if exc.status in (401, 404, 410):  # the instance or the agent forgotten
                    with contextlib.suppress(ReachError, httpx.HTTPError):
                        self.registration = self.plane.register(self.descriptor())
                        self._retunnel()
                else:
                    logger.warning("heartbeat refused: %s", exc)
            except httpx.HTTPError as exc:
                logger.warning("heartbeat failed: %s", exc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="reach-sidecar", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="the sidecar's YAML config")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        stream=sys.stdout)
    try:
        sidecar = Sidecar(SidecarConfig.load(args.config)).start(register_wait_s=None)
    except ReachError as exc:
        raise SystemExit(f"reach-sidecar: the platform refused the registration: {exc}"
                         + (f" {exc.details}" if exc.details else "")) from None
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    print("READY", flush=True)
    stop.wait()
    sidecar.stop()


if __name__ == "__main__":
    main()
