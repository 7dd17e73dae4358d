"""Active health probes.

An instance that stopped heartbeating (unknown or offline) is probed with a
GET on its agent's ``probe_path``, through the control plane's bounded outbound
client (``reach_platform.outbound``: pinned to checked addresses, no redirects,
bounded size and time).

The probe's rule: healthy only on a 2xx whose whole body fits in
``PROBE_MAX_BYTES`` (4 KiB) and arrives within ``PROBE_DEADLINE_S``. A
health endpoint that answers more than that, or slower, is not answering as a
health endpoint should: it is counted unhealthy, and the rest of its answer
is never read (the connection is closed).
"""

from __future__ import annotations

import datetime as dt
import logging
from urllib.parse import urljoin

from django.utils import timezone

from reach_core.endpoints import BlockingResolver, EndpointRefused
from reach_platform.endpoints import endpoint_policy
from reach_platform.outbound import FetchFailed, bounded_get
from registry.choices import InstanceState, ReachMode
from registry.models import Instance
from registry.services import instance_recover

logger = logging.getLogger(__name__)

PROBE_MAX_BYTES = 4 * 1024
PROBE_DEADLINE_S = 2.0
PROBE_CONNECT_TIMEOUT_S = 1.0


def probe_one(instance: Instance, *, resolver: BlockingResolver | None = None) -> bool:
    """GET the instance's probe URL; True only on a complete 2xx answer (module docstring).
    Never raises for network trouble."""
    url = urljoin(instance.endpoint, instance.agent.probe_path.lstrip("/"))
    try:
        response = bounded_get(url, endpoint_policy(), max_bytes=PROBE_MAX_BYTES,
                               deadline_s=PROBE_DEADLINE_S,
                               connect_timeout_s=PROBE_CONNECT_TIMEOUT_S, resolver=resolver)
    except EndpointRefused as exc:
        logger.warning("probe of instance %s refused: %s", instance.pk, exc)
        return False
    except (FetchFailed, OSError):
        return False
    if not response.complete:
        logger.warning("probe of instance %s: answer larger than %s bytes, counted unhealthy",
                       instance.pk, PROBE_MAX_BYTES)
        return False
    return 200 <= response.status < 300


def instances_probe(
    *, now: dt.datetime | None = None, resolver: BlockingResolver | None = None
) -> dict[str, int]:
    """Probe every direct instance that is unknown or offline; recover those that answer."""
    now = now or timezone.now()
    counts = {"probed": 0, "recovered": 0}
    candidates = Instance.objects.select_related("agent").filter(
        state__in=[InstanceState.UNKNOWN, InstanceState.OFFLINE],
        reach_mode=ReachMode.DIRECT,
    )
    for instance in candidates:
        counts["probed"] += 1
        if probe_one(instance, resolver=resolver) and instance_recover(instance=instance,
                                                                        now=now):
            counts["recovered"] += 1
    return counts
