"""Intent matching: the evaluation sets, cross-lingual meaning, hints, confidence, plans.

The figures on the sealed set are printed by ``bench/routing.py``; here the sets are
checked for shape, the development set keeps a floor (a regression guard: nothing
was tuned on it), and each promise of the matcher is tried on small catalogues built
to break it, with the real sentence encoder.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from routing.embedders import configured_embedder
from routing.evaluation import evaluate, fitted_calibration, load_catalogue, load_requests
from routing.matcher import CALIBRATION, CapabilityText, IntentIndex, Match, Score
from routing.router import IntentIndexHolder, Router, RouteRequest
from routing.text import clauses, features
from tests.routing.tables import agent, table

EVAL = Path(__file__).parent / "data" / "eval"


@pytest.fixture(scope="module")
def encoder():
    return configured_embedder("multilingual")


@pytest.fixture(scope="module")
def index(encoder) -> IntentIndex:
    return IntentIndex(load_catalogue(EVAL / "catalogue.json"), embedder=encoder)


@dataclass(frozen=True)
class Learned:
    capability_id: str
    phrase: str


# ---- the evaluation sets --------------------------------------------------------------


@pytest.mark.parametrize("name", ["tuning", "dev", "sealed"])
def test_each_set_is_labelled_against_the_catalogue(name):
    catalogue = {c["capability_id"]: c for c in json.loads((EVAL / "catalogue.json").read_text())}
    rows = load_requests(EVAL / f"{name}.jsonl")
    for row in rows:
        assert row["lang"] in ("zh", "en", "mixed") and row["request"].strip(), row
        steps = row.get("expected_plan") or ([row["expected"]] if row["expected"] else [])
        assert all(step in catalogue for step in steps), row
        assert (row["kind"] == "out_of_scope") == (not steps), row
        assert (row["kind"] == "multi_step") == (len(steps) > 1), row
    assert len({row["request"] for row in rows}) == len(rows)


def test_the_catalogue_and_the_sealed_set_are_what_the_protocol_asks():
    catalogue = json.loads((EVAL / "catalogue.json").read_text())
    assert len(catalogue) >= 40
    assert Counter(c["lang"] for c in catalogue)["zh"] >= 15
    assert Counter(c["lang"] for c in catalogue)["en"] >= 15
    sealed = load_requests(EVAL / "sealed.jsonl")
    kinds, langs = Counter(r["kind"] for r in sealed), Counter(r["lang"] for r in sealed)
    assert len(sealed) >= 400 and kinds["multi_step"] >= 30 and kinds["out_of_scope"] >= 20
    assert {"plain", "colloquial", "typo", "params", "indirect"} <= set(kinds)
    share = {k: v / len(sealed) for k, v in langs.items()}
    assert 0.40 <= share["zh"] <= 0.50 and 0.30 <= share["en"] <= 0.40
    assert 0.15 <= share["mixed"] <= 0.25
    # The sets are apart: nothing of the sealed set was tuned on.
    tuned = {r["request"] for name in ("tuning", "dev")
             for r in load_requests(EVAL / f"{name}.jsonl")}
    assert not tuned & {r["request"] for r in sealed}


def test_the_development_set_keeps_its_floor(index):
    """A regression guard on data nothing was chosen on (figures: bench/routing.py)."""
    report = evaluate(index, load_requests(EVAL / "dev.jsonl"))
    assert report.top1.rate >= 0.74, report.top1
    assert report.wrongly_refused.rate <= 0.03, report.wrongly_refused
    assert report.plans.rate >= 0.6, report.plans
    # Confidence is the chance of being right, fitted on the tuning set: on this set
    # (0.95 stated against 0.78 right before, calibration error 0.165) it says how often.
    stated = sum(c for c, _ in report.sureness) / len(report.sureness)
    right = sum(r for _, r in report.sureness) / len(report.sureness)
    assert abs(stated - right) < 0.05 and report.calibration_error() < 0.08, (stated, right)


def test_a_catalogue_described_without_examples_refuses_few_answerable_requests(encoder):
    """The issue's independent evaluation registers capabilities from their descriptions
    only. With the catalogue's examples removed, the bar chosen with them refused 25 % of
    the development set's answerable requests (top-1 0.544); it is now lowered by how far
    the catalogue's texts sit from everyday requests (3.7 %, top-1 0.644)."""
    bare = [replace(c, examples=()) for c in load_catalogue(EVAL / "catalogue.json")]
    report = evaluate(IntentIndex(bare, embedder=encoder), load_requests(EVAL / "dev.jsonl"))
    assert report.wrongly_refused.rate <= 0.05, report.wrongly_refused
    assert report.top1.rate >= 0.62, report.top1
    assert report.refusals.rate >= 0.45, report.refusals


def test_the_calibration_is_what_the_tuning_set_gives(encoder):
    """``CALIBRATION`` is fitted, not chosen: refitting on the tuning set gives it back."""
    tuning = load_requests(EVAL / "tuning.jsonl")
    for name, embedder in (("semantic", encoder), ("lexical", None)):
        index = IntentIndex(load_catalogue(EVAL / "catalogue.json"), embedder=embedder)
        assert fitted_calibration(index, tuning) == pytest.approx(CALIBRATION[name], abs=2e-3)


# ---- cross-lingual meaning ------------------------------------------------------------


CROSS = [
    CapabilityText("slides.generate", "演示文稿生成",
                   "根据提纲或文档自动生成 PPT 演示文稿，支持公司模板和图表。"),
    CapabilityText("hr.resume_screening", "Résumé screening",
                   "Scores candidate CVs against a job description and shortlists the best."),
    CapabilityText("weather.forecast", "天气预报", "查询城市未来七天的天气、气温和降雨概率。"),
    CapabilityText("expense.claim", "Expense claims",
                   "Files an expense claim with receipts for reimbursement approval."),
]


@pytest.mark.parametrize(("request_text", "expected"), [
    ("Build a presentation from my project outline for Monday", "slides.generate"),  # en -> zh
    ("帮我从这批简历里挑出最合适的三个候选人", "hr.resume_screening"),  # zh -> en
    ("will it rain in Hangzhou this weekend?", "weather.forecast"),
    ("出差的打车票怎么报销", "expense.claim"),
])
def test_a_request_reaches_a_capability_described_only_in_the_other_language(
        encoder, request_text, expected):
    match = IntentIndex(CROSS, embedder=encoder).match(request_text)
    assert match.best is not None and match.best.capability_id == expected, match.ranked
    assert match.best.semantic > 0  # the encoder sees the meaning across languages


def test_an_unrelated_request_is_refused_whatever_its_language(encoder):
    index = IntentIndex(CROSS, embedder=encoder)
    for text in ("给我朋友转账五百块", "transfer 500 dollars to my friend", "你今天心情怎么样"):
        match = index.match(text)
        assert match.best is None, (text, match.ranked)
        assert match.suggestions and match.confidence == 0.0



FILLER = ("the", "a", "的", "ok", "嗯", "???", "然后", "and then", "help me", "帮我", "test",
          "好的", "👍", "12345", "hi there", "帮我弄一下", "搞一下")


