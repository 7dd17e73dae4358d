"""Text features for lexical matching, for English and Chinese alike.

English: lower-cased word tokens, lightly stemmed, plus character trigrams of
each word (so "transalte" still shares most trigrams with "translate").
Chinese (and other CJK runs): character unigrams and bigrams; no segmenter
is needed because bigrams capture most two-character words and a request's
stray bigram ("把这", "一下") is down-weighted by IDF. Pure functions.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter

_WORD = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")

# Words that say nothing about which capability is meant.
STOPWORDS = frozenset(
    """a an the this that these those to of for in on at by with from into and or but
    please pls plz can could would you u me my i we our us it its is are be was were do
    does did will just some any all get got want need help let make give also then
    hey hi yo thanks thx ok okay so very really about as if via per up out""".split()
)
# Chinese function characters: dropped as unigrams, kept inside bigrams.
CJK_STOP = frozenset("的了吗呢吧啊呀么我你他她它们这那个一下把给帮请就再和与及并也都在是有要")

_SUFFIXES = ("ations", "ation", "ings", "ing", "ies", "ied", "ed", "es", "er", "ly", "s")


def stem(word: str) -> str:
    """A deliberately small stemmer: enough to join translate/translation/translating."""
    for suffix in _SUFFIXES:
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            base = word[: -len(suffix)]
            if suffix in ("ies", "ied"):
                return base + "y"
            return base
    if len(word) > 4 and word.endswith("e"):
        return word[:-1]
    return word


# Addresses are parameters of a request, not its meaning: "send it to legal@corp.com"
# is about sending an email, not about legal matters. Each is read as what it is.
_EMAIL_ADDRESS = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_LINK = re.compile(r"\bhttps?://\S+|\bwww\.\S+")


def without_addresses(text: str) -> str:
    """``text`` with each email address read as "email address" and each link as "link"."""
    if "@" in text:
        text = _EMAIL_ADDRESS.sub(" email address ", text)
    if "http" in text or "www." in text:
        text = _LINK.sub(" link ", text)
    return text


def normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower()



# On their own these ask for nothing: greetings, assent, hesitation, a test ping. With
# ``STOPWORDS`` and ``CJK_STOP`` they make the requests no capability can be chosen by.
# Generic actions too ("run", "check", "查一下", "执行"): they say to act, not on what.
# Alone they drew any vaguely described capability ("TBD") at 0.5–0.8, and one feedback
# of "go" taught a capability every "go" (helper-45).
_FILLER_WORDS = frozenset(
    """hello yes yeah yep no nope hmm hm um uh ah oh lol test testing ping again now
    here there what how why something anything stuff thing things
    go run check execute start begin proceed continue process handle look see try done
    finish perform work use launch action task job request
    ahead whatever another one more else same usual anyway""".split())
_FILLER_CJK = frozenset("嗯啊哦噢呃哈嘿喂唉诶哎好行对然后测试谢什么怎样呗嘛弄搞"
                        "查看做办执运处理开始继续跑用随便忙")
_ASCII_WORD = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?")


@functools.lru_cache(maxsize=4096)
def asks_for_something(text: str) -> bool:
    """Whether ``text`` holds a word a capability could be chosen by. Filler ("the",
    "ok", "嗯", "然后", "???", a lone number or emoji) says nothing, and no score can make
    it a request: a break test's "the" went to a localisation agent at 0.78 confidence
    (its meaning-score, 0.2 for any short text against a short description, was enough).
    A lone Latin letter says nothing either ("x"); a letter of another script counts:
    the sentence encoder reads many languages."""
    text = normalise(text)
    for word in _ASCII_WORD.findall(text):
        if not (len(word) < 2 or word in STOPWORDS or word in _FILLER_WORDS
                or word.isdigit()):
            return True
    rest = _ASCII_WORD.sub(" ", text)
    letters = [ch for ch in rest if unicodedata.category(ch).startswith("L")
               and ch not in CJK_STOP and ch not in _FILLER_CJK]
    # One letter of an alphabet says nothing ("Ж", "é"; helper-46 taught a capability
    # "Ж"); one ideograph may be a word ("税").
    return len(letters) > 1 or (len(letters) == 1 and _CJK.fullmatch(letters[0]) is not None)

_PHRASE_TRIM = " \t.,;:!?…。，；：！？、\"'“”‘’()（）"


def phrase_of(text: str) -> str:
    """``text`` as a learned phrase is kept (``registry.learning``) and a request is
    compared with one: NFKC, case-folded, runs of white space as one space, punctuation
    trimmed from the ends, and no format characters (a break test's "\u202egist of memo"
    was shown reversed in the admin). Empty when nothing is left."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    if folded.isascii():
        return " ".join(folded.split()).strip(_PHRASE_TRIM)
    # "İ" folds to "i" and a combining dot: the phrase typed "I" or "i" is the same word.
    folded = "".join(c for c in folded.replace("i\u0307", "i")
                     if unicodedata.category(c) != "Cf")
    folded = " ".join(folded.split())
    start, end = 0, len(folded)
    while start < end and _trimmed(folded[start]):
        start += 1
    while end > start and _trimmed(folded[end - 1]):
        end -= 1
    return folded[start:end]


