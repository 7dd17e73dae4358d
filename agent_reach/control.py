from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from agent_reach.errors import ReachError, error_from

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Registration:
    agent_id: int
    instance_id: int | None
    agent_token: str
    heartbeat_interval_seconds: int
    lease_ttl_seconds: int
    created: bool
    raw: dict


class ControlPlane:
    """A client for the control plane's registry API. ``token`` is a tenant key with the
    ``register`` scope, or an agent token; after ``register`` the agent token is used."""

    def __init__(self, base_url: str, *, token: str, timeout: float = 5.0) -> None:
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout, trust_env=False,
            headers={"Authorization": f"Bearer {token}"},
        )
        # Registering (again) uses the key given here: the agent token it returns dies
        # with the agent, if the agent is deleted.
        self._register_auth = {"Authorization": f"Bearer {token}"}

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, url: str, **kwargs) -> dict:
        response = self._client.request(method, url, **kwargs)
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {"error": {"code": "http_error", "message": response.text[:200]}}
            raise error_from(response.status_code, body, response.headers)
        return response.json() if response.content else {}

    def register(self, descriptor: dict | str) -> Registration:
        if isinstance(descriptor, str):
            body = self._call(
                "POST", "/api/v1/agents/register", content=descriptor.encode(),
                headers={"Content-Type": "application/yaml", **self._register_auth},
            )
        else:
            body = self._call("POST", "/api/v1/agents/register", json=descriptor,
                              headers=self._register_auth)
        token = body.get("agent_token")
        if token:
            self._client.headers["Authorization"] = f"Bearer {token}"
        return Registration(
            agent_id=body["agent"]["id"],
            instance_id=(body.get("instance") or {}).get("id"),
            agent_token=token or self._client.headers["Authorization"].split(" ", 1)[1],
            heartbeat_interval_seconds=body["heartbeat_interval_seconds"],
            lease_ttl_seconds=body["lease_ttl_seconds"],
            created=body["created"],
            raw=body,
        )

    def heartbeat(self, instance_id: int, **load) -> dict:
        return self._call("POST", f"/api/v1/instances/{instance_id}/heartbeat", json=load)

    def report(self, task_id: str, body: dict) -> dict:
        """Report on an asynchronous task this agent holds (its agent token)."""
        return self._call("POST", f"/api/v1/tasks/{task_id}/status", json=body)

    def deregister(self, registration: Registration) -> None:
        if registration.instance_id is not None:
            self._call("POST", f"/api/v1/instances/{registration.instance_id}/deregister")

    def keep_alive(
        self,
        registration: Registration,
        *,
        load: Callable[[], dict] | None = None,
        interval: float | None = None,
    ) -> HeartbeatLoop:
        """Heartbeat in a daemon thread until ``stop()``; failures are logged and retried."""
        loop = HeartbeatLoop(
            self, registration.instance_id,
            interval or registration.heartbeat_interval_seconds, load or dict,
        )
        loop.start()
        return loop


class HeartbeatLoop:
    def __init__(self, plane: ControlPlane, instance_id, interval: float, load) -> None:
        self._plane, self._instance_id = plane, instance_id
        self._interval, self._load = interval, load
        self._stop = threading.Event()
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="reach-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._plane.heartbeat(self._instance_id, **self._load())
                self.sent += 1
            except (httpx.HTTPError, ReachError) as exc:
                logger.warning("heartbeat failed: %s", exc)
            self._stop.wait(self._interval)


def register_patiently(plane: ControlPlane, descriptor: dict | str, *,
                       give_up_after_s: float | None = None,
                       stopped: Callable[[], bool] = lambda: False) -> Registration:
    """``plane.register``, again while the platform cannot be reached or is unavailable
    (connection refused, 5xx, 429): an agent may start before the platform does. A refusal
    that will not pass (a bad descriptor, a bad key) raises at once."""
    delay, end = 0.5, None if give_up_after_s is None else time.monotonic() + give_up_after_s
    while True:
        try:
            return plane.register(descriptor)
        except httpx.TransportError as exc:
            reason = f"cannot reach the platform ({type(exc).__name__})"
            failure: Exception = exc
        except ReachError as exc:
            if exc.status < 500 and exc.status != 429:
                raise
            reason, failure = str(exc), exc
        if stopped() or (end is not None and time.monotonic() + delay > end):
            raise failure
        logger.warning("registration: %s; trying again in %.1f s", reason, delay)
        time.sleep(delay)
        delay = min(5.0, delay * 2)
