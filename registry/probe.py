"""Active health probes: the one place the control plane calls agents.

An instance that stopped heartbeating (unknown or offline) is probed with a
GET on its agent's ``probe_path``; a 2xx brings it back. The endpoint is
checked against the allow-list again after DNS resolution, like the gateway
does, so a probe cannot be turned against an address the policy refuses.
"""

from __future__ import annotations

import datetime as dt
import logging
from urllib.parse import urljoin

import httpx
from django.utils import timezone

from reach_core.endpoints import EndpointRefused, resolve_and_check_blocking
from registry.choices import InstanceState, ReachMode
from registry.models import Instance
from registry.services import endpoint_policy, instance_recover

logger = logging.getLogger(__name__)

PROBE_TIMEOUT = httpx.Timeout(2.0, connect=1.0)


def probe_client() -> httpx.Client:
    """The probe's HTTP client: short timeouts, no redirects, no environment proxies."""
    return httpx.Client(timeout=PROBE_TIMEOUT, follow_redirects=False, trust_env=False)


def probe_one(instance: Instance, client: httpx.Client) -> bool:
    """GET the instance's probe URL; True on a 2xx. Never raises for network trouble."""
    url = urljoin(instance.endpoint, instance.agent.probe_path.lstrip("/"))
    try:
        resolve_and_check_blocking(url, endpoint_policy())
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