def _trimmed(char: str) -> bool:
    # ASCII: the listed marks only ("c#" keeps its "#"); else any punctuation ("¿", "」").
    return char in _PHRASE_TRIM or (not char.isascii()
                                    and unicodedata.category(char).startswith("P"))


# What a description says its capability does not do: "it does not translate", "不会发送",
# "会议室预订由会议室服务负责". Such a clause names a neighbour's job; read as the
# capability's own words it drew that neighbour's requests (the order-status
# description that pulled parcel-tracking requests).
_DISCLAIMER = re.compile(
    r"\b(?:does not|doesn't|do not|don't|cannot|can't|will not|won't|never|is not|isn't|"
    r"not for|handled by|instead|please use|use the|use our)\b"
    r"|不会|不支持|不负责|不提供|不处理|不做|不涉及|不用于|不适用|不受理|不办理|不能|无法|不包括|"
    r"不含|请用|请使用|请找|请转|由.{1,12}负责",
    re.IGNORECASE)
# Where a clause ends: after a stop, a semicolon or a Chinese comma, after an ASCII stop
# or comma that a space follows ("20,000" and "v1.2" are not ends), and before "but".
_CLAUSE_END = re.compile(r"[;!?。；！？，]|[.,](?=\s|$)|(?=\sbut\b)")


def without_disclaimers(description: str) -> str:
    """``description`` without the clauses that say what the capability does not do;
    the rest as written."""
    return _split_disclaimers(description)[0]


def disclaimers(description: str) -> list[str]:
    """The clauses of ``description`` that say what the capability does not do: what
    it is not for, as a ``not_for`` hint says it."""
    return _split_disclaimers(description)[1]


def _split_disclaimers(description: str) -> tuple[str, list[str]]:
    if not _DISCLAIMER.search(description):
        return description, []
    ends = [m.end() for m in _CLAUSE_END.finditer(description)]
    kept, said_not, start = [], [], 0
    for end in [*ends, len(description)]:
        clause = description[start:end]
        (said_not if _DISCLAIMER.search(clause) else kept).append(clause)
        start = end
    return "".join(kept).strip(), [c.strip() for c in said_not if c.strip()]


