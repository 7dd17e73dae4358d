"""The gateway's settings, as one value object built by the ASGI entry point.

The gateway never reads Django settings itself: ``reach_platform.asgi`` builds
this from them, and tests build it directly.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass, field
from functools import lru_cache

from reach_core import filerefs
from reach_core.endpoints import EndpointPolicy
from reach_core.envrefs import DEFAULT_PATTERNS


@dataclass(frozen=True)
class GatewayConfig:
    policy: EndpointPolicy
    # Fernet keys for downstream credentials (the first encrypts, all decrypt).
    credential_keys: tuple[str, ...] = ()
    # The environment variables credentials and tools may name (reach_core.envrefs).
    credential_env: tuple[str, ...] = DEFAULT_PATTERNS
    # The directory mTLS certificate and key files must lie in (reach_core.filerefs).
    credential_files: str = filerefs.DEFAULT_DIRECTORY
    max_body_bytes: int = 1024 * 1024
    # The whole request body must arrive within this, or 408 request_timeout: a sender
    # that stalls mid-body would otherwise hold a call slot for as long as it likes.
    body_timeout_s: float = 10.0
    max_header_bytes: int = 16 * 1024
    max_upstream_bytes: int = 10 * 1024 * 1024
    connect_timeout_s: float = 3.0
    stream_idle_timeout_s: float = 15.0
    # Ceiling on any call's budget, whatever the agent declares.
    max_timeout_ms: int = 300_000
    # Kept back from the budget passed downstream, so the agent answers (or gives
    # up) before the gateway's own clock runs out: min(cap, share x remaining).
    deadline_margin_ms: int = 50
    deadline_margin_share: float = 0.1
    retry_backoff_ms: tuple[int, int] = (10, 50)
    # How long a budget reservation or an idempotency claim outlives its call's deadline
    # when the call never settles it (its gateway died): then it lapses on its own.
    lease_margin_s: float = 5.0
    # Load shedding: calls this process runs at once; one more is answered 503
    # overloaded at once, rather than queued into everyone's time-outs.
    max_in_flight: int = 1024
    # The most of that limit one tenant's calls may hold (rounded up), so one tenant
    # cannot shut the others out; 1.0: no share.
    tenant_share: float = 0.75
    # The CPU's guard: a loop that runs this late, tick after tick, shrinks the limit on
    # calls in flight until it is on time again (gateway.app.LoadShedder; 0: off). Off
    # here because it depends on how busy the machine is, which in-process tests must
    # not; deployments get REACH_GATEWAY_MAX_LOOP_LAG_MS (20) from the settings.
    max_loop_lag_ms: float = 0.0
    # Each tenant's share of this process's CPU for intent matching (gateway.intent_cpu):
    # milliseconds per second, and the most it may spend at once (0: no limit).
    intent_cpu_ms_per_s: float = 500.0
    intent_cpu_burst_ms: float = 500.0
    # How long a call waits for one of an agent's pool connections (its max_conns)
    # before 503 upstream_busy: a bounded wait, not a queue into time-outs.
    upstream_wait_s: float = 1.0
    # Failed authentications per client address per minute before that address gets
    # 429 too_many_requests for the rest of the minute (guessing keys costs time; 0: off).
    max_auth_failures_per_minute: int = 30
    # Keyed calls may be retried after a time-out: their first attempt gets this share
    # of the budget, so the one retry still fits inside it.
    first_attempt_share: float = 0.6
    # Source networks internal_only agents accept.
    internal_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(
        default_factory=lambda: (ipaddress.ip_network("127.0.0.0/8"),
                                 ipaddress.ip_network("::1/128"))
    )

    # Who may read /metrics (tenant, agent and capability names of every tenant, and
    # their volumes): callers from these networks, or presenting ``metrics_token``.
    metrics_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(
        default_factory=lambda: (ipaddress.ip_network("127.0.0.0/8"),
                                 ipaddress.ip_network("::1/128"))
    )
    metrics_token: str = ""

    def is_internal(self, address: str | None) -> bool:
        if not address:
            return False
        return _in_networks(address, self.internal_networks)

    def may_read_metrics(self, address: str | None, authorization: str | None) -> bool:
        if self.metrics_token and authorization is not None and hmac.compare_digest(
                authorization.encode(), f"Bearer {self.metrics_token}".encode()):
            return True
        return bool(address) and _in_networks(address, self.metrics_networks)


@lru_cache(maxsize=4096)
def _in_networks(address: str, networks: tuple) -> bool:
    # Callers come from few addresses; parsing one per call showed in profiles.
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)