@pytest.mark.parametrize("embedded", [True, False])
def test_a_request_that_says_nothing_is_refused_however_close_it_scores(encoder, embedded):
    """Break test (helper-43): "the", "ok", "嗯", "然后" went to a localisation agent at
    0.55-0.78 confidence, and to a capability described as "x" at up to 0.98: their
    meaning-score against a short description clears the threshold whatever they mean.
    Filler is no request; what does say something still routes, and an exact id too."""
    catalogue = [CapabilityText("app.localize", "App localisation",
                                "Localizes app UI strings and release notes for target "
                                "markets (i18n files: .po, .xliff, .strings)"),
                 CapabilityText("util.any", "", "x"), *OTHERS]
    index = IntentIndex(catalogue, embedder=encoder if embedded else None)
    for text in FILLER:
        match = index.match(text)
        assert match.best is None and match.confidence == 0.0, (text, match.ranked)
    assert index.match("localize our app strings for the Japanese market").best \
        .capability_id == "app.localize"
    assert index.match("util.any").best.capability_id == "util.any"
    assert index.match("明天杭州天气怎么样").best.capability_id == "weather.forecast"
    # A description that says nothing draws nothing: "x" took "go", "run", "查一下"
    # (and, public, another tenant's calls and their input).
    for text in ("go", "run", "查一下", "do it now", "run the thing"):
        match = index.match(text)
        assert all(s.capability_id != "util.any" for s in match.ranked), (text, match.ranked)


@pytest.mark.parametrize("embedded", [True, False])
def test_a_generic_action_alone_is_refused_not_guessed(encoder, embedded):
    """Re-test (helper-45): capabilities described "TBD", or "x" under a display name that
    is only their id, drew "run", "check", "执行" at 0.5-0.8. A generic action says to
    act, not on what: alone it is refused; with an object it routes."""
    catalogue = [CapabilityText("misc.tbd", "", "TBD"),
                 CapabilityText("misc.x", "misc.x", "x"), *OTHERS]
    index = IntentIndex(catalogue, embedder=encoder if embedded else None)
    for text in ("run", "check", "go", "execute", "continue", "Run it!", "check this",
                 "执行", "查一下", "处理一下", "继续", "帮我看看",
                 # helper-46: each taught a capability as feedback.
                 "go ahead", "whatever", "another one", "随便", "帮忙看一下", "Ж"):
        match = index.match(text)
        assert match.best is None and match.confidence == 0.0, (text, match.ranked)
    assert index.match("查一下明天杭州的天气").best.capability_id == "weather.forecast"
    assert index.match("misc.tbd").best.capability_id == "misc.tbd"


@pytest.mark.parametrize("embedded", [True, False])
def test_a_learned_phrase_that_says_nothing_steers_nothing(encoder, embedded):
    """Break test (helper-43): one feedback "帮我" -> refund.apply sent "help me" there at
    0.99 and pulled "我的快递到哪了" into a tie with refund.apply."""
    catalogue = [CapabilityText("refund.apply", "退款申请", "为已付款订单提交退款申请。"),
                 CapabilityText("logistics.track", "物流查询",
                                "查询包裹的物流轨迹和预计送达时间。")]
    index = IntentIndex(catalogue, embedder=encoder if embedded else None)
    learned = [Learned("refund.apply", "帮我"), Learned("refund.apply", "help me")]
    for text in ("帮我", "help me"):
        assert index.match(text, learned=learned).best is None, text
    plain = index.match("我的快递到哪了")
    taught = index.match("我的快递到哪了", learned=learned)
    assert taught.best.capability_id == plain.best.capability_id == "logistics.track"
    assert (taught.confidence, taught.margin) == (plain.confidence, plain.margin)

# ---- what agent teams tell the router -------------------------------------------------


ORDERS = CapabilityText(
    "order.status", "Order status",
    "Looks up an order by number: items, payment state and whether it has shipped. "
    "For parcel tracking use the logistics service.")
OTHERS = [CapabilityText("weather.forecast", "天气预报", "查询城市未来七天的天气。"),
          CapabilityText("email.draft", "邮件起草", "根据要点起草商务邮件。")]


def test_a_negative_hint_keeps_a_request_away(encoder):
    text = "where is my parcel right now? track the delivery"
    vague = CapabilityText(**{**ORDERS.__dict__, "description": (
        "Looks up an order by number: items, payment state, whether it has shipped and "
        "where its parcel is now.")})
    plain = IntentIndex([vague, *OTHERS], embedder=encoder).match(text)
    assert plain.best is not None and plain.best.capability_id == "order.status"
    hinted = CapabilityText(**{**vague.__dict__,
                               "not_for": ("parcel and delivery tracking (use logistics.track)",)})
    match = IntentIndex([hinted, *OTHERS], embedder=encoder).match(text)
    assert match.best is None or match.best.capability_id != "order.status", match.ranked
    pushed = [s for s in (*match.ranked, *match.suggestions) if s.capability_id == "order.status"]
    assert pushed and pushed[0].negative > 0
    # What the capability is for still reaches it.
    assert IntentIndex([hinted, *OTHERS], embedder=encoder).match(
        "what did I buy in order 88123 and is it paid?").best.capability_id == "order.status"


def test_examples_are_matched(encoder):
    bare = CapabilityText("kb.faq", "Knowledge base", "Answers questions from the company wiki.")
    taught = CapabilityText(**{**bare.__dict__,
                               "examples": ("how many days of annual leave do I get",)})
    text = "我一年有几天年假？"
    others = [*OTHERS, CapabilityText("hr.leave", "Leave requests", "Files a leave request.")]
    with_examples = IntentIndex([taught, *others], embedder=encoder).scores(text)
    without = IntentIndex([bare, *others], embedder=encoder).scores(text)
    score = {s.capability_id: s.score for s in with_examples}["kb.faq"]
    assert score > {s.capability_id: s.score for s in without}.get("kb.faq", -1)


# ---- confidence, refusal, confirmation ------------------------------------------------


def test_every_decision_carries_confidence_and_margin(index):
    match = index.match("把这段话翻译成日语")
    assert match.best.capability_id == "translate.text"
    assert 0.5 < match.confidence < 1 and match.margin > 0
    # The lead over the runner-up; alone above the threshold, over nothing (0).
    runner_up = match.ranked[1].score if len(match.ranked) > 1 else 0.0
    assert match.margin == pytest.approx(match.ranked[0].score - runner_up, abs=1e-3)
    weaker = index.match("帮我弄一下这个文件")
    assert weaker.confidence < match.confidence


def test_two_capabilities_that_nearly_tie_ask_for_confirmation(encoder):
    twin = "Translates documents between languages."
    twins = [CapabilityText("translate.a", "Translation", twin),
             CapabilityText("translate.b", "Translation", twin), *OTHERS]
    match = IntentIndex(twins, embedder=encoder).match("translate this contract into German")
    assert match.ambiguous and match.margin < 0.03
    assert {s.capability_id for s in match.ranked[:2]} == {"translate.a", "translate.b"}
    assert not IntentIndex(twins, embedder=encoder).match("translate.a").ambiguous  # an exact id


def test_an_exact_capability_id_scores_one(index):
    best = index.match("translate.text").best
    assert (best.capability_id, best.score, best.exact) == ("translate.text", 1.0, 1.0)


# ---- plans ----------------------------------------------------------------------------


CHECK_THEN_REFUND = ("order.status", "refund.request")