_LANGUAGES = (
    r"english|chinese|mandarin|cantonese|japanese|korean|french|german|spanish|russian|"
    r"italian|portuguese|arabic|thai|vietnamese"
)
_CJK_LANGUAGES = (
    r"中文|英文|日文|韩文|法文|德文|英语|日语|韩语|法语|德语|西班牙语|俄语|汉语|粤语|简体|繁体"
)
# A request for output in a language: "into Japanese", "翻成英文", "用中文", "日语怎么说".
_TO_LANGUAGE = re.compile(
    rf"\b(?:in|into|to|as)\s+(?:simplified\s+|traditional\s+|plain\s+)?(?:{_LANGUAGES})\b"
    rf"|(?:成|为|用|到)(?:{_CJK_LANGUAGES})|(?:{_CJK_LANGUAGES})(?:怎么说|版|summary|摘要|要点)"
    rf"|\b(?:{_LANGUAGES})\s+(?:version|summary|translation)\b"
)
TO_LANGUAGE = "k:to_language"


def wants_other_language(text: str) -> bool:
    return bool(_TO_LANGUAGE.search(normalise(text)))


def words(text: str) -> list[str]:
    return [w for w in _WORD.findall(normalise(text)) if w not in STOPWORDS]


def _concept_needles() -> tuple[tuple[str, bool, str], ...]:
    from routing.lexicon import CONCEPTS

    out = []
    for concept, forms in CONCEPTS.items():
        for form in forms:
            form = normalise(form)
            if form.isascii():
                out.append((concept, False, " " + " ".join(stem(w) for w in
                                                           _WORD.findall(form)) + " "))
            else:
                out.append((concept, True, form))
    return tuple(out)


_NEEDLES: tuple[tuple[str, bool, str], ...] | None = None


def concepts(text: str) -> Counter:
    """The lexicon concepts ``text`` mentions, each with how many of its forms appear
    (see ``routing.lexicon``)."""
    global _NEEDLES
    if _NEEDLES is None:
        _NEEDLES = _concept_needles()
    text = normalise(text)
    stems = " " + " ".join(stem(w) for w in _WORD.findall(text)) + " "
    return Counter(c for c, cjk, needle in _NEEDLES if needle in (text if cjk else stems))


def features(text: str) -> Counter:
    """The bag of features of ``text``: ``w:`` stems, ``t:`` trigrams, ``c:`` CJK n-grams,
    ``k:`` lexicon concepts, and ``k:to_language`` when it asks for a named language."""
    text = normalise(text)
    out: Counter = Counter()
    if _TO_LANGUAGE.search(text):
        out[TO_LANGUAGE] += 1
    for concept, forms in concepts(text).items():
        out["k:" + concept] += forms
    for word in _WORD.findall(text):
        if word in STOPWORDS:
            continue
        stemmed = stem(word)
        out["w:" + stemmed] += 1
        if len(word) >= 4 and not word.isdigit():
            padded = f"^{word}$"
            for i in range(len(padded) - 2):
                out["t:" + padded[i : i + 3]] += 1
    for run in _CJK.findall(text):
        for ch in run:
            if ch not in CJK_STOP:
                out["c:" + ch] += 1
        for i in range(len(run) - 1):
            out["c:" + run[i : i + 2]] += 1
    return out


