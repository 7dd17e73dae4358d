"""Intent matching: the labelled set, each score component, plans and covered requests."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from routing.evaluation import evaluate, load_catalogue, load_requests
from routing.matcher import CapabilityText, IntentIndex
from routing.router import IntentIndexHolder, Router, RouteRequest
from routing.text import clauses
from tests.routing.tables import agent, table

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def index() -> IntentIndex:
    return IntentIndex(load_catalogue(DATA / "catalogue.json"))


def test_the_labelled_set_is_big_enough_and_consistent():
    catalogue = {c.capability_id for c in load_catalogue(DATA / "catalogue.json")}
    requests = load_requests(DATA / "requests.jsonl")
    assert len(catalogue) >= 30 and len(requests) >= 150
    for row in requests:
        for wanted in row.get("expected_plan", [row.get("expected")]):
            assert wanted in catalogue, row
    tags = {t for row in requests for t in row["tags"]}
    assert {"zh", "en", "mixed", "slang", "typo", "multi", "covered"} <= tags


def test_lexical_hit_rate_on_the_labelled_set_is_at_least_95_percent(index):
    result = evaluate(index, load_requests(DATA / "requests.jsonl"))
    confusions = "\n".join(f"  want {w}, got {g}: {r}" for r, w, g in result.confusions)
    assert result.hit_rate >= 0.95, f"hit rate {result.hit_rate:.3f}\n{confusions}"


def test_an_exact_capability_id_scores_one(index):
    best = index.match("translate.text").best
    assert (best.capability_id, best.score, best.exact) == ("translate.text", 1.0, 1.0)


def test_lexical_matches_contribute_at_most_half(index):
    for text in ("translate this into French", "把这段话翻译成英文", "天气怎么样"):
        best = index.match(text).best
        assert 0 < best.score <= 0.5
        assert best.score == pytest.approx(0.5 * best.lexical, abs=1e-6)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("please translate this into Japanese, formal", "translate.text"),
        ("帮我查一下快递到哪了", "logistics.track"),
        ("transalte this paragraph to german", "translate.text"),  # a typo
        ("明天北京下雨吗", "weather.query"),
        ("NVDA share price right now?", "stock.quote"),
    ],
)
def test_chinese_english_and_typos(index, text, expected):
    assert index.match(text).best.capability_id == expected


def test_the_threshold_is_configurable():
    docs = load_catalogue(DATA / "catalogue.json")
    assert IntentIndex(docs).match("帮我查一下快递到哪了").best is not None
    assert IntentIndex(docs, threshold=0.99).match("帮我查一下快递到哪了").best is None
    assert IntentIndex(docs).match("zxqv plorf").best is None


def test_multi_intent_gives_an_ordered_plan(index):
    match = index.match("先把这篇英文报告总结成要点，然后发邮件给老板")
    assert match.plan == ("summarize.text", "email.draft")
    assert match.clauses == ("先把这篇英文报告总结成要点", "发邮件给老板")


def test_a_single_capability_covering_both_parts_wins_over_a_plan(index):
    match = index.match("帮我把这段英文整理成要点并翻译成中文")
    assert match.plan == () and match.covered
    assert match.best.capability_id == "summarize.translate"


def test_clauses_split_on_sequencing_words_not_inside_words():
    assert clauses("summarize this, then email it to Tom") == ["summarize this",
                                                               "email it to Tom"]
    assert clauses("合并两个表格") == ["合并两个表格"]
    assert clauses("帮忙看下这个 diff 的并发问题") == ["帮忙看下这个 diff 的并发问题"]


class WordOverlapEmbedder:
    """A real (if simple) embedder for the plumbing test: normalised bag-of-letters."""

    def embed(self, texts):
        out = []
        for text in texts:
            counts = [text.lower().count(ch) for ch in "abcdefghijklmnopqrstuvwxyz"]
            norm = math.sqrt(sum(c * c for c in counts)) or 1.0
            out.append([c / norm for c in counts])
        return out


def test_a_pluggable_embedder_adds_up_to_a_fifth():
    docs = [CapabilityText("a.one", "alpha", "aaaa aaaa"), CapabilityText("b.two", "beta", "bbbb")]
    semantic = IntentIndex(docs, embedder=WordOverlapEmbedder(), threshold=0.0)
    scores = {s.capability_id: s for s in semantic.scores("aaab")}
    assert 0 < scores["a.one"].semantic <= 1
    assert scores["a.one"].score == pytest.approx(
        0.5 * scores["a.one"].lexical + 0.2 * scores["a.one"].semantic, abs=1e-6)
    assert scores["a.one"].semantic > scores["b.two"].semantic


def test_the_router_routes_an_intent_and_reports_a_plan():
    summarizer = agent("summarizer", "summarize.text",
                       cap={"display_name": "Summaries", "keywords": ("summarize", "总结")})
    mailer = agent("mailer", "email.draft", cap={"keywords": ("email", "邮件")})
    holder = IntentIndexHolder()
    t = table(summarizer, mailer)
    holder.update(t)
    router = Router(index=holder)
    single = router.route(t, RouteRequest(tenant_pk=1, intent="帮我总结一下这篇文章"))
    assert single.capability == "summarize.text" and single.chosen.agent.name == "summarizer"
    plan = router.route(t, RouteRequest(tenant_pk=1, intent="summarize this and then email it"))
    assert plan.plan == ("summarize.text", "email.draft")
    assert plan.chosen.agent.name == "summarizer"
    none = router.route(t, RouteRequest(tenant_pk=1, intent="what's the weather"))
    assert none.error == "no_capability" and none.chosen is None


def test_the_index_is_rebuilt_only_when_capability_texts_change():
    from dataclasses import replace

    a = agent("a", "x.y", cap={"description": "first"})
    holder = IntentIndexHolder()
    holder.update(table(a))
    first = holder.index
    moved = replace(a, instances=(replace(a.instances[0], state="unknown"),))
    holder.update(table(moved))
    assert holder.index is first
    holder.update(table(agent("a", "x.y", cap={"description": "second"})))
    assert holder.index is not first


def test_the_embedder_setting_is_checked():
    from routing.embedders import configured_embedder

    assert configured_embedder("lexical") is None
    with pytest.raises(ValueError, match="unknown intent embedder"):
        configured_embedder("gpt-9")
