"""Text features for lexical matching, for English and Chinese alike.

English: lower-cased word tokens, lightly stemmed, plus character trigrams of
each word (so "transalte" still shares most trigrams with "translate").
Chinese (and other CJK runs): character unigrams and bigrams; no segmenter
is needed because bigrams capture most two-character words and a request's
stray bigram ("把这", "一下") is down-weighted by IDF. Pure functions.
"""

from __future__ import annotations

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


def normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower()


def features(text: str) -> Counter:
    """The bag of features of ``text``: ``w:`` stems, ``t:`` trigrams, ``c:`` CJK n-grams."""
    text = normalise(text)
    out: Counter = Counter()
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


# Where a request asks for two things in order. Longest first, so "然后再" wins over "再".
_SPLITTERS = re.compile(
    r"(?:然后再|然后|之后再|之后|接着|随后|完了再|以后再|最后再|顺便|顺便再|并且|同时"
    r"|(?<![合兼吞归])并(?=[把将翻发生总提转做写给])|再(?=[把将帮给用发翻转做写生总提])"
    r"|\band then\b|\bthen\b|\bafter that\b|\bafterwards\b|\band also\b"
    r"|\bfollowed by\b|\bplus\b|\band(?= (?:email|send|translate|summari[sz]e|"
    r"draft|make|create|generate|turn|convert|put|post|book|schedule|check|tell|give|"
    r"extract|save|file|share|write)\b)|[;；])",
    re.IGNORECASE,
)


def clauses(text: str) -> list[str]:
    """Split a request at sequencing words; returns ``[text]`` when there is nothing to split."""
    parts = [p.strip(" ,，。.!！?？") for p in _SPLITTERS.split(text)]
    return [p for p in parts if p] or [text]