# "2024-01-01 之后", "三天以后": after a time is a when, not a next step (a tuning request
# "查 2024-01-01 之后 GMV 超过 10 万的 SKU" became a plan of two).
_TIME_MARK = r"[\d日号月年点天周时分秒]"  # what a time ends with: "2024-01-01", "三天", "5 号"
_NOT_AFTER_A_TIME = rf"(?<!{_TIME_MARK})(?<!{_TIME_MARK}\s)"
# Where a request asks for two things in order. Longest first, so "然后再" wins over "再".
_EN_VERBS = (
    r"summari[sz]e|translate|email|e-mail|send|write|draft|make|create|generate|turn|convert|"
    r"put|post|book|schedule|check|extract|save|file|share|search|find|estimate|"
    r"calculate|draw|plot|chart|classify|submit|review|redact|transcribe"
)
_ZH_VERBS = r"翻译|总结|概括|发|写|生成|画|统计|提取|整理|搜|查|算|做|约|提交|再"
_SPLITTERS = re.compile(
    r"(?:然后再|然后|" + _NOT_AFTER_A_TIME + r"(?:之后再|之后|以后再)"
    r"|接着|随后|完了再|最后再|最后(?=[把将帮给用发翻转做写生总提画统查订约退])|顺便再|顺便|并且"
    r"|同时|另外|(?<=的话)"
    r"|(?<![合兼吞归])并(?=[把将翻生总提转做写给])"
    rf"|(?<!{_TIME_MARK}[之以]后)再(?=[把将帮给用发翻转做写生总提画统查订约退])"
    rf"|[，,]\s*(?:(?:不过|但是|但|可是)\s*)?(?=(?:{_ZH_VERBS}|首先|先))"
    rf"|,\s*(?=(?:and\s+)?(?:just\s+)?(?:{_EN_VERBS})\b)|,\s*(?:but\s+)?(?=first\b)"
    # What not to do yet is a part of its own (and no step): "…but don't refund yet",
    # "…，但先不要发送". Not a bare "别" or "never": "别那么官方" (less formal) and "but
    # never got a confirmation" say how or what happened.
    r"|,?\s*\bbut\s+(?=(?:don'?t|do not)\b)|[，,]\s*(?:但是?|可是)?\s*(?=先别|先不要|先不|暂时别)"
    r"|\band then\b|\bthen\b|\bafter that\b|\bafterwards\b|\band also\b|(?<=[.?!,])\s*also\b"
    r"|,?\s*\b(?:and\s+)?finally\b"
    r"|\bonce (?:done|that'?s done|finished)\b|\bwhen (?:done|finished)\b"
    r"|\bfollowed by\b|\bplus\b|\band,?\s+(?=if\b)"
    rf"|\band(?=\s+(?:{_EN_VERBS})\b)|[;；])",
    re.IGNORECASE,
)


# "退款之前先查一下订单状态", "Before refunding, check the order status": the part
# after "before" is done first. Read in the order said, a plan ran the refund first
# (helper-46).
_BEFORE = re.compile(r"^(?P<later>.+?)(?:之前|以前|前)[，,]?\s*(?P<first>先.+)$"
                     r"|^\s*before\s+(?P<later_en>[^,;，；]+)[,;，；]\s*(?P<first_en>.+)$",
                     re.IGNORECASE | re.DOTALL)
# A later part that says it comes first: "如果要退款的话，先查一下订单状态", "…, check
# the status first" — not "先别退款" (don't refund yet: it moved the refund first,
# helper-48), and not in a request that orders its steps itself ("…, then send the
# refund email first", "然后首先…"): there "then" is the order.
_FIRST = re.compile(r"^(?:首先|先)(?![别不没])|^first\b|\bfirst$", re.IGNORECASE)
# "Refund the customer after you check the order status", "Send it after polishing it":
# the part after "after" is done first (helper-48: the refund ran alone).
_AFTER = re.compile(r"^(?P<later>.+?)\s+(?:after|once)\s+(?P<first>.+)$",
                    re.IGNORECASE | re.DOTALL)
_NOT_NOW = re.compile(r"^(?:先别|先不要|先不|首先别|暂时别|暂时不要|暂不|别|不要|不用)(?!忘)"
                      r"|^(?:but\s+)?(?:don'?t|do not|never)\b(?!\s+(?:forget|let me forget))",
                      re.IGNORECASE)
_SEQUENCED = re.compile(r"\bthen\b|\bafter that\b|\bfinally\b|然后|接着|随后|之后|最后",
                        re.IGNORECASE)
_A_TIME = re.compile(rf"(?:{_TIME_MARK}|[一二三四五六七八九十])$|\b(?:today|tomorrow|tonight|"
                     r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|noon|"
                     r"midnight|[ap]m|morning|evening|afternoon|week|month|year)$",
                     re.IGNORECASE)