@pytest.mark.parametrize(("text", "plan"), [
    ("先帮我起草一封给客户的道歉邮件，然后发给 li@acme.com", ("email.draft", "email.send")),
    ("Summarize this 40-page report, then make slides of it", ("doc.summarize", "slides.generate")),
    ("把这段采访录音转成文字，然后翻译成英文", ("speech.transcribe", "translate.text")),
    ("查一下上个月各区域的销售额，接着做成柱状图", ("data.text_to_sql", "data.chart")),
    # A step naming its action but not its object (helper-43: "发给 Tom" was dropped,
    # and draft-then-send became one step).
    ("帮我起草一封邮件然后发给 Tom", ("email.draft", "email.send")),
    ("把这份报告摘要一下，再发给 Tom", ("doc.summarize", "email.send")),
    # Two parts whose best is one capability: the part with a near second takes it, the
    # earlier part too (the first part, in Chinese, matched translation best).
    ("把这份中文稿子先润色一下，然后翻成英文", ("text.polish", "translate.text")),
    ("Check where order 55102 is at; if it never shipped I want my money back",
     CHECK_THEN_REFUND),
    # The step said to come first runs first (helper-46: the refund was step one, and a
    # call runs step one).
    ("退款之前先查一下订单状态", CHECK_THEN_REFUND),
    ("如果要退款的话，先查一下订单状态", CHECK_THEN_REFUND),
    ("Before refunding it, check the order status", CHECK_THEN_REFUND),
    # Its re-test (helper-47): "然后退款" was glued to the part before it, and the
    # variants of "first" and "before" ran the refund first.
    ("先查询订单状态，然后退款", CHECK_THEN_REFUND),
    ("帮我退款，不过先查一下订单状态", CHECK_THEN_REFUND),
    ("refund the order, but first check the order status", CHECK_THEN_REFUND),
    ("退款前先查订单", CHECK_THEN_REFUND),
    # helper-48: "after" and "once" put the refund alone.
    ("Refund the customer after you check the order status",
     CHECK_THEN_REFUND),
    ("Refund once you've checked the order status", CHECK_THEN_REFUND),
    ("Send the email to Tom after you translate it", ("translate.text", "email.send")),
])
def test_a_multi_step_request_becomes_a_plan_with_a_confidence_per_step(index, text, plan):
    match = index.match(text)
    assert match.plan == plan, (match.clauses, match.plan, match.ranked[:3])
    assert len(match.step_confidence) == len(plan)
    assert all(0 < c < 1 for c in match.step_confidence)


@pytest.mark.parametrize("text", [
    "order me a pizza, then remind me at 6 to pick it up", "帮我订一份外卖，然后提醒我六点去拿"])
def test_what_is_asked_for_first_that_nothing_does_is_refused_not_skipped(index, text):
    """Re-test (helper-47): "book a meeting with Alice, then remind me an hour before",
    the meeting matching nothing, set the reminder. The later steps may depend on the
    first: run alone they do half a job. Refused, with the closest as suggestions."""
    match = index.match(text)
    assert match.best is None and not match.plan, (match.ranked, match.plan)
    assert [s.capability_id for s in match.suggestions][:1] == ["reminder.set"]


@pytest.mark.parametrize(("text", "expected"), [
    ("我刚开完会，然后帮我把会议录音整理成纪要", None),
    # Politeness first (helper-48: each was refused whole).
    ("麻烦你了，另外帮我查一下订单状态", "order.status"),
    ("Please help me, then track my parcel", "logistics.track"),
    ("帮我个忙，查一下快递到哪了", "logistics.track"),
])
def test_a_first_part_that_only_tells_is_no_step_to_refuse_for(index, text, expected):
    """"我刚开完会" (I just came out of a meeting) asks for nothing to be done, nor does
    "麻烦你了" (sorry to trouble you): the request is what follows."""
    match = index.match(text)
    assert match.best is not None, match.suggestions
    assert expected is None or match.best.capability_id == expected, match.ranked


@pytest.mark.parametrize("text", ["查一下订单状态，先别退款", "先别退款，查一下订单状态",
                                  "Check the order status; do not refund it",
                                  "Check the order status but don't refund yet",
                                  "Don't refund yet, just check the order status"])
def test_a_part_that_says_not_to_do_something_is_no_step(index, text):
    """helper-48: "先别退款" (don't refund yet) moved the refund first, and it ran."""
    match = index.match(text)
    assert match.best.capability_id == "order.status" and not match.plan, match.ranked


def test_a_titled_work_does_not_choose_the_capability(index):
    """helper-48: "帮我总结一下《退款政策》" (summarise "Refund policy") went to refunds."""
    assert index.match("帮我总结一下《退款政策》").best.capability_id == "doc.summarize"


def test_a_request_in_capitals_routes_as_in_lower_case(index):
    """Re-test (helper-47): "TRACK MY PARCEL" was refused while "track my parcel" routed
    at 0.96: the sentence encoder reads capitals as other words."""
    for text in ("WHERE IS MY PARCEL SF1234567", "TRACK MY PARCEL"):
        shouted, plain = index.match(text), index.match(text.lower())
        assert shouted.best is not None, (text, shouted.suggestions)
        assert shouted.best.capability_id == plain.best.capability_id == "logistics.track"
        assert shouted.confidence == plain.confidence


def test_quoted_material_does_not_choose_the_capability(index):
    """Re-test (helper-47): the words of a passage to translate chose the refund agent."""
    for text in ('translate this into English: "first refund the order, then check its '
                 'status"', "把这句话翻译成英文：“先退款，然后查订单状态”"):
        match = index.match(text)
        assert match.best.capability_id == "translate.text" and not match.plan, match.ranked


def test_parts_that_want_one_capability_beside_a_part_that_matches_nothing():
    """The joint choice of steps, with a part that matched nothing among parts that
    want the same capability (the sealed run's first try of it raised IndexError)."""
    from routing.matcher import _distinct_steps

    def score(capability_id: str, value: float) -> Score:
        return Score(capability_id, value, 0.0, 0.0, value, 0.0, 0.0)

    steps = _distinct_steps([[score("it.ticket", 0.5), score("password", 0.45)], [],
                             [score("it.ticket", 0.6)]])
    assert [s.capability_id if s else None for s in steps] == ["password", None, "it.ticket"]
    steps = _distinct_steps([[], [score("a", 0.5)], [score("a", 0.4)]])
    assert [s.capability_id if s else None for s in steps] == [None, "a", None]


def test_any_chain_of_requests_is_matched_without_error(index):
    """Requests of the tuning and development sets chained by connectives, so that parts
    match nothing, one thing, or what another part wants: every one gets an answer (the
    crash above came from such a request)."""
    import random

    texts = [row["request"] for name in ("tuning", "dev")
             for row in load_requests(EVAL / f"{name}.jsonl")]
    rng = random.Random(15)
    for _ in range(300):
        parts = rng.sample(texts, rng.randint(2, 4)) + rng.sample(["ok", "x", "先", "之后"], 1)
        rng.shuffle(parts)
        text = rng.choice(["，然后", "; ", ", then ", "，先", "，另外"]).join(parts)
        for mark in rng.sample(['"', "“", "”", "'", "「", "」", "\ue000", "3\ue001"], 3):
            at = rng.randrange(len(text) + 1)
            text = text[:at] + mark + text[at:]
        match = index.match(text)
        assert len(match.plan) == len(match.step_confidence)


