"""The intent index kept up to date one change at a time is the index built from scratch."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson

from routing.evaluation import load_requests
from routing.matcher import CapabilityText, IntentIndex
from routing.router import IntentIndexHolder, capability_text, capability_texts
from routing.semantic import BACKGROUND
from routing.table import (
    AgentEntry,
    CapabilityEntry,
    Delta,
    InstanceEntry,
    RouteTable,
    table_from_wire,
    table_to_json,
)

DATA = Path(__file__).parent / "data" / "eval"
CATALOGUE = json.loads((DATA / "catalogue.json").read_text())
# Ids that say nothing (so that equal texts under two ids score the same), fewer than
# the agents (so that agents share them).
IDS = [f"cap.{i:03d}" for i in range(120)]
REQUESTS = [
    *(row["request"] for row in load_requests(DATA / "tuning.jsonl")[::6]),
    "transalte this contract into Japanese",  # misspelt: the speller's vocabulary counts
    "帮我把这段话翻成英文",
    "总结一下这篇文章然后发邮件给老板",
    "summarize this and then email it",
    "fast batch",  # words most agents' descriptions have: many ties
    "fast 实时 translate",
    IDS[0],  # an exact id
    "zxqv plorf",
]


class CountingEmbedder:
    """Deterministic vectors from a text's hash; counts the documents it embeds."""

    dimensions = 8

    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts.extend(texts)
        out = []
        for text in texts:
            digest = hashlib.sha256(text.encode()).digest()[:8]
            norm = math.sqrt(sum(b * b for b in digest)) or 1.0
            out.append([b / norm for b in digest])
        return np.array(out, dtype=np.float32).reshape(len(texts), 8)


def _capability(rng: random.Random, pk: int, capability_id: str | None = None) -> CapabilityEntry:
    # Few distinct texts under many ids: identical scores, and ties at the candidates' cut.
    base = rng.choice(CATALOGUE[:6])
    return CapabilityEntry(
        pk=pk, capability_id=capability_id or rng.choice(IDS),
        display_name=base.get("display_name", ""),
        description=f"{base['description']} {' '.join(rng.sample(('fast', 'batch', '实时'), 2))}",
        keywords=tuple(base.get("tags", ()))[:3], directions=tuple(base.get("directions", ())),
        examples=tuple(base.get("examples", ()))[:2], not_for=tuple(base.get("not_for", ())),
    )


def _agent(rng: random.Random, pk: int, pks, capability_ids=()) -> AgentEntry:
    ids = list(capability_ids) or [None] * rng.choice((1, 1, 2))
    return AgentEntry(
        pk=pk, namespace="default", name=f"agent-{pk}", owner_tenant_pk=1,
        capabilities=tuple(_capability(rng, next(pks), cid) for cid in ids),
        instances=(InstanceEntry(pk=next(pks), agent_pk=pk, endpoint="http://127.0.0.1:9/"),),
    )


def _assert_same(index: IntentIndex, table: RouteTable, **kwargs) -> None:
    fresh = IntentIndex(list(capability_texts(table).values()), **kwargs)
    for text in REQUESTS:
        if "embedder" in kwargs:
            _same_up_to_rounding(index.scores(text), fresh.scores(text), index.threshold)
            continue
        assert index.scores(text) == fresh.scores(text), text
        assert index.match(text) == fresh.match(text), text


def _same_up_to_rounding(got, want, threshold: float) -> None:
    """Vectors sit in other rows of an updated index than of a fresh one, and a float32
    matrix product may round their similarities differently in the last bits."""
    close = 1e-5
    mine, theirs = {s.capability_id: s for s in got}, {s.capability_id: s for s in want}
    for cid in mine.keys() ^ theirs.keys():  # only at the threshold's edge
        assert abs((mine.get(cid) or theirs.get(cid)).score - threshold) < close, cid
    for cid in mine.keys() & theirs.keys():
        a, b = mine[cid], theirs[cid]
        for part in ("score", "lexical", "semantic", "negative"):
            assert abs(getattr(a, part) - getattr(b, part)) < close, (cid, part)


def _step(rng: random.Random, table: RouteTable, pks) -> Delta:
    """A random change: an agent joins, changes its capabilities, changes something
    else, or leaves."""
    version = table.version + 1
    kind = rng.choice(("add", "add", "change", "change", "other", "remove"))
    if kind == "add" or len(table.agents) < 3:
        pk = next(pks)
        return Delta(version, "agent", "upsert", pk, _agent(rng, pk, pks))
    pk = rng.choice(sorted(table.agents))
    agent = table.agents[pk]
    if kind == "remove":
        return Delta(version, "agent", "delete", pk)
    if kind == "other":
        return Delta(version, "agent", "upsert", pk, replace(agent, weight=agent.weight + 1))
    caps = list(agent.capabilities)
    caps[rng.randrange(len(caps))] = _capability(rng, next(pks))
    return Delta(version, "agent", "upsert", pk, replace(agent, capabilities=tuple(caps)))


