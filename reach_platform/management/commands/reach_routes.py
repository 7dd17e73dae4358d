from __future__ import annotations

import sys
import time

import orjson
from django.core.management.base import BaseCommand

from reach_platform.routes_runtime import start_route_subscriber


class Command(BaseCommand):
    help = (
        "Follow the route table as a gateway does, printing one JSON line per change: "
        "version, counts and each instance's endpoint and state. For ops and benchmarks."
    )

    def add_arguments(self, parser):
        parser.add_argument("--snapshot", help="Snapshot file (default: <data dir>/routes.json)")
        parser.add_argument("--seconds", type=float, default=0,
                            help="Stop after this long (0: run until interrupted).")

    def handle(self, *args, snapshot=None, seconds=0.0, **options):
        from pathlib import Path

        runtime = start_route_subscriber(Path(snapshot) if snapshot else None)
        subscriber = runtime.subscriber

        def report(table, event="change"):
            line = {
                "event": event,
                "t_ns": time.monotonic_ns(),
                "version": table.version,
                "stale": subscriber.stale,
                "reloads": subscriber.reloads,
                "failures": subscriber.failures,
                "agents": len(table.agents),
                "instances": {
                    inst.endpoint: inst.state
                    for agent in table.agents.values() for inst in agent.instances
                },
            }
            sys.stdout.buffer.write(orjson.dumps(line) + b"\n")
            sys.stdout.flush()

        report(subscriber.table, "start")
        subscriber.on_change(report)
        deadline = time.monotonic() + seconds if seconds else None
        failures = subscriber.failures
        try:
            while deadline is None or time.monotonic() < deadline:
                time.sleep(0.2)
                if subscriber.failures != failures:
                    failures = subscriber.failures
                    report(subscriber.table, "reload_failed")
        except KeyboardInterrupt:
            pass
        finally:
            runtime.stop()