def test_clauses_split_on_connectives_and_keep_short_steps_that_name_an_action():
    assert clauses("summarize this, then email it to Tom") == ["summarize this", "email it to Tom"]
    assert clauses("写好之后发给我") == ["写好", "发给我"]
    assert clauses("不下雨的话订张票") == ["不下雨的话", "订张票"]
    assert clauses("translate it, also send it") == ["translate it", "send it"]
    assert clauses("合并两个表格") == ["合并两个表格"]
    assert clauses("帮忙看下这个 diff 的并发问题") == ["帮忙看下这个 diff 的并发问题"]
    assert clauses("写完然后ok") == ["写完 ok"]  # "ok" names nothing: not a step
    # A condition starts the step it governs, and stays with it.
    assert clauses("find invoice 5521 and, if it is unpaid, remind the client") == [
        "find invoice 5521", "if it is unpaid, remind the client"]
    assert clauses("check stock and if none is left reorder") == [
        "check stock", "if none is left reorder"]
    # 再 before checking, booking or scheduling starts a step too (helper-38's held-out
    # "…如果已经发货了再查一下物流轨迹" was one step); "帮我再查" is one.
    assert clauses("查一下订单的状态，如果已经发货了再查一下物流轨迹") == [
        "查一下订单的状态，如果已经发货了", "查一下物流轨迹"]
    assert clauses("先约张总开会，再订个会议室") == ["先约张总开会", "订个会议室"]
    assert len(clauses("帮我再查一下订单 123")) == 1
    # What is said to come first comes first; "before" a time is when.
    assert clauses("退款之前先查一下订单状态") == ["先查一下订单状态", "退款"]
    assert clauses("帮我订票，先查一下天气") == ["先查一下天气", "帮我订票"]
    assert clauses("before refunding, check the order status first") == [
        "check the order status first", "refunding"]
    assert clauses("周五之前先把报告写完") == ["先把报告写完"]
    assert clauses("before 5pm tomorrow, remind me to call") == ["remind me to call"]
    assert clauses("先约张总开会，再订个会议室") == ["先约张总开会", "订个会议室"]
    # Quoted material is what a step works on, not steps of its own.
    assert len(clauses('translate into English: "first refund it, then check the status"')) == 1
    assert len(clauses("把这句话翻译成英文：“退款之前先查一下订单状态”")) == 1
    assert len(clauses("subject 'before the refund, check the order status'")) == 1
    assert clauses("summarize it, then translate it's text") == [
        "summarize it", "translate it's text"]
    # A request that orders its steps itself keeps that order (helper-48: "then … first"
    # put the refund email before the check); a negated part is no step; "finally" and
    # "最后" start the last one; "before the meeting" is when.
    assert clauses("Check the status, then send the refund confirmation email first") == [
        "Check the status", "send the refund confirmation email first"]
    assert clauses("查订单状态，然后首先把结果发给我") == ["查订单状态", "首先把结果发给我"]
    assert clauses("查一下订单状态，先别退款") == ["查一下订单状态"]
    assert clauses("别忘了提醒我交房租") == ["别忘了提醒我交房租"]
    assert clauses("写好邮件，但先不要发送") == ["写好邮件"]
    # How, not what not to do: "别那么官方" (less formal); what happened: "but never got".
    assert len(clauses("把这段活动通知改得口语化、亲切一点，别那么官方")) == 1
    assert len(clauses("she was charged but never got a confirmation")) == 1
    assert clauses("整理会议纪要，再做成PPT，最后发给老板") == [
        "整理会议纪要", "做成PPT", "发给老板"]
    assert clauses("First translate it, then polish it, finally send it to the client") == [
        "First translate it", "polish it", "send it to the client"]
    assert clauses("Before the meeting, make slides from the outline") == [
        "make slides from the outline"]
    assert clauses("Send it after polishing it") == ["polishing it", "Send it"]
    assert clauses("remind me after lunch") == ["remind me after lunch"]
    assert clauses("call me after everything settles") == ["call me after everything settles"]
    # A text holding the private-use marks the masking uses is split as it is.
    assert clauses('translate "hello there" \ue0009\ue001, then send it') == [
        'translate "hello there" \ue0009\ue001', "send it"]
    # After a time is when, not what next.
    assert clauses("查 2024-01-01 之后下的订单") == ["查 2024-01-01 之后下的订单"]
    assert clauses("三天以后再提醒我") == ["三天以后再提醒我"]
    assert clauses("整理成纪要，之后发邮件给大家") == ["整理成纪要", "发邮件给大家"]


# ---- learned phrases ------------------------------------------------------------------


@pytest.mark.parametrize("embedded", [True, False])
def test_a_learned_phrase_steers_only_the_match_it_is_given_to(encoder, embedded):
    catalogue = [CapabilityText("kb.faq", "Knowledge base", "Answers questions from the wiki."),
                 CapabilityText("it.ticket", "IT helpdesk", "Opens a ticket for broken equipment.")]
    index = IntentIndex(catalogue, embedder=encoder if embedded else None)
    text = "the thing on floor 3 is beeping again"
    learned = [Learned("it.ticket", "the thing on floor 3 is beeping again")]
    before = index.match(text)
    after = index.match(text, learned=learned)
    assert after.best.capability_id == "it.ticket" and after.best.learned > 0
    assert before.best is None or before.best.learned == 0


@pytest.mark.parametrize("embedded", [True, False])
def test_a_taught_request_goes_where_it_was_taught_whatever_its_words_match(encoder,
                                                                          embedded):
    """Re-test (helper-46): "track my parcel", taught four times to order.status, still
    went to parcel tracking at 0.99: its words match that description, and the learned
    phrase was only averaged in. The very request taught now decides; a nearby one is
    only pulled."""
    catalogue = [CapabilityText("order.status", "订单查询",
                                "查询订单的当前状态、支付情况和预计发货时间。"),
                 CapabilityText("logistics.track", "Parcel tracking",
                                "Track parcels and shipments by the carrier's tracking number; "
                                "shows the current location and delivery ETA.")]
    index = IntentIndex(catalogue, embedder=encoder if embedded else None)
    learned = [Learned("order.status", "track my parcel")]
    assert index.match("track my parcel").best.capability_id == "logistics.track"
    for text in ("track my parcel", "Track my parcel!"):
        taught = index.match(text, learned=learned)
        assert taught.best.capability_id == "order.status", (text, taught.ranked)
        assert taught.confidence > 0.9
    assert index.match("where is my parcel", learned=learned).best.capability_id \
        == "logistics.track"


@pytest.mark.parametrize("embedded", [True, False])
def test_a_learned_phrase_is_matched_in_any_case_and_end_punctuation(encoder, embedded):
    """Break test (helper-36): a phrase learned from "give me the gist of this memo" did
    not take "GIVE ME THE GIST OF THIS MEMO" or "...memo!", though phrases are stored
    case-folded with their end punctuation trimmed."""
    catalogue = [CapabilityText("doc.summarize", "Summaries", "Summarises long documents."),
                 CapabilityText("note.file", "Notes", "Files a note under a project.")]
    index = IntentIndex(catalogue, embedder=encoder if embedded else None)
    learned = [Learned("note.file", "give me the gist of this memo")]
    for text in ("GIVE ME THE GIST OF THIS MEMO", "give me the gist of this memo!",
                 "  Give me the gist of this memo?! ", "ｇｉｖｅ me the gist of this memo"):
        match = index.match(text, learned=learned)
        assert match.best is not None and match.best.capability_id == "note.file", text
        assert match.best.learned > 0, text
    # helper-37's re-test: an opening "¿" or "「" and the dotted capital I ("İ" folds to
    # "i" and a combining dot) defeated the phrase; "c#" keeps its "#".
    from routing.text import phrase_of  # as registry.learning keeps a phrase

    learned = [Learned("note.file", phrase_of("¿Dónde está el informe de Istanbul?")),
               Learned("doc.summarize", phrase_of("review my C# notes"))]
    for text, wanted in (("DÓNDE ESTÁ EL INFORME DE İSTANBUL", "note.file"),
                         ("「dónde está el informe de istanbul」", "note.file"),
                         ("¡Review my C# notes!", "doc.summarize")):
        match = index.match(text, learned=learned)
        assert match.best is not None and match.best.capability_id == wanted, text
        assert match.best.learned == 1.0, text


def test_a_long_intent_is_embedded_in_its_first_300_characters_only(encoder):
    """Break test (helper-36): a unique 2,000-byte intent held the event loop, and
    another tenant's calls, for 220-294 ms, most of it the sentence encoder's. What it
    reads is bounded; every word is still matched."""
    class Recording:
        dimensions = encoder.dimensions

        def __init__(self):
            self.longest = 0

        def embed(self, texts):
            self.longest = max([self.longest, *map(len, texts)])
            return encoder.embed(texts)

    catalogue = [CapabilityText("lang.translate", "翻译", "把文档翻译成其他语言。"),
                 CapabilityText("order.refund", "Refunds", "Refunds an order.")]
    recording = Recording()
    index = IntentIndex(catalogue, embedder=recording)
    recording.longest = 0
    text = "请帮我处理一下，" * 120 + "把这份合同翻译成英文"
    match = index.match(text)
    assert len(text) > 900 and recording.longest <= 300
    assert match.best is not None and match.best.capability_id == "lang.translate"