def test_an_index_updated_change_by_change_is_the_index_built_from_scratch():
    rng = random.Random(20240611)
    pks = itertools.count(1)
    table = RouteTable(version=1).indexed()
    for _ in range(90):
        agent = _agent(rng, next(pks), pks)
        table = table.apply(Delta(table.version + 1, "agent", "upsert", agent.pk, agent))
    # Two agents sharing one capability id; then one of them leaves.
    first, second = (_agent(rng, next(pks), pks, ["shared.cap"]) for _ in range(2))
    holder = IntentIndexHolder()
    holder.update(table)
    _assert_same(holder.index, table)
    for delta in (Delta(table.version + 1, "agent", "upsert", first.pk, first),
                  Delta(table.version + 2, "agent", "upsert", second.pk, second),
                  Delta(table.version + 3, "agent", "delete", first.pk)):
        table = table.apply(delta)
        holder.update(table)
        _assert_same(holder.index, table)
    assert "shared.cap" in capability_texts(table)
    for _ in range(30):
        # One to three changes between two updates: the holder follows the latest table.
        before, touches_texts = holder.index, False
        for _ in range(rng.choice((1, 1, 2, 3))):
            delta = _step(rng, table, pks)
            touches_texts |= delta.op == "delete" or delta.pk not in table.agents or (
                table.agents[delta.pk].capabilities != delta.entry.capabilities)
            table = table.apply(delta)
        holder.update(table)
        _assert_same(holder.index, table)
        if not touches_texts:
            assert holder.index is before


def test_a_change_that_leaves_the_texts_alone_keeps_the_index():
    rng = random.Random(3)
    pks = itertools.count(1)
    agents = [_agent(rng, next(pks), pks) for _ in range(5)]
    table = RouteTable(version=1, agents={a.pk: a for a in agents}).indexed()
    holder = IntentIndexHolder()
    holder.update(table)
    first = holder.index
    moved = replace(agents[2], weight=7, instances=())
    holder.update(table.apply(Delta(2, "agent", "upsert", moved.pk, moved)))
    assert holder.index is first
    # A reload: every entry a new object, every text the same.
    holder.update(table_from_wire(orjson.loads(table_to_json(table))))
    assert holder.index is first


def _units(c: CapabilityText) -> list[str]:
    return c.units() + c.counter_units()


def test_a_change_embeds_only_the_texts_it_changed():
    rng = random.Random(5)
    pks = itertools.count(1)
    embedder = CountingEmbedder()
    table = RouteTable(version=1).indexed()
    for _ in range(20):
        agent = _agent(rng, next(pks), pks)
        table = table.apply(Delta(table.version + 1, "agent", "upsert", agent.pk, agent))
    holder = IntentIndexHolder(embedder=embedder, threshold=0.0)
    holder.update(table)
    # The background sentences once per encoder (``hub_of``), then each text's units.
    assert sorted(t for t in embedder.texts if t in BACKGROUND) == sorted(BACKGROUND)
    assert sorted(t for t in embedder.texts if t not in BACKGROUND) == sorted(
        u for c in capability_texts(table).values() for u in _units(c))
    before = len(embedder.texts)
    newcomer = _agent(rng, next(pks), pks, ["brand.new"])
    table = table.apply(Delta(table.version + 1, "agent", "upsert", newcomer.pk, newcomer))
    holder.update(table)
    (text,) = capability_text(table, "brand.new")
    assert sorted(embedder.texts[before:]) == sorted(_units(text))
    before = len(embedder.texts)
    table = table.apply(Delta(table.version + 1, "agent", "delete", newcomer.pk))
    holder.update(table)
    assert len(embedder.texts) == before
    _assert_same(holder.index, table, embedder=CountingEmbedder(), threshold=0.0)


def test_agents_pool_a_shared_id_in_pk_order_whatever_order_the_table_got_them():
    def entry(pk: int, description: str, keywords: tuple[str, ...]) -> AgentEntry:
        cap = CapabilityEntry(pk=pk * 10, capability_id="x.y", description=description,
                              keywords=keywords)
        return AgentEntry(pk=pk, namespace="default", name=f"a{pk}", owner_tenant_pk=1,
                          capabilities=(cap,))

    low, high = entry(1, "first", ("k1", "k2")), entry(2, "second", ("k2", "k3"))
    forward = RouteTable(agents={1: low, 2: high}).indexed()
    backward = RouteTable(agents={2: high, 1: low}).indexed()
    want = CapabilityText("x.y", "", "first second", ("k1", "k2", "k3"), False)
    assert capability_texts(forward) == capability_texts(backward) == {"x.y": want}


def test_an_index_built_in_another_order_answers_the_same():
    texts = list(capability_texts(_big_table()).values())
    forward, backward = IntentIndex(texts), IntentIndex(texts[::-1])
    for text in REQUESTS:
        assert forward.scores(text) == backward.scores(text), text


