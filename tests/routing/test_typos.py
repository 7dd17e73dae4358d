"""Chinese sound-alike slips (the input method's wrong pick of the same sound) are read
as the lexicon word meant; real words and common characters are left alone."""

from __future__ import annotations

import pytest

from routing.matcher import CapabilityText, IntentIndex
from routing.typos import heard


@pytest.mark.parametrize(("typed", "meant"), [
    ("帮我写一下今天的会议机要", "帮我写一下今天的会议纪要"),
    ("忘记 OA 的蜜码了", "忘记 OA 的密码了"),
    ("键盘坏了，帮我报个公单", "键盘坏了，帮我报个工单"),
    ("帮我设个提型，周五交周报", "帮我设个提醒，周五交周报"),
])
def test_a_one_character_slip_of_a_lexicon_word_is_read_as_the_word(typed, meant):
    assert heard(typed) == meant


@pytest.mark.parametrize("text", [
    "37.5 摄氏度是多少华氏度",  # 氏 is zhi only in old names: a rare reading is no slip
    "客户说下单三天了都没收到",  # 说 is yue in classical texts, not under a keyboard
    "下周找个时间碰一下预算",  # 下预 sounds like 下雨, but 下 alone is no anchor
    "趁现在跌了帮我买点 BTC",  # 买点 / 卖点: the kept 点 is too common to anchor on
    "translate this into French",  # no Chinese: untouched
    "帮我把这段话翻译成英文",  # nothing misspelt
])
def test_real_words_rare_readings_and_common_anchors_are_left_alone(text):
    assert heard(text) == text


def test_a_slip_no_longer_costs_a_request_its_capability():
    password = CapabilityText("it.password_reset", "密码重置", "重置或找回账号密码。")
    others = [CapabilityText("it.helpdesk", "IT 报修", "OA 等办公系统出了故障，提交报修工单。"),
              CapabilityText("doc.summarize", "文档摘要", "把长文档压缩成几条要点。")]
    index = IntentIndex([password, *others])  # words only: the slip is the whole question
    match = index.match("OA 的蜜码过期了")
    assert match.best is not None and match.best.capability_id == "it.password_reset", \
        match.ranked