# ---- the router and the index holder ----------------------------------------------------


@pytest.mark.parametrize("embedded", [True, False])
def test_another_tenants_private_texts_never_move_a_decision(encoder, embedded):
    """Break test (helper-36): tenant 2 registered private capabilities repeating
    "翻译 日文 translation"; tenant 1's translation request went from a match to a 404,
    and other decisions changed confidence: the words' rarity was counted over every
    tenant's texts. Now over the texts the caller may see."""
    mine = [
        agent("translator", "lang.translate", cap={
            "display_name": "翻译", "description": "把文档或段落翻译成其他语言，支持日文、英文。"}),
        agent("minutes", "meeting.minutes", cap={
            "display_name": "Meeting minutes",
            "description": "Turns a meeting recording into minutes with owners."}),
        agent("mailer", "email.draft", cap={
            "display_name": "Email drafts", "description": "Drafts a polite business email."}),
    ]
    stuffed = [agent(f"stuff{i}", f"stuff.{i}", owner=2, cap={
        "display_name": "Translate translation 翻译",
        "description": "翻译 日文 翻译 translation polite reply email invitation decline "
                       "日文 意思"}) for i in range(15)]
    intents = ("这段日文是什么意思，帮我翻译一下", "write a polite reply declining the invitation",
               "turn the recording into minutes", "translate this paragraph into Japanese")

    before = _tenant_one_decisions(encoder if embedded else None, intents, mine)
    assert before[0]["capability"] == "lang.translate", before[0]
    _same_decisions(_tenant_one_decisions(encoder if embedded else None, intents,
                                          [*mine, *stuffed]), before, embedded)


def _tenant_one_decisions(embedder, intents, agents) -> list[dict]:
    """Tenant 1's dry runs of ``intents`` over a table of ``agents``."""
    holder = IntentIndexHolder(embedder=embedder)
    routes = table(*agents)
    holder.update(routes)
    router = Router(index=holder)
    return [router.route(routes, RouteRequest(tenant_pk=1, intent=text),
                         pick=False).explain() for text in intents]


def _same_decisions(after, before, embedded: bool) -> None:
    if embedded:  # a larger matrix product may round the same rows' similarities in the
        _same_but_for_last_bits(after, before)  # last bits (CI saw it)
    else:
        assert after == before


@pytest.mark.parametrize("embedded", [True, False])
def test_another_tenants_private_words_are_not_the_spelling_correctors(encoder, embedded):
    """Break test (helper-43): "payrolk for march" went to payroll until another tenant
    privately registered a text with "payrolk", then 404 (the corrector took it for a
    word); and a dry run of "quorvez" told whether "quorvex" was in someone's private
    descriptor. A misspelling is corrected toward the words the caller may see."""
    mine = [agent("payroll", "hr.payroll", cap={
                "display_name": "Payroll", "description": "Runs the monthly payroll and "
                "answers payroll questions."}),
            agent("probe", "probe.quorvey", cap={
                "display_name": "Quorvey", "description": "Quorvey reports."}),
            agent("mailer", "email.draft", cap={
                "display_name": "Email drafts", "description": "Drafts a business email."})]
    secret = [agent("secret", "secret.codename", owner=2, visibility="private", cap={
        "display_name": "Codename", "description": "Project payrolk and quorvex archive."})]
    intents = ("payrolk for march", "quorvex", "quorvez")

    before = _tenant_one_decisions(encoder if embedded else None, intents, mine)
    assert before[0]["capability"] == "hr.payroll", before[0]
    _same_decisions(_tenant_one_decisions(encoder if embedded else None, intents,
                                          [*mine, *secret]), before, embedded)

