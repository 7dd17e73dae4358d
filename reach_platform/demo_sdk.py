"""The demo's agents built with the SDK (``agent_reach``), as an agent team would build them.

The run command starts them beside the platform, once it answers, with the demo tenant's
key; each registers itself, heartbeats on its own thread and leaves when the run stops:

* ``demo-phrasebook``: a translator with language directions (en <-> fr, de);
* ``demo-summarizer``: a summariser whose output has a schema (summary, key points);
* ``demo-assistant``: an OpenAI-compatible chat agent that streams;
* ``demo-reporter``: slow work done asynchronously: it asks which period when none is
  given, reports progress, and finishes later;
* ``demo-vault``: reachable only through its reverse tunnel (it listens on no port);
* ``demo-stockkeeper``: answers stock questions by calling the ``stock-lookup`` tool
  through the gateway (``reach_platform.demo_tools``), whose secret it never sees;
* ``demo-translator`` (``reach_platform.demo_agents``): a legacy HTTP service with a
  business envelope that cannot change, registered and watched by ``reach-sidecar``.

No model and no network: deterministic answers from small built-in tables.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time

import httpx

from agent_reach import Agent
from agent_reach.sidecar import Sidecar, SidecarConfig

logger = logging.getLogger(__name__)

PHRASES = {
    "good morning": {"fr": "bonjour", "de": "guten Morgen"},
    "good night": {"fr": "bonne nuit", "de": "gute Nacht"},
    "thank you": {"fr": "merci", "de": "danke"},
    "see you tomorrow": {"fr": "à demain", "de": "bis morgen"},
}
BACK = {v[lang]: (k, lang) for k, v in PHRASES.items() for lang in v}
# What the README's examples call (demo-chat's chat.general included).
DEMO_CAPABILITIES = ("translate.text", "chat.general", "translate.phrase", "summarize.text",
                     "chat.assistant", "report.build", "vault.lookup", "stock.check")
VAULT = {"INV-1001": {"customer": "ACME Corp", "amount": 1250.0, "status": "paid"},
         "INV-1002": {"customer": "Globex", "amount": 310.5, "status": "due"}}


def phrasebook() -> Agent:
    agent = Agent("demo-phrasebook", description="Demo phrase translator built with the SDK")

    @agent.capability(
        "translate.phrase", description="Translate common phrases between English, French "
        "and German (demo phrasebook)", keywords=["phrase", "phrasebook", "translate"],
        languages=["en", "fr", "de"], direction=["en->fr", "en->de", "fr->en", "de->en"],
        input_schema={"type": "object", "required": ["text", "dest_lang"], "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": 200},
            "dest_lang": {"type": "string", "enum": ["en", "fr", "de"]}}})
    def translate(input, ctx):
        text, dest = input["text"].strip().lower(), input["dest_lang"]
        if dest == "en" and text in BACK:
            return {"translation": BACK[text][0], "source_lang": BACK[text][1]}
        if text in PHRASES and dest in PHRASES[text]:
            return {"translation": PHRASES[text][dest], "source_lang": "en"}
        return {"translation": None, "note": "not in the demo phrasebook",
                "known": sorted(PHRASES)}

    return agent


def summarizer() -> Agent:
    agent = Agent("demo-summarizer", description="Demo summariser built with the SDK")

    @agent.capability(
        "summarize.text", description="Summarise a text into one line and its key points",
        keywords=["summarize", "summary", "总结", "摘要"],
        input_schema={"type": "object", "required": ["text"],
                      "properties": {"text": {"type": "string", "minLength": 1}}},
        output_schema={"type": "object", "required": ["summary", "key_points"],
                       "properties": {"summary": {"type": "string"},
                                      "key_points": {"type": "array",
                                                     "items": {"type": "string"}}}})
    def summarize(input, ctx):
        sentences = [s.strip() for s in re.split(r"(?<=[.!?。！？])\s*", input["text"])
                     if s.strip()]
        return {"summary": sentences[0] if sentences else "",
                "key_points": sentences[:3]}

    return agent


def assistant() -> Agent:
    agent = Agent("demo-assistant", description="Demo chat assistant built with the SDK")

    @agent.chat("chat.assistant", description="A friendly assistant that streams its "
                "answer (demo: it repeats what you said)", keywords=["assistant", "chat"])
    def chat(messages, ctx):
        last = next((str(m.get("content", "")) for m in reversed(messages)
                     if isinstance(m, dict) and m.get("role") == "user"), "")
        for word in f"You said: {last}".split(" "):
            time.sleep(0.01)
            yield word + " "

    return agent


def reporter() -> Agent:
    agent = Agent("demo-reporter", description="Demo report builder: slow, asynchronous")

    @agent.capability("report.build", background=True, timeout_ms=10000,
                      description="Build a sales report for a period (takes a while: "
                      "submit it as an asynchronous task)",
                      keywords=["report", "sales"])
    def build(input, ctx):
        period = input.get("period")
        if not period:
            return ctx.ask("Which period should the report cover? (for example 2026-11)")
        for step in (0.25, 0.5, 0.75):
            time.sleep(0.3)
            ctx.progress(step, f"{int(step * 100)} % done")
        return {"period": period, "total_sales": 12840.5, "orders": 96}

    return agent


def vault() -> Agent:
    agent = Agent("demo-vault", description="Demo internal records: reachable only "
                                            "through its reverse tunnel")

    @agent.capability("vault.lookup", description="Look up an invoice record by id",
                      input_schema={"type": "object", "required": ["id"],
                                    "properties": {"id": {"type": "string"}}})
    def lookup(input, ctx):
        return {"id": input["id"], "record": VAULT.get(input["id"])}

    return agent


def stockkeeper() -> Agent:
    agent = Agent("demo-stockkeeper", description="Demo stock answers, from the inventory "
                                                  "API it calls as a tool through the gateway")

    @agent.capability("stock.check", description="How many of an article are in stock",
                      input_schema={"type": "object", "required": ["sku"],
                                    "properties": {"sku": {"type": "string"}}})
    def check(input, ctx):
        answer = ctx.tool("stock-lookup", {"sku": input["sku"]})
        if not answer["ok"]:
            return {"sku": input["sku"], "known": False}
        return {"sku": input["sku"], "known": True, "in_stock": answer["result"]["in_stock"],
                "via": f"tool stock-lookup, request {answer['request_id']}"}

    return agent


class DemoFleet:
    """The SDK demo agents and the sidecar, started once the platform answers."""

    def __init__(self, base_url: str, key: str, translator, *,
                 announce=lambda line: None, intents_current=lambda: True) -> None:
        self._base = base_url.rstrip("/")
        self._key = key
        self._translator = translator  # the legacy service (demo_agents.DemoAgent)
        self._announce = announce
        # Whether this process's intent index has caught up with its route table: the
        # README's intent example works from then on (not asked by a dry run, which
        # would make the demo key's next explicit call teach the router a phrase).
        self._intents_current = intents_current
        self.running: list = []
        self.sidecar: Sidecar | None = None
        self._thread = threading.Thread(target=self._start, name="demo-fleet", daemon=True)
        self.ready = threading.Event()

    def start(self) -> DemoFleet:
        self._thread.start()
        return self

    def _start(self) -> None:
        for _ in range(600):  # until the platform serves (the run command starts it next)
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self._base}/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        try:
            for build, reach in ((phrasebook, "direct"), (summarizer, "direct"),
                                 (assistant, "direct"), (reporter, "direct"),
                                 (vault, "tunnel"), (stockkeeper, "direct")):
                self.running.append(build().start(platform=self._base, key=self._key,
                                                  reach=reach))
            self.sidecar = Sidecar(SidecarConfig(
                platform=self._base, key=self._key, service=self._translator.base_url,
                agent=self._translator.descriptor, health="/healthz",
                probe_interval_s=2.0)).start()
            _demo_prices()
            self._wait_routable()
        except Exception:
            logger.exception("the demo agents did not start")
        finally:
            self.ready.set()

    def _wait_routable(self) -> None:
        """Announce the demo once the gateway routes to every demo capability, by id and
        by intent: the README's examples may be run from that line on."""
        pending = set(DEMO_CAPABILITIES)
        deadline = time.monotonic() + 60
        with httpx.Client(base_url=self._base, timeout=2,
                          headers={"Authorization": f"Bearer {self._key}"}) as http:
            while time.monotonic() < deadline:
                for capability in sorted(pending):
                    with contextlib.suppress(httpx.HTTPError):
                        if http.get("/v1/route", params={"capability": capability}
                                    ).status_code == 200:
                            pending.discard(capability)
                if not pending and self._intents_current():
                    break
                time.sleep(0.2)
        if pending:
            self._announce(f"demo NOT ready: no route yet to {', '.join(sorted(pending))}")
        elif not self._intents_current():
            self._announce("demo NOT ready: the intent index has not caught up")
        else:
            self._announce(f"demo ready: {len(DEMO_CAPABILITIES)} demo capabilities "
                           "reachable through the gateway")

    def stop(self) -> None:
        for running in self.running:
            with contextlib.suppress(Exception):
                running.stop()
        if self.sidecar is not None:
            with contextlib.suppress(Exception):
                self.sidecar.stop()


def _demo_prices() -> None:
    from django.db import close_old_connections

    from reach_platform.demo import DEMO_PRICES
    from registry.models import Agent as AgentRow

    try:
        for name, prices in DEMO_PRICES.items():
            for row in AgentRow.objects.filter(name=name):  # saved: the gateways learn it
                for field, value in prices.items():
                    setattr(row, field, value)
                row.save()
    finally:
        close_old_connections()
