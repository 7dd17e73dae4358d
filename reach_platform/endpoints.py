"""The endpoint policy of this process's settings: which upstream addresses agents,
callbacks and the gateway may reach (``reach_core.endpoints`` holds the policy itself)."""

from __future__ import annotations

from functools import cache

from django.conf import settings

from reach_core.endpoints import EndpointPolicy


@cache
def _policy(allow: tuple[str, ...], own_ports: tuple[int, ...]) -> EndpointPolicy:
    return EndpointPolicy.from_setting(allow, own_ports)


def endpoint_policy() -> EndpointPolicy:
    # Keyed by the settings' values, so a test that overrides them gets its own policy.
    return _policy(tuple(settings.UPSTREAM_ALLOW), tuple(settings.OWN_PORTS))