def _same_but_for_last_bits(got, want, where="") -> None:
    if isinstance(want, float) and isinstance(got, float):
        assert abs(got - want) <= 1e-4, (where, got, want)
    elif isinstance(want, dict) and isinstance(got, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            _same_but_for_last_bits(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list | tuple) and isinstance(got, list | tuple):
        assert len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same_but_for_last_bits(g, w, f"{where}[{i}]")
    else:
        assert got == want, (where, got, want)


def test_the_router_routes_an_intent_and_reports_a_plan(encoder):
    summarizer = agent("summarizer", "summarize.text",
                       cap={"display_name": "Summaries", "keywords": ("summarize", "总结"),
                            "description": "Summarises long documents into key points."})
    mailer = agent("mailer", "email.send", cap={"display_name": "Email sending",
                                                "description": "Sends an email to recipients."})
    holder = IntentIndexHolder(embedder=encoder)
    t = table(summarizer, mailer)
    holder.update(t)
    router = Router(index=holder)
    single = router.route(t, RouteRequest(tenant_pk=1, intent="帮我总结一下这篇文章"))
    assert single.capability == "summarize.text" and single.chosen.agent.name == "summarizer"
    assert single.confidence > 0.5 and single.margin > 0 and not single.needs_confirmation
    plan = router.route(t, RouteRequest(tenant_pk=1,
                                        intent="summarize this report and then email it to Ann"))
    assert plan.plan == ("summarize.text", "email.send")
    assert plan.chosen.agent.name == "summarizer" and len(plan.step_confidence) == 2
    none = router.route(t, RouteRequest(tenant_pk=1, intent="what's the weather in Paris"))
    assert none.error == "no_capability" and none.chosen is None
    assert none.suggestions and none.explain()["suggestions"]


def test_a_plan_whose_whole_request_matches_nothing_is_still_routed(encoder):
    """Re-test (helper-46): "book a meeting with Alice, then remind me an hour before"
    was a 404 no_capability, though each part routes on its own: the whole request
    matched nothing, and the router refused before it looked at the plan."""
    cards = [("calendar.schedule", "Meeting scheduling", "Book meetings on team calendars: "
              "finds a free slot for all attendees and sends the invites."),
             ("reminder.set", "提醒", "设置个人提醒事项，到时间通过消息提醒你。"),
             ("meeting.minutes", "Meeting minutes", "Turn a meeting recording or transcript "
              "into minutes with decisions and action items."),
             ("email.send", "Email sending", "Send an email that is already written to the "
              "given recipients through the company mail relay."),
             ("translate.doc", "Document translation", "Translate documents and text between "
              "languages (English, Chinese, Japanese), preserving formatting."),
             ("order.status", "订单查询", "查询订单的当前状态、支付情况和预计发货时间。")]
    t = table(*(agent(cid.replace(".", "-"), cid, cap={"display_name": name,
                                                       "description": text})
                for cid, name, text in cards))
    holder = IntentIndexHolder(embedder=encoder)
    holder.update(t)
    router = Router(index=holder)
    text = "book a meeting with Alice, then remind me an hour before"
    decision = router.route(t, RouteRequest(tenant_pk=1, intent=text))
    assert decision.error is None and decision.plan == ("calendar.schedule", "reminder.set")
    assert decision.capability == "calendar.schedule" and decision.chosen is not None
    # The case itself, whatever the whole request scores in this catalogue (described
    # only: its bar is lower, and the whole now matches the reminder): a plan with no
    # match for the whole request.
    match = holder.index.match(text)
    assert match.plan == ("calendar.schedule", "reminder.set")
    decision = router.route(t, RouteRequest(tenant_pk=1, intent=text),
                            match=replace(match, ranked=()))
    assert decision.error is None and decision.plan == ("calendar.schedule", "reminder.set")
    assert decision.capability == "calendar.schedule" and decision.chosen is not None


def test_an_intent_matches_only_capabilities_in_its_namespace(encoder):
    """helper-48: a capability offered only in namespace sales-eu was chosen for a
    default-namespace intent, then refused ("No agent offers 'quote.build'") with no
    suggestions, though another capability matched in the default namespace."""
    quotes = agent("quoter", "quote.build", namespace="sales-eu", cap={
        "display_name": "Price quotes", "description": "Builds a price quote for a customer."})
    mailer = agent("mailer", "email.send", cap={
        "display_name": "Email sending", "description": "Sends an email to recipients."})
    t = table(quotes, mailer)
    holder = IntentIndexHolder(embedder=encoder)
    holder.update(t)
    router = Router(index=holder)
    text = "build a price quote for the customer"
    here = router.route(t, RouteRequest(tenant_pk=1, intent=text))
    assert here.capability != "quote.build" and all(
        s.capability_id != "quote.build" for s in here.suggestions), here
    there = router.route(t, RouteRequest(tenant_pk=1, intent=text, namespace="sales-eu"))
    assert there.capability == "quote.build" and there.chosen is not None


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


def test_without_the_encoder_matching_is_by_words_and_the_threshold_is_configurable():
    docs = load_catalogue(EVAL / "catalogue.json")
    text = "Translate this paragraph into Japanese please"
    assert IntentIndex(docs).match(text).best.capability_id == "translate.text"
    assert IntentIndex(docs, threshold=0.99).match(text).best is None
    assert IntentIndex(docs).match("zxqv plorf").best is None


def test_the_embedder_setting_is_checked():
    assert configured_embedder("lexical") is None
    with pytest.raises(ValueError, match="unknown intent embedder"):
        configured_embedder("gpt-9")


# ---- other tenants' private capabilities ------------------------------------------------


def _mail_agents():
    return [
        agent("drafter", "email.draft", owner=1, visibility="public",
              cap={"display_name": "Email drafting", "description": "Drafts business emails."}),
        agent("sender", "email.send", owner=1, visibility="public",
              cap={"display_name": "Email sending", "description": "Sends an email."}),
        agent("summariser", "doc.summarize", owner=1, visibility="public",
              cap={"display_name": "Summaries", "description": "Summarises documents."}),
    ]


SECRET = agent("secret", "beta.secret.mailer", owner=2, visibility="private",
               cap={"display_name": "Mail sender",
                    "description": "Sends an email to Tom and to anyone else, fast."})


@pytest.mark.parametrize("text", [
    "把这封邮件发给 Tom",
    "summarise this report, then send it to Tom by email",
    "beta.secret.mailer",  # another tenant's id, probed as an intent
])
def test_another_tenants_private_capability_never_moves_a_decision(encoder, text):
    def decide(*agents):
        t = table(*agents)
        holder = IntentIndexHolder(embedder=encoder)
        holder.update(t)
        d = Router(index=holder).route(t, RouteRequest(tenant_pk=1, intent=text), pick=False)
        return (d.capability, d.plan, d.matches[0].score if d.matches else None, d.margin,
                d.needs_confirmation, [s.capability_id for s in d.matches],
                [s.capability_id for s in d.suggestions])

    alone, beside = decide(*_mail_agents()), decide(*_mail_agents(), SECRET)
    # The choice, the plan, the confirmation and what is listed are the same. Scores may
    # move a little: word statistics (idf) are the whole index's, and a catalogue of
    # three visible capabilities magnifies that (the margin here moves by about 0.05).
    assert (beside[:2], beside[4:]) == (alone[:2], alone[4:])
    assert beside[2] == pytest.approx(alone[2], abs=0.05)
    assert "beta.secret.mailer" not in str(beside)
    # Its owner does see it.
    t = table(*_mail_agents(), SECRET)
    holder = IntentIndexHolder(embedder=encoder)
    holder.update(t)
    mine = Router(index=holder).route(t, RouteRequest(tenant_pk=2, intent="beta.secret.mailer"),
                                      pick=False)
    assert mine.capability == "beta.secret.mailer"


_TRACKING = {"display_name": "Parcel tracking",
             "description": "Tracks parcels and shipments: where a package is now and when "
                            "it will be delivered.",
             "examples": ("where is my parcel", "我的快递到哪了")}


def _decide(encoder, tenant_pk: int, text: str, *agents):
    t = table(*agents)
    holder = IntentIndexHolder(embedder=encoder)
    holder.update(t)
    return Router(index=holder).route(t, RouteRequest(tenant_pk=tenant_pk, intent=text),
                                      pick=False)


def test_another_tenants_public_capability_does_not_take_a_tenants_intents(encoder):
    """A break test: another tenant published a public capability under a different id
    with the victim's description copied (a tie its id, sorted first, won) or stuffed
    with the victim's phrases as examples (it outscored the victim's honest text), and
    took the victim's intent calls and their inputs. The caller's own capabilities that
    match go first; other tenants still reach the public one, and it remains the
    fallback for what none of the caller's own matches."""
    mine = agent("tracker", "parcel.track", owner=1, cap=_TRACKING)
    copy = agent("copycat", "aaa.track", owner=2, visibility="public", cap=_TRACKING)
    stuffed = agent("stuffed", "parcel.finder", owner=2, visibility="public", cap={
        "display_name": "Parcel finder", "description": "where is my parcel, parcel tracking",
        "examples": ("where is my parcel now?", "我的包裹什么时候送到", "track my parcel")})
    drafter = agent("drafter", "email.draft", owner=2, visibility="public",
                    cap={"display_name": "Email drafting",
                         "description": "Drafts business emails and replies."})
    for text in ("where is my parcel now?", "我的包裹什么时候送到"):
        assert _decide(encoder, 3, text, mine, copy, drafter).capability == "aaa.track"
        decided = _decide(encoder, 1, text, mine, copy, drafter)
        assert decided.capability == "parcel.track", text
        assert decided.matches[1].capability_id == "aaa.track"  # listed, not chosen
        assert decided.needs_confirmation  # it outscored nobody, and says so
        assert _decide(encoder, 3, text, mine, stuffed).capability == "parcel.finder"
        assert _decide(encoder, 1, text, mine, stuffed).capability == "parcel.track", text
    # Each step of a plan too.
    planned = _decide(encoder, 1, "track my parcel, then draft an email to the customer "
                      "about the delay", mine, copy, drafter)
    assert planned.plan == ("parcel.track", "email.draft")
    # What none of its own matches still reaches a public capability.
    assert _decide(encoder, 1, "draft a polite email declining the meeting", mine, copy,
                   drafter).capability == "email.draft"


def test_a_stuffed_public_capability_does_not_pass_unasked(encoder):
    """The re-test: where the victim had two matching capabilities, the one chosen led
    its own runner-up, and the decision did not say that another tenant's public one
    had scored higher (nor did "ask" ask)."""
    lookup = agent("lookup", "orders.lookup", owner=1, cap={
        "display_name": "Order lookup", "description": "Looks up a customer order."})
    history = agent("history", "orders.history", owner=1, cap={
        "display_name": "Order history", "description": "Lists a customer's orders."})
    support = agent("support", "zz.support", owner=2, visibility="public", cap={
        "display_name": "Support", "description": "check my order status",
        "examples": ("check my order status", "where is my order")})
    decided = _decide(encoder, 1, "check my order status", lookup, history, support)
    ours = [m for m in decided.matches if m.capability_id != "zz.support"]
    assert len(ours) == 2 and decided.capability == ours[0].capability_id
    assert max(m.score for m in decided.matches) > decided.matches[0].score
    assert decided.needs_confirmation and decided.margin == 0
    assert decided.confidence <= 0.5  # a coin toss at best (a re-test read 0.99)


def test_another_tenants_capability_never_covers_steps_the_callers_own_match(monkeypatch):
    """The re-test: a public capability stuffed with the victim's phrases "covered" its
    two-step request (and took its input). Scores are fixed here: the victim's own
    capabilities match each step, the public one matches the whole and both steps."""
    index = IntentIndex([CapabilityText(c) for c in ("orders.lookup",
                                                     "account.password_reset",
                                                     "zz.support")])
    text = "where is my order 12345 and then reset my password"
    whole = [Score("zz.support", 0.9)]
    parts = {"where is my order 12345": [Score("orders.lookup", 0.5),
                                         Score("zz.support", 0.85)],
             "reset my password": [Score("account.password_reset", 0.6),
                                   Score("zz.support", 0.8)]}
    monkeypatch.setattr(IntentIndex, "_scored", lambda self, t, *a: (
        list(whole) if t == text else list(parts[t]), []))
    home = index.allowed_slots(lambda c: c.capability_id != "zz.support")
    mine = index.match(text, home=home)
    assert mine.plan == ("orders.lookup", "account.password_reset") and not mine.covered
    # A tenant with none of its own: the public capability covers the request.
    assert index.match(text).covered


def test_another_tenants_capability_is_no_way_round_the_callers_own_outage(encoder):
    """The second re-test: the caller's matching capability drained, the intent went to
    another tenant's public capability, the next match, and the caller's input with it.
    Now the call fails as its own capability's (no healthy instance)."""
    reports = agent("reports", "report.build", owner=1, instances=({"state": "draining"},),
                    cap={"display_name": "Reports", "description": "Builds business reports."})
    slides = agent("slides", "slides.make", owner=2, visibility="public", cap={
        "display_name": "Slides", "description": "Makes slides of a quarterly report."})
    for text in ("build the quarterly report", "做季度报告"):
        decided = _decide(encoder, 1, text, reports, slides)
        assert decided.matches[0].capability_id == "report.build", text
        assert decided.chosen is None and decided.error == "no_healthy_instance", text
    # Up again, it is chosen; and a tenant with none of its own reaches the public one.
    up = agent("reports", "report.build", owner=1, cap={
        "display_name": "Reports", "description": "Builds business reports."})
    assert _decide(encoder, 1, "build the quarterly report", up, slides).capability == \
        "report.build"
    assert _decide(encoder, 3, "make slides of the quarterly report", reports,
                   slides).capability == "slides.make"


class _Fixed:
    """An intent index whose every request matches as given."""

    def __init__(self, *scores: Score) -> None:
        self.ranked = scores

    def match(self, text, **_):
        return Match(ranked=self.ranked)

    def allowed_slots(self, visible):
        return None


def test_the_way_round_an_outage_is_only_a_match_as_good():
    """The next re-test: with the invoice capability drained, an invoice went to the
    tenant's own contract reviewer, matched at 0.195 (and to a granted one at 0.25).
    Only a match within the ambiguity margin of the best is tried instead."""
    invoices = agent("invoices", "invoice.extract", owner=1,
                     instances=({"state": "draining"},))
    contracts = agent("contracts", "contract.review", owner=1)
    reader = agent("reader", "invoice.read", owner=1)
    t = table(invoices, contracts, reader)

    def decide(*scores):
        index = _Fixed(*scores)
        return Router(index=lambda: index).route(t, RouteRequest(tenant_pk=1, intent="x"))

    far = decide(Score("invoice.extract", 0.80), Score("contract.review", 0.25))
    assert far.chosen is None and far.error == "no_healthy_instance"
    near = decide(Score("invoice.extract", 0.80), Score("invoice.read", 0.78))
    assert near.chosen.agent.name == "reader"


_ORDERS = {"display_name": "Order status",
           "description": "Look up the status of a customer order.",
           "not_for": ("parcel tracking (use logistics.track)",)}
_PARCELS = {"display_name": "Parcel tracking",
            "description": "Track a parcel shipment with its carrier."}
_POISON = {"display_name": "Order status", "description": "Order status.",
           "examples": ("track my parcel SF1234567", "快递到哪了", "reset my password"),
           "not_for": ("what is the status of my order", "我的订单状态", "order status")}
_INTENTS = ("track my parcel SF1234567", "what is the status of my order", "我的订单状态",
            "reset my password")


@pytest.mark.parametrize("visibility", ["private", "public"])
def test_another_tenants_hints_on_a_shared_id_steer_no_other_tenants_routing(encoder,
                                                                           visibility):
    """A break test: tenant 2 registered the id tenant 1 offers (``order.status``) with
    tenant 1's order phrases as what it is not for, and parcel and password phrases as
    its examples. Pooled into one text for the id, its hints moved every tenant's
    decisions: tenant 1's order requests were refused, parcels and passwords went to
    its order agent. Each tenant's agents now write their own text of a shared id, and a
    tenant is matched against another's text only for an id it has no agent of."""
    orders = agent("orders", "order.status", owner=1, cap=_ORDERS)
    parcels = agent("parcels", "logistics.track", owner=1, cap=_PARCELS)
    poison = agent("poison", "order.status", owner=2, visibility=visibility, cap=_POISON)

    def decisions(tenant_pk, *agents):
        return [(d.capability, d.error) for d in
                (_decide(encoder, tenant_pk, text, *agents) for text in _INTENTS)]

    alone = decisions(1, orders, parcels)
    assert alone[:3] == [("logistics.track", None), ("order.status", None),
                         ("order.status", None)]
    assert decisions(1, orders, parcels, poison) == alone
    # A tenant with no agent of the id sees the public text it may call, not another's
    # private one, and the owner of the hints still has them.
    public_orders = agent("orders", "order.status", owner=1, visibility="public", cap=_ORDERS)
    assert decisions(3, public_orders, poison)[1] == ("order.status", None)
    if visibility == "private":
        assert decisions(3, public_orders, poison) == decisions(3, public_orders)
    assert _decide(encoder, 2, "reset my password", orders, parcels,
                   poison).capability == "order.status"


def test_only_the_best_match_of_the_whole_request_may_cover_its_steps(monkeypatch):
    """A break test: for "summarize the report, after that email it to the team" the
    runner-up of the whole request (a drafting capability, fair on both parts) was taken
    as covering it, and the call became one draft step: the summary was lost and the
    mail not sent. Scores are fixed here; the rule is what is tried."""
    index = IntentIndex([CapabilityText(c) for c in ("text.summarize", "email.send",
                                                     "email.draft")])
    text = "summarize the report, after that email it to the team"
    whole = [Score("email.send", 0.52), Score("email.draft", 0.42),
             Score("text.summarize", 0.26)]
    parts = {"summarize the report": [Score("text.summarize", 0.30),
                                      Score("email.draft", 0.22)],
             "email it to the team": [Score("email.send", 0.81), Score("email.draft", 0.58)]}
    monkeypatch.setattr(IntentIndex, "_scored", lambda self, t, *a: (
        whole if t == text else parts[t], []))
    match = index.match(text)
    assert match.plan == ("text.summarize", "email.send") and not match.covered
    # The best match itself fair on every part does cover it: one step.
    whole[:2] = [Score("email.draft", 0.6), Score("email.send", 0.52)]
    covered = index.match(text)
    assert covered.covered and not covered.plan and covered.best.capability_id == "email.draft"
    assert covered.margin >= 0


def test_a_request_of_hundreds_of_parts_is_matched_in_at_most_five_steps(index, monkeypatch):
    scored = []
    real = IntentIndex.scores

    def counting(self, text, *args, **kwargs):
        scored.append(text)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(IntentIndex, "scores", counting)
    match = index.match("，".join(["发邮件"] * 500))
    assert len(scored) <= 5 and len(match.clauses) == 5
    assert len(match.plan) <= 5


# ---- the concept lexicon --------------------------------------------------------------

# Close neighbours, each described in one language only; each request is in the other
# language or says it the everyday way, and shares no content word with its capability's
# description, so only the lexicon's concepts (by words alone) can bring the two together.
NEIGHBOURS = [
    CapabilityText("reminder.set", "Reminders",
                   "Personal notifications at a chosen time; one-off or recurring."),
    CapabilityText("calendar.schedule", "日程安排", "创建会议邀请，查找参会人的共同空闲时间。"),
    CapabilityText("hr.payslip", "Payroll statements",
                   "Shows an employee's monthly salary breakdown and deductions."),
    CapabilityText("hr.leave", "请假", "提交年假、病假申请并查询剩余假期。"),
    CapabilityText("speech.tts", "Text to speech", "Natural-sounding narration for any text."),
    CapabilityText("speech.transcribe", "语音转写", "把会议或访谈录音转写成文字稿。"),
    CapabilityText("slides.generate", "演示文稿", "根据提纲生成 PPT，套用公司模板。"),
    CapabilityText("report.business", "Business reports",
                   "Weekly and monthly KPI summaries with charts and commentary."),
]


@pytest.mark.parametrize(("request_text", "expected"), [
    ("明早九点提醒我交报销单", "reminder.set"),
    ("ping me at 4 to call the bank", "reminder.set"),
    ("帮我看看上个月的工资条", "hr.payslip"),
    ("I want to take two days off next week", "hr.leave"),
    ("把这段欢迎词读出来，要女声", "speech.tts"),
    ("I need this interview audio as text, word for word", "speech.transcribe"),
    ("turn my outline into a deck for the board", "slides.generate"),
    ("给老板出一份本月的经营分析月报", "report.business"),
])
def test_the_lexicon_brings_everyday_and_cross_language_wording_to_its_capability(
        request_text, expected):
    match = IntentIndex(NEIGHBOURS).match(request_text)
    assert match.best is not None and match.best.capability_id == expected, match.ranked


# ---- addresses are parameters -----------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("把这个报价单发到 finance-invoice@acme.cn", "email.send"),
    ("Summarize this article https://weather.example.com/typhoon-report-2024 in three bullets",
     "doc.summarize"),
    ("翻译一下 https://news.example.com/refund-policy 这篇文章", "translate.text"),
])
def test_the_words_inside_an_address_or_a_link_do_not_pick_the_capability(index, text, expected):
    # Before addresses were read as what they are, these went to finance.invoice_issue,
    # weather.forecast and refund.request.
    match = index.match(text)
    assert match.best is not None and match.best.capability_id == expected, match.ranked