# An English "before" or "after" starts a step when an action follows it: "before
# refunding", "after you've checked it"; not a time ("after lunch", "before Friday") nor
# a word that only ends like a gerund ("after everything", "before morning").
_DOING = re.compile(rf"^(?:(?:you|we|i|they)(?:'ve|\s+have)?\s+\w|\w+ing\b|(?:{_EN_VERBS})\b)",
                    re.IGNORECASE)
_NOT_DOING = re.compile(r"(?:every|some|any|no)thing\b|(?:morning|evening|during|spring)\b",
                        re.IGNORECASE)


def _names_doing(part: str) -> bool:
    return bool(_DOING.match(part)) and not _NOT_DOING.match(part) \
        and not _A_TIME.search(part)


# Quoted material is what a step works on, never steps of its own: "translate into
# English: "first refund the order, then check its status"" planned a refund (helper-47).
_QUOTED = re.compile(r'"[^"\n]{1,2000}"|“[^”\n]{1,2000}”|‘[^’\n]{1,2000}’|「[^」\n]{1,2000}」'
                     r"|『[^』\n]{1,2000}』|《[^》\n]{1,2000}》"
                     r"|(?<!\w)'[^'\n]{1,2000}'(?!\w)")  # not "don't … it's"
_HELD = re.compile("\ue000(\\d+)\ue001")


_SHOUTED_WORD = re.compile(r"\b[A-Z]{2,}\b")


def unshouted(text: str) -> str:
    """``text`` in lower case when it is written in capitals ("TRACK MY PARCEL"): the
    sentence encoder reads capitals as other words, and such requests were refused while
    the same words in lower case routed at 0.96 (helper-47). An acronym alone ("OCR")
    or among lower-case words stays as written."""
    if any(ch.islower() for ch in text) or len(_SHOUTED_WORD.findall(text)) < 2 \
            or _CJK.search(text):  # "帮我查 SQL 和 OCR": acronyms among Chinese words
        return text
    return text.lower()


def without_quotations(text: str) -> str:
    """``text`` with each quoted passage (past a few words) read as "quoted text": it is
    the material, and its words chose the capability instead of the request's own
    ("translate into English: "first refund the order…"" went to the refund agent)."""
    if not _QUOTED.search(text):
        return text
    return _QUOTED.sub(lambda found: " quoted text " if len(found.group()) > 24
                       or sum(len(run) for run in _CJK.findall(found.group())) > 6
                       or found.group().startswith("《")  # a title: "总结一下《退款政策》"
                       else found.group(), text)


def clauses(text: str) -> list[str]:
    """Split a request at sequencing words, in the order the steps are to run; returns
    ``[text]`` when there is nothing to split.

    A fragment too short to ask for anything ("写完", "ok") joins its neighbour."""
    quoted: list[str] = []

    def hold(found: re.Match) -> str:
        quoted.append(found.group())
        return f"\ue000{len(quoted) - 1}\ue001"

    # The marks are private-use characters: a text holding them already is split as it
    # is (restoring would read its own marks as quotes: an IndexError, a 500).
    masked = _QUOTED.sub(hold, text) \
        if _QUOTED.search(text) and "\ue000" not in text and "\ue001" not in text else text
    parts = _ordered(masked)
    if not quoted:
        return parts
    return [_HELD.sub(lambda found: quoted[int(found.group(1))], part) for part in parts]