def _big_table() -> RouteTable:
    rng = random.Random(11)
    pks = itertools.count(1)
    agents = [_agent(rng, next(pks), pks) for _ in range(120)]
    return RouteTable(version=1, agents={a.pk: a for a in agents}).indexed()


def test_words_and_keywords_leave_with_the_last_text_that_had_them():
    kept = CapabilityText("doc.translation", "", "Translation of documents", ("翻译",))
    gone = CapabilityText("doc.translate", "", "We translate documents", ("译文", "translate"))
    # The newcomer takes the slot the gone text left: nothing of the old text may stay.
    newcomer = CapabilityText("doc.ocr", "", "Reads scanned documents", ("扫描",))
    index = IntentIndex([gone, kept]).updated([newcomer], removed=[gone.capability_id])
    fresh = IntentIndex([kept, newcomer])
    for text in ("transalte this document", "这是译文", "translate it", "扫描文件",
                 gone.capability_id, newcomer.capability_id):
        assert index.scores(text) == fresh.scores(text), text
    assert index.updated([kept, newcomer]) is index
    assert index.updated(removed=["not.there"]) is index


def test_the_rarest_feature_left_sets_what_an_unknown_word_costs():
    # "a" and "i" are stopwords: the two twins share every feature, the loner has its own.
    twins = [CapabilityText(cid, "", "summarise long reports") for cid in ("a", "i")]
    loner = CapabilityText("x", "", "track parcels")
    index = IntentIndex([*twins, loner]).updated(removed=["x"])
    fresh = IntentIndex(twins)
    for text in ("summarise this zxqv report", "summarise reports"):
        assert index.scores(text) == fresh.scores(text), text


def test_a_large_first_index_is_built_off_the_start_and_intent_calls_wait_for_it():
    """A gateway of a large fleet serves calls that name their capability at once; an
    intent call until the index exists is a retryable 503, not a wrong 'no match'."""
    import threading

    from routing.router import SYNC_FIRST_BUILD_MAX, Router, RouteRequest
    from tests.routing.tables import agent as fleet_agent
    from tests.routing.tables import table as fleet_table
    from tests.support.waiting import wait_for

    agents = [fleet_agent(f"a{n}", f"fleet.cap{n}",
                          cap={"description": f"answers fleet question number {n}"})
              for n in range(SYNC_FIRST_BUILD_MAX + 1)]
    agents.append(fleet_agent("xl", "translate.text",
                              cap={"description": "translate text between languages"}))
    big = fleet_table(*agents)

    class Subscriber:
        table = big

        def on_change(self, listener):
            pass

    holder = IntentIndexHolder()
    release, building = threading.Event(), threading.Event()
    update = holder.update

    def held_update(table, changed=None):
        building.set()
        release.wait(10)
        update(table, changed)

    holder.update = held_update
    holder.follow(Subscriber())
    router = Router(index=holder)
    assert building.wait(10)
    by_intent = RouteRequest(tenant_pk=1, intent="please translate this text")
    assert router.route(big, by_intent).error == "service_unavailable"
    named = router.route(big, RouteRequest(tenant_pk=1, capability="fleet.cap7"))
    assert named.chosen is not None
    release.set()
    wait_for(lambda: holder.index is not None, message="the first index")
    assert router.route(big, by_intent).capability == "translate.text"


def test_the_router_says_when_its_intent_index_lags_the_route_table():
    """A newly registered agent is found by id at once and by intent once the index has
    caught up: ``intents_current`` tells which (the demo announces itself on it)."""
    import threading

    from routing.router import Router, RouteRequest
    from tests.routing.tables import agent as fleet_agent
    from tests.routing.tables import table as fleet_table
    from tests.support.waiting import wait_for

    first = fleet_table(fleet_agent("a", "translate.text",
                                    cap={"description": "translate text between languages"}))
    listeners = []

    class Subscriber:
        table = first

        def on_change(self, listener):
            listeners.append(listener)

    holder = IntentIndexHolder()
    holder.follow(Subscriber())  # small: built at once
    router = Router(index=holder)
    assert router.intents_current()
    release = threading.Event()
    update = holder.update

    def held_update(table, changed=None):
        release.wait(10)
        update(table, changed)

    holder.update = held_update
    second = fleet_table(
        fleet_agent("a", "translate.text", cap={"description": "translate text between languages"}),
        fleet_agent("b", "summarize.text", cap={"description": "summarize long documents"}))
    (listener,) = listeners
    listener(second)
    assert not router.intents_current()
    wish = RouteRequest(tenant_pk=1, intent="summarize this long document")
    assert router.route(second, wish).capability != "summarize.text"
    release.set()
    wait_for(router.intents_current, message="the index to catch up")
    assert router.route(second, wish).capability == "summarize.text"
    assert Router().intents_current()  # no intent index: nothing to wait for