def test_an_address_alone_is_read_as_email():
    from routing.text import without_addresses

    assert without_addresses("cc li.na+ops@corp.example.com and www.example.org/x?y=1") \
        == "cc  email address  and  link "
    assert without_addresses("no address here, 3 @ 5") == "no address here, 3 @ 5"


MAIL = [
    CapabilityText("email.draft", "邮件撰写",
                   "根据要点起草商务邮件，可调整语气。只生成草稿，不会发送。",
                   not_for=("实际发送邮件",)),
    CapabilityText("email.send", "Email Sending", "Sends an email from the user's mailbox to "
                   "the recipients given, with CC and attachments."),
    CapabilityText("meeting.minutes", "Meeting minutes", "Turns meeting notes or a recording "
                   "into formal minutes with decisions and action items."),
    CapabilityText("reminder.set", "Reminders", "Sets personal reminders at a given time."),
]


@pytest.mark.parametrize(("text", "expected"), [
    ("把这份报价发给采购部，抄送我的主管", ("email.send",)),
    ("发邮件给所有参会人", ("email.send",)),
    ("把会上记的笔记整理成正式纪要，之后发邮件给所有参会人", ("meeting.minutes", "email.send")),
])
def test_sending_in_chinese_reaches_a_capability_that_sends_described_in_english(
        index, text, expected):
    """发给 / 发邮件 / 抄送 are the English description's "sends" and "CC" (the lexicon's
    send concept), and the drafting capability's "不会发送" is not its own word: before,
    the Chinese drafting capability was the only one the words reached. Words only on a
    small catalogue; with the encoder on the evaluation catalogue (the encoder reads a
    capability among those written in its language)."""
    from routing.evaluation import decided

    assert decided(IntentIndex(MAIL).match(text)) == expected
    assert decided(index.match(text)) == expected


