"""Publishing route-table changes: every committed change becomes a versioned delta.

Model signals (``registry.signals``) and services call ``changed(kind, pk)``
inside their transaction. After the commit, each changed row gets the next
global version under the counter's row lock, its entry is read back as
committed, and the delta goes out on the bus. Versions are handed out in the
order the entries were read, so a later version never carries older state;
a subscriber that sees versions out of order reloads instead of guessing.

Accepted race: if the database fails between a change's commit and its
version bump, that change is published only by the next change of the same
row or by a subscriber's full reload.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import transaction
from django.db.models import F

from reach_core import outage
from reach_platform.bus import route_bus
from registry.models import RouteChange, RouteVersion
from registry.snapshot import entry_for
from routing.table import Delta, LoadReport, delta_to_wire, load_to_wire

logger = logging.getLogger(__name__)

_pending = threading.local()


def _pending_set() -> set[tuple[str, int]]:
    if not hasattr(_pending, "keys"):
        _pending.keys = set()
    return _pending.keys


def changed(kind: str, pk: int) -> None:
    """Publish ``kind``/``pk`` once the current transaction commits (at once outside one)."""
    _pending_set().add((kind, pk))
    # Registered every time: after a rollback the callback is dropped, and the
    # next change must still schedule a flush (the set is drained by whichever runs).
    transaction.on_commit(flush)


def flush() -> list[Delta]:
    keys = sorted(_pending_set())
    _pending_set().clear()
    deltas = []
    for kind, pk in keys:
        try:
            deltas.append(_version_and_read(kind, pk))
        except Exception:
            logger.exception("route table: could not publish %s %s", kind, pk)
    bus = route_bus()
    for delta in deltas:
        # When it left: subscribers time its way to them (registration to routable).
        _publish(bus, {**delta_to_wire(delta), "published_at": time.time()})
    return deltas


def _publish(bus, message: dict) -> None:
    # Redis failed a moment ago: skip it rather than wait out its timeout again.
    # Subscribers find a missed delta by their version check within seconds, and a
    # missed load report is replaced by the next heartbeat.
    if outage.REDIS.away():
        return
    if bus.publish(message) is False:
        outage.REDIS.failed()


@transaction.atomic
def _version_and_read(kind: str, pk: int) -> Delta:
    counter = RouteVersion.objects.select_for_update().filter(pk=1)
    if not counter.update(version=F("version") + 1):
        RouteVersion.objects.get_or_create(pk=1, defaults={"version": 1})
    version = counter.values_list("version", flat=True).get()
    RouteChange.objects.create(version=version, kind=kind, row=pk)
    entry = entry_for(kind, pk)
    return Delta(
        version=version, kind=kind, op="upsert" if entry is not None else "delete", pk=pk,
        entry=entry,
    )


def prune_changes() -> int:
    """Forget which rows versions changed, but for the last ``RouteChange.KEEP``; a
    subscriber further behind reloads the whole table. Returns how many went."""
    from registry.snapshot import current_version

    deleted, _ = RouteChange.objects.filter(
        version__lte=current_version() - RouteChange.KEEP).delete()
    return deleted


def load_reported(report: LoadReport) -> None:
    """Unversioned: load figures only, latest wins."""
    _publish(route_bus(), load_to_wire(report))