def _ordered(text: str) -> list[str]:
    after = _AFTER.match(text)
    if after is not None and _names_doing(after["first"]):
        return _in_order(after["first"]) + _in_order(after["later"])
    before = _BEFORE.match(text)
    if before is not None:
        first = before["first"] or before["first_en"]
        later = before["later"] or before["later_en"]
        if (not _A_TIME.search(later)) if before["later"] else _names_doing(later):
            return _in_order(first) + _in_order(later)
        # Before a time or an event ("周五之前先…", "before Friday, …", "before the
        # meeting, make slides") is when, not a step: "the meeting" was matched as one.
        return _in_order(first)
    # A part that says not to do something is no step ("查一下订单状态，先别退款": the
    # refund was a step of the plan, helper-48); "别忘了…" asks for a reminder.
    parts = [part for part in _in_order(text) if not _NOT_NOW.match(part)] or [text]
    if _SEQUENCED.search(text):
        return parts
    marked = [i for i, part in enumerate(parts) if _FIRST.search(part)]
    if marked and marked[0] > 0:
        parts.insert(0, parts.pop(marked[0]))
    return parts


PART_TRIM = " ,，。.!！?？"


def _in_order(text: str) -> list[str]:
    out: list[str] = []
    for part in (p.strip(PART_TRIM) for p in _SPLITTERS.split(text)):
        if not part:
            continue
        if (out and _too_short(part)) or (out and _too_short(out[-1])):
            out[-1] = f"{out[-1]} {part}"
        else:
            out.append(part)
    return out or [text]


_ACTION = re.compile(rf"(?:{_ZH_VERBS}|翻|译|订|约|提醒|转|画|审|报|识别|查)"
                     rf"|\b(?:{_EN_VERBS}|remind|book|order|print|ship)\b", re.IGNORECASE)


def _names_a_job(part: str) -> bool:
    return bool(_ACTION.search(normalise(part)) or concepts(part))


def asks_to_do(part: str) -> bool:
    """Whether a part of a request asks for a job to be done: it names an action or a job
    the lexicon knows, and says on what. "我刚开完会" (I just came out of a meeting)
    tells; "麻烦你了", "帮我个忙", "Please help me" (helper-48: each refused the request
    after it) are politeness; "book a meeting with Alice" asks."""
    return asks_for_something(part) and _names_a_job(part)


def _too_short(part: str) -> bool:
    """Too short to be a step: a few characters that name no action ("写完", "ok");
    "发给 Tom" or "then send it" name one and stay a step, and so does a job the lexicon
    knows ("然后退款": glued to the part before it, "先查询订单状态，然后退款" was one
    step, the refund, helper-47)."""
    cjk = sum(len(run) for run in _CJK.findall(part))
    if cjk >= 4 or len(_WORD.findall(normalise(part))) >= 2:
        return False
    return not _names_a_job(part)


# Control characters other than tab and line breaks: no request holds them, and kept
# (feedback rows, the admin's list of misses, log lines) an escape sequence would paint
# a terminal or hide the text around it.
# Bidirectional overrides and isolates too: "\u202erefund" shows reversed ("Trojan
# source"), in a log line or the admin's list of misses (helper-47).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def holds_control(text: str) -> bool:
    return _CONTROL.search(text) is not None


# Letters and symbols drawn as nothing or standing for nothing: the Hangul fillers, the
# blank braille cell, the object-replacement and replacement characters.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800\ufffc\ufffd")
# Format, control, lone marks, unassigned and noncharacters, private use, surrogates,
# and modifier symbols and letters (a skin tone, "ˆ" alone): nothing a request can say.
_SAY_NOTHING = frozenset({"Cf", "Cc", "Mn", "Me", "Cn", "Co", "Cs", "Sk", "Lm"})


def says_nothing(text: str) -> bool:
    """Whether ``text`` is only spaces and characters drawn as nothing: format characters
    (zero-width spaces, joiners, a BOM), controls, marks with nothing to mark (variation
    selectors, lone accents) and blank letters. Nothing to match, nothing to learn (a
    break test taught the router an intent of three zero-width spaces; its re-test, of
    Hangul fillers, a blank braille cell, variation selectors and lone accents; the next,
    noncharacters and private-use characters, routed with a confidence of 0.99)."""
    return all(ch.isspace() or ch in _BLANK_LETTERS
               or unicodedata.category(ch) in _SAY_NOTHING for ch in text)