def test_a_description_saying_what_it_does_not_do_draws_no_requests_by_it(encoder):
    """The issue's case: an order-status description ending "For parcel tracking use the
    logistics service." pulled parcel-tracking requests to it."""
    text = "where is my parcel right now? track the delivery"
    for embedder in (None, encoder):
        match = IntentIndex([ORDERS, *OTHERS], embedder=embedder).match(text)
        assert match.best is None, match.ranked
        assert IntentIndex([ORDERS, *OTHERS], embedder=embedder).match(
            "what did I buy in order 88123 and is it paid?").best.capability_id == "order.status"


def test_a_chinese_description_saying_what_it_does_not_do_draws_no_requests_by_it(encoder):
    """helper-51: "…不做发票图片识别。" (does no invoice-image reading) was not read as a
    disclaimer: "发票图片识别" went to the invoicing capability at 0.995; and "localize"
    was a form of the lexicon's translation concept (one of the issue's sense bugs)."""
    catalogue = [
        CapabilityText("fin.invoice", "", "为客户开具增值税专用发票或普通发票，返回电子发票 PDF。"
                       "不做发票图片识别。"),
        CapabilityText("fin.invoice_ocr", "", "识别发票扫描件或照片，"
                       "提取发票代码、号码、金额和税号。"),
        CapabilityText("content.translate", "", "Translates documents between Chinese and "
                       "English. 不做本地化改写。"),
        CapabilityText("content.localize", "", "Adapts UI strings and marketing copy to a "
                       "target market: currency, dates, units and tone."),
    ]
    for embedder in (None, encoder):
        index = IntentIndex(catalogue, embedder=embedder)
        for text, away in (("发票图片识别", "fin.invoice"),
                           ("做一下本地化改写", "content.translate")):
            match = index.match(text)
            assert match.best is None or match.best.capability_id != away, (text, match.ranked)
        assert index.match("给上海明远开一张增值税专票").best.capability_id == "fin.invoice"
    assert "k:translate" not in features("localize the app for Canada")


def test_a_negative_hint_on_one_step_leaves_the_other_step_routable(encoder):
    """helper-38: with "tracking where a parcel is right now" as a hint, "I want to return
    a parcel and then track where it is" was refused whole (the whole request is closer
    to the hint), though its first part is the desk's job: that part is answered."""
    desk = CapabilityText(
        "support.desk", "", "Answers shoppers' questions about our store: orders, payments, "
        "parcel deliveries and returns.", keywords=("order", "delivery", "parcel", "退货"),
        not_for=("tracking where a parcel is right now (use parcel.track)",))
    others = [CapabilityText("calendar.book", "", "Books meetings in participants' "
                             "calendars and sends invitations."),
              CapabilityText("expense.approve", "", "审批员工提交的报销单，核对金额和发票。")]
    index = IntentIndex([desk, *others], embedder=encoder)
    assert index.match("where is my parcel right now?").best is None  # the hint holds
    match = index.match("I want to return a parcel and then track where it is")
    assert match.best is not None and match.best.capability_id == "support.desk", match
    assert not match.plan and match.confidence > 0.5
