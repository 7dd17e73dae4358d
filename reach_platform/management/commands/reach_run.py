from __future__ import annotations

import os

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from reach_platform.demo import demo_agents_register, demo_heartbeat, demo_setup


def claim_own_port(port: int) -> list[int]:
    """Add the port this process serves on to ``settings.OWN_PORTS`` (and to
    ``REACH_OWN_PORTS`` for processes started from here), so no agent can be registered
    at a local address on it: the gateway would call itself. Returns the new list."""
    own = list(settings.OWN_PORTS)
    if port not in own:
        own.append(port)
    settings.OWN_PORTS = own
    os.environ["REACH_OWN_PORTS"] = ",".join(str(p) for p in own)
    return own


class Command(BaseCommand):
    help = "Migrate, prepare the demo tenant, and serve admin, API, docs and gateway with uvicorn."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--no-demo", action="store_true", help="Do not create or refresh the demo tenant."
        )

    def _announce(self, line: str) -> None:
        self.stdout.write(line + "\n")
        self.stdout.flush()

    def handle(self, *args, host: str, port: int, no_demo: bool, **options):
        import uvicorn

        # Before anything reads it: registration checks and the gateway's endpoint policy.
        claim_own_port(port)
        call_command("migrate", interactive=False, verbosity=0)
        base = f"http://{host}:{port}"
        # The console's real test calls go to this process's own gateway.
        local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host  # noqa: S104
        settings.CONSOLE_GATEWAY_URL = settings.CONSOLE_GATEWAY_URL or \
            f"http://{'[' + local + ']' if ':' in local else local}:{port}"
        mode = "production" if settings.DATABASES["default"]["ENGINE"].endswith(
            "postgresql"
        ) else "embedded"
        lines = [
            f"Agent-Reach ({mode} mode) on {base}",
            f"  admin:    {base}/admin/",
            f"  API docs: {base}/api/docs/",
            f"  gateway:  {base}/v1/",
        ]
        jobs = {}
        stop_agents = None
        fleet = None
        if not no_demo:
            from reach_platform.demo_agents import CHAT_AGENT_ID, run_in_thread
            from reach_platform.demo_sdk import DemoFleet

            access = demo_setup()
            agents, stop_agents = run_in_thread(host)
            chat = [a for a in agents if a.name == CHAT_AGENT_ID]
            legacy = next(a for a in agents if a.name != CHAT_AGENT_ID)
            # demo-chat stands for a third-party OpenAI-compatible endpoint: registered by
            # descriptor, kept alive here. Every other demo agent registers itself.
            from reach_platform.demo_tools import demo_tool_register, inventory_start

            inventory = inventory_start(local)
            demo_tool_register(tenant=access.tenant, inventory=inventory)
            instances = demo_agents_register(tenant=access.tenant, agents=chat)
            jobs["demo.heartbeat"] = (10.0, lambda: demo_heartbeat(instances))
            fleet = DemoFleet(base, access.api_key, legacy, announce=self._announce,
                              intents_current=_intents_current).start()
            lines += [
                f"  admin login: {access.admin_username} / {access.admin_password}",
                f"  API key for tenant '{access.tenant.slug}': {access.api_key}",
                "  (both are new on every start; earlier demo keys are revoked)",
                f"  demo agent {chat[0].name} on {chat[0].base_url} (OpenAI-compatible)",
                f"  demo agent {legacy.name} on {legacy.base_url} (behind reach-sidecar)",
                "  demo agents built with the SDK: demo-phrasebook, demo-summarizer, "
                "demo-assistant, demo-reporter, demo-vault (tunnel only), demo-stockkeeper",
                f"  demo tool stock-lookup: an inventory API on {inventory.url} whose key "
                "only the gateway holds",
            ]
        self.stdout.write("\n".join(lines) + "\n")
        self.stdout.flush()
        from reach_platform.scheduler import (
            InProcessScheduler,
            learning_jobs,
            metering_jobs,
            registry_jobs,
            task_jobs,
        )

        if not settings.REDIS_URL:
            # Embedded mode: lease sweeps, probes and metering run here; in production
            # Celery beat runs the same jobs (reach_platform.celery).
            if not settings.SERVE_GATEWAY:
                raise CommandError("The embedded run serves the gateway and the control "
                                   "plane in one process: unset REACH_SERVE_GATEWAY.")
            from reach_platform.asgi import gateway_application

            jobs |= registry_jobs() | metering_jobs(gateway_application.usage) | task_jobs()
            jobs |= learning_jobs(gateway_application.route_feedback.queue)
        else:
            # Production's jobs run in Celery: without a worker, usage waits in the Redis
            # stream and nothing is swept. Said once, where the operator looks.
            self._announce("  REDIS_URL is set: usage, lease sweeps, probes and learning run "
                           "in Celery; start `celery -A reach_platform worker -B` beside this")
        scheduler = InProcessScheduler(jobs)
        scheduler.start()
        try:
            uvicorn.run(
                "reach_platform.asgi:application", host=host, port=port, log_level="info",
                lifespan="on", proxy_headers=False,
                http="reach_platform.http_protocol:GuardedHttpToolsProtocol",
                # Logging is configured by Django (settings.LOGGING): one format for all.
                log_config=None,
            )
        finally:
            if fleet is not None:
                fleet.stop()
            scheduler.stop()
            if stop_agents is not None:
                stop_agents()


def _intents_current() -> bool:
    """This process's gateway matches intents against its latest route table."""
    from reach_platform.asgi import gateway_application

    return gateway_application is None or gateway_application.router.intents_current()
