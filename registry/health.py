"""Instance health: pure functions over the facts a heartbeat or a clock tick brings.

States (``InstanceState``): healthy -> unknown (lease expired; probes only, no
caller traffic, for ``UNKNOWN_GRACE``) -> offline. Draining is set by people
and left alone here. Tiers (``HealthTier``) come from reported load.

A lease means it: once it has lapsed the instance gets no caller traffic until
a heartbeat or a probe proves it alive. The router enforces that itself from
the lease expiry each ``InstanceEntry`` carries, so it does not wait for the
sweep to mark the instance unknown. A heartbeat within 2 x TTL of the lapse is
a flap: the instance keeps its place (no re-registration) with reduced weight.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from registry.choices import HealthTier, InstanceState

UNKNOWN_GRACE = dt.timedelta(seconds=30)
# Thresholds for the tiers; the seeds' field values.
OVERLOADED_CPU = 0.85
OVERLOADED_MEMORY = 0.90
OVERLOADED_QUEUE = 50
SUB_HEALTHY_ERROR_RATIO = 0.5
SUB_HEALTHY_MIN_VOLUME = 5
# An overloaded instance stays overloaded until its load falls this far below the
# thresholds: load hovering at a threshold would otherwise flip the tier on every
# heartbeat, and each flip is a database write and a route-table version.
OVERLOAD_HYSTERESIS = 0.10
QUEUE_HYSTERESIS = 10


@dataclass(frozen=True)
class Load:
    cpu: float = 0.0
    memory: float = 0.0
    queue_depth: int = 0
    in_flight: int = 0
    processed_recent: int = 0
    errors_recent: int = 0


def tier_from_load(load: Load, current: str | None = None) -> HealthTier:
    """The tier ``load`` puts an instance in, given the tier it is in (``current``)."""
    # Work in flight with nothing completed in the window: the instance accepts
    # calls but does not finish them (a hung worker). Only probes go there.
    if load.in_flight > 0 and load.processed_recent == 0:
        return HealthTier.SUB_HEALTHY
    if (
        load.processed_recent >= SUB_HEALTHY_MIN_VOLUME
        and load.errors_recent / load.processed_recent >= SUB_HEALTHY_ERROR_RATIO
    ):
        return HealthTier.SUB_HEALTHY
    staying = current == HealthTier.OVERLOADED
    slack = OVERLOAD_HYSTERESIS if staying else 0.0
    if (
        load.cpu >= OVERLOADED_CPU - slack
        or load.memory >= OVERLOADED_MEMORY - slack
        or load.queue_depth >= OVERLOADED_QUEUE - (QUEUE_HYSTERESIS if staying else 0)
    ):
        return HealthTier.OVERLOADED
    return HealthTier.HEALTHY


@dataclass(frozen=True)
class Liveness:
    """What the clock and heartbeats decide about one instance."""

    state: str
    state_changed_at: dt.datetime | None
    flaps: int
    last_flap_at: dt.datetime | None


def on_heartbeat(
    current: Liveness,
    *,
    now: dt.datetime,
    ttl: dt.timedelta,
    lease_expires_at: dt.datetime | None = None,
) -> Liveness:
    """The instance answered. A return from unknown/offline within 2 x TTL is a flap.

    ``lease_expires_at`` is the lease this heartbeat renews. A healthy instance whose
    lease had already lapsed (routers stopped sending it traffic, the sweep just had
    not run yet) is returning too: within 2 x TTL of the lapse that is a flap."""
    flaps, last_flap_at = current.flaps, current.last_flap_at
    if flaps and last_flap_at and now - last_flap_at > 2 * ttl:
        flaps, last_flap_at = 0, None  # quiet long enough: forgiven
    if current.state == InstanceState.DRAINING:
        return Liveness(current.state, current.state_changed_at, flaps, last_flap_at)
    if current.state == InstanceState.HEALTHY:
        if lease_expires_at is not None and now >= lease_expires_at:
            if now - lease_expires_at <= 2 * ttl:
                flaps, last_flap_at = flaps + 1, now
            return Liveness(InstanceState.HEALTHY, now, flaps, last_flap_at)
        return Liveness(current.state, current.state_changed_at, flaps, last_flap_at)
    if current.state_changed_at is not None and now - current.state_changed_at <= 2 * ttl:
        flaps, last_flap_at = flaps + 1, now
    return Liveness(InstanceState.HEALTHY, now, flaps, last_flap_at)


def on_tick(
    current: Liveness, *, lease_expires_at: dt.datetime | None, now: dt.datetime
) -> Liveness:
    """The clock moved. Returns ``current`` unchanged when nothing is due."""
    if current.state == InstanceState.HEALTHY and lease_expires_at and now >= lease_expires_at:
        return Liveness(InstanceState.UNKNOWN, now, current.flaps, current.last_flap_at)
    if (
        current.state == InstanceState.UNKNOWN
        and current.state_changed_at is not None
        and now >= current.state_changed_at + UNKNOWN_GRACE
    ):
        return Liveness(InstanceState.OFFLINE, now, current.flaps, current.last_flap_at)
    return current


_STATE_FACTOR = {
    InstanceState.HEALTHY: 1.0,
    # Lease lapsed: probes only until a heartbeat or a probe proves it alive.
    InstanceState.UNKNOWN: 0.0,
    InstanceState.OFFLINE: 0.0,
    InstanceState.DRAINING: 0.0,
}
_TIER_FACTOR = {
    HealthTier.HEALTHY: 1.0,
    HealthTier.OVERLOADED: 0.5,
    # Sub-healthy instances get probe traffic only; the router decides that from
    # the tier, so their weight for normal traffic is zero.
    HealthTier.SUB_HEALTHY: 0.0,
}


def weight_factor(*, state: str, health_tier: str, flaps: int) -> float:
    """Multiplier on the agent's weight. Each recent flap halves it, down to 1/8."""
    return _STATE_FACTOR[state] * _TIER_FACTOR[health_tier] * 0.5 ** min(flaps, 3)
