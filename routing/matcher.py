"""Intent matching: which capability (or ordered plan of capabilities) a request means.

Scores, from the field reports: an exact capability id is 1.0; a lexical
(keyword / description) match contributes up to 0.5; semantic similarity
from an optional embedder up to 0.2. A capability below ``threshold`` is not
a match. Lexical matching is TF-IDF cosine over the features of
``routing.text`` (English stems and trigrams, Chinese n-grams), plus a bonus
when a declared keyword appears verbatim in the request.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from routing.text import clauses, features, normalise

EXACT_SCORE = 1.0
LEXICAL_WEIGHT = 0.5
SEMANTIC_WEIGHT = 0.2
DEFAULT_THRESHOLD = 0.05

# How much each kind of feature counts: whole words and Chinese bigrams carry
# meaning; trigrams and single characters only rescue typos and odd splits.
_KIND_WEIGHT = {"w": 1.0, "t": 0.25, "c": 1.0}
_CJK_UNIGRAM_WEIGHT = 0.3
# A declared keyword found verbatim in the request: strong evidence, the way
# an agent team means it when it lists the keyword.
KEYWORD_BONUS = 0.35


def _kind_weight(feature: str) -> float:
    if feature.startswith("c:") and len(feature) == 3:
        return _CJK_UNIGRAM_WEIGHT
    return _KIND_WEIGHT[feature[0]]


class Embedder(Protocol):
    """Maps texts to unit-length vectors; similarity is their dot product."""

    def embed(self, texts: Sequence[str]) -> list[Sequence[float]]: ...


@dataclass(frozen=True)
class CapabilityText:
    """What the matcher reads about one capability id."""

    capability_id: str
    display_name: str = ""
    description: str = ""
    keywords: tuple[str, ...] = ()

    def document(self) -> str:
        name = self.capability_id.replace(".", " ").replace("_", " ").replace("-", " ")
        # Names and keywords are what a team chose to be found by: counted twice.
        return " ".join([name, name, self.display_name, self.display_name,
                         " ".join(self.keywords), " ".join(self.keywords), self.description])


@dataclass(frozen=True)
class Score:
    capability_id: str
    score: float
    exact: float = 0.0
    lexical: float = 0.0
    semantic: float = 0.0


@dataclass(frozen=True)
class Match:
    """The matcher's answer. ``plan`` has two or more ids when the request asks for several
    things in order and no single capability covers them; else it is empty and ``ranked``
    (best first, above threshold) says which capability is meant."""

    ranked: tuple[Score, ...]
    plan: tuple[str, ...] = ()
    covered: bool = False  # a multi-part request that one capability covers
    clauses: tuple[str, ...] = field(default=())

    @property
    def best(self) -> Score | None:
        return self.ranked[0] if self.ranked else None


class IntentIndex:
    """An inverted index over capability texts. Build once per route table; read-only."""

    def __init__(
        self,
        capabilities: Sequence[CapabilityText],
        *,
        embedder: Embedder | None = None,
        threshold: float = DEFAULT_THRESHOLD,
    ) -> None:
        self.threshold = threshold
        self._ids = [c.capability_id for c in capabilities]
        self._id_set = frozenset(self._ids)
        docs = [features(c.document()) for c in capabilities]
        df: Counter = Counter()
        for doc in docs:
            df.update(doc.keys())
        n = len(docs)
        self._idf = {f: math.log((n + 1) / (d + 1)) + 1.0 for f, d in df.items()}
        self._postings: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self._norms = []
        for index, doc in enumerate(docs):
            weights = {f: self._weight(f, tf) for f, tf in doc.items()}
            self._norms.append(math.sqrt(sum(w * w for w in weights.values())) or 1.0)
            for f, w in weights.items():
                self._postings[f].append((index, w))
        self._keywords = [
            tuple({normalise(k) for k in c.keywords if len(k.strip()) >= 2}) for c in capabilities
        ]
        self._embedder = embedder
        self._vectors = embedder.embed([c.document() for c in capabilities]) if embedder else None

    def _weight(self, feature: str, tf: int) -> float:
        return (1.0 + math.log(tf)) * self._idf.get(feature, 0.0) * _kind_weight(feature)

    def lexical(self, text: str) -> dict[int, float]:
        """Cosine similarity in [0, 1] to every capability sharing a feature with ``text``,
        plus the keyword bonus, capped at 1."""
        query = {f: self._weight(f, tf) for f, tf in features(text).items() if f in self._idf}
        qnorm = math.sqrt(sum(w * w for w in query.values())) or 1.0
        sums: dict[int, float] = defaultdict(float)
        for f, qw in query.items():
            for index, dw in self._postings[f]:
                sums[index] += qw * dw
        lowered = normalise(text)
        out = {}
        for index, dot in sums.items():
            sim = dot / (qnorm * self._norms[index])
            if any(k in lowered for k in self._keywords[index]):
                sim += KEYWORD_BONUS
            out[index] = min(1.0, sim)
        return out

    def scores(self, text: str) -> list[Score]:
        """Every capability at or above the threshold, best first."""
        stripped = text.strip()
        lexical = self.lexical(stripped)
        semantic: dict[int, float] = {}
        if self._vectors is not None:
            (q,) = self._embedder.embed([stripped])
            semantic = {
                i: max(0.0, sum(a * b for a, b in zip(q, v, strict=True)))
                for i, v in enumerate(self._vectors)
            }
        out = []
        for index in set(lexical) | set(semantic):
            lex, sem = lexical.get(index, 0.0), semantic.get(index, 0.0)
            total = LEXICAL_WEIGHT * lex + SEMANTIC_WEIGHT * sem
            if total >= self.threshold:
                out.append(Score(self._ids[index], round(total, 6), 0.0, lex, sem))
        if stripped in self._id_set:
            out = [s for s in out if s.capability_id != stripped]
            out.append(Score(stripped, EXACT_SCORE, EXACT_SCORE))
        out.sort(key=lambda s: (-s.score, s.capability_id))
        return out

    def match(self, text: str) -> Match:
        whole = self.scores(text)
        parts = clauses(text)
        if len(parts) < 2:
            return Match(ranked=tuple(whole), clauses=(text,))
        per_clause = [self.scores(p) for p in parts]
        plan: list[str] = []
        for ranked in per_clause:
            if ranked and ranked[0].capability_id not in plan:
                plan.append(ranked[0].capability_id)
        if len(plan) < 2:
            return Match(ranked=tuple(whole), clauses=tuple(parts))
        # One capability that matches every part nearly as well as that part's
        # best is the single step that covers the request.
        for candidate in whole[:5]:
            if candidate.capability_id in plan:
                continue
            if all(_score_of(r, candidate.capability_id) >= 0.5 * r[0].score
                   for r in per_clause if r):
                ranked = (candidate, *[s for s in whole if s is not candidate])
                return Match(ranked=ranked, covered=True, clauses=tuple(parts))
        return Match(ranked=tuple(whole), plan=tuple(plan), clauses=tuple(parts))


def _score_of(ranked: Sequence[Score], capability_id: str) -> float:
    return next((s.score for s in ranked if s.capability_id == capability_id), 0.0)


def index_from_capabilities(
    capabilities: Mapping[str, CapabilityText], **kwargs
) -> IntentIndex:
    return IntentIndex(list(capabilities.values()), **kwargs)
