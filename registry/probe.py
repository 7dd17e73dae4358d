"""Active health probes: the one place the control plane calls agents.

An instance that stopped heartbeating (unknown or offline) is probed with a
GET on its agent's ``probe_path``; a 2xx brings it back. The endpoint is
checked against the allow-list again after DNS resolution, like the gateway
does, so a probe cannot be turned against an address the policy refuses.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
from urllib.parse import urljoin, urlsplit

import httpx
from django.utils import timezone

from registry.choices import InstanceState, ReachMode
from registry.endpoints import EndpointRefused, check_resolved
from registry.models import Instance
from registry.services import endpoint_policy, instance_recover

logger = logging.getLogger(__name__)

PROBE_TIMEOUT = httpx.Timeout(2.0, connect=1.0)


def probe_client() -> httpx.Client:
    """The probe's HTTP client: short timeouts, no redirects, no environment proxies."""
    return httpx.Client(timeout=PROBE_TIMEOUT, follow_redirects=False, trust_env=False)


def _resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


def probe_one(instance: Instance, client: httpx.Client) -> bool:
    """GET the instance's probe URL; True on a 2xx. Never raises for network trouble."""
    url = urljoin(instance.endpoint, instance.agent.probe_path.lstrip("/"))
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        check_resolved(parts.hostname or "", port, _resolve(parts.hostname or "", port),
                       endpoint_policy())
        response = client.get(url)
    except EndpointRefused as exc:
        logger.warning("probe of instance %s refused: %s", instance.pk, exc)
        return False
    except (httpx.HTTPError, OSError):
        return False
    return 200 <= response.status_code < 300


def instances_probe(
    *, now: dt.datetime | None = None, client: httpx.Client | None = None
) -> dict[str, int]:
    """Probe every direct instance that is unknown or offline; recover those that answer."""
    now = now or timezone.now()
    counts = {"probed": 0, "recovered": 0}
    owned = client is None
    client = client or probe_client()
    try:
        candidates = Instance.objects.select_related("agent").filter(
            state__in=[InstanceState.UNKNOWN, InstanceState.OFFLINE],
            reach_mode=ReachMode.DIRECT,
        )
        for instance in candidates:
            counts["probed"] += 1
            if probe_one(instance, client) and instance_recover(instance=instance, now=now):
                counts["recovered"] += 1
    finally:
        if owned:
            client.close()
    return counts
