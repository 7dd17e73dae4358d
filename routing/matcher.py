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

import numpy as np

from routing.text import TO_LANGUAGE, clauses, features, normalise, stem, words

EXACT_SCORE = 1.0
LEXICAL_WEIGHT = 0.5
SEMANTIC_WEIGHT = 0.2
DEFAULT_THRESHOLD = 0.05

# How much each kind of feature counts: lexicon concepts say most about what
# is wanted; whole words and Chinese bigrams carry meaning; trigrams and single
# characters only rescue typos and odd splits.
_KIND_WEIGHT = {"w": 1.0, "t": 0.1, "c": 1.0, "k": 4.0}
_CJK_UNIGRAM_WEIGHT = 0.3
# A declared keyword found in the request: strong evidence, the way an agent
# team means it when it lists the keyword. Per distinct keyword, capped.
KEYWORD_BONUS = 0.05
KEYWORD_BONUS_CAP = 0.5
# A request for output in a named language ("…in English", "翻成日文") is
# served by capabilities that declare translation directions; the others
# keep only this share of their lexical score.
OTHER_LANGUAGE_PENALTY = 0.7
COVER_SHARE = 0.45
STEP_SHARE = 0.4
UNKNOWN_CJK_BIGRAM = 0.2
# Matches kept per request: the ranked list a dry run shows, and the pool a
# covering capability is looked for in.
MAX_CANDIDATES = 50
BM25_K1 = 1.2
BM25_B = 0.75


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
    # Declares translation directions: it answers "in <language>" requests.
    changes_language: bool = False

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
        docs = []
        for c in capabilities:
            doc = features(c.document())
            if c.changes_language:
                doc[TO_LANGUAGE] += 2
            docs.append(doc)
        df: Counter = Counter()
        for doc in docs:
            df.update(doc.keys())
        n = len(docs)
        # BM25's idf, floored so a feature in every document still counts a little.
        self._idf = {
            f: max(0.05, math.log(1 + (n - d + 0.5) / (d + 0.5))) for f, d in df.items()
        }
        self._max_idf = max(self._idf.values(), default=1.0)
        lengths = [sum(doc.values()) for doc in docs]
        average = (sum(lengths) / n) if n else 1.0
        postings: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for index, doc in enumerate(docs):
            norm = BM25_K1 * (1 - BM25_B + BM25_B * lengths[index] / average)
            for f, tf in doc.items():
                # Saturating term frequency, shorter documents favoured: BM25.
                postings[f].append((index, tf * (BM25_K1 + 1) / (tf + norm)))
        # All postings in two flat arrays, each feature a slice of them: a request
        # gathers its features' slices and sums them per document in one bincount.
        self._slices: dict[str, tuple[int, int]] = {}
        flat_docs: list[int] = []
        flat_weights: list[float] = []
        for f, rows in postings.items():
            start = len(flat_docs)
            flat_docs.extend(i for i, _ in rows)
            flat_weights.extend(w for _, w in rows)
            self._slices[f] = (start, len(flat_docs))
        self._flat_docs = np.array(flat_docs, dtype=np.int64)
        self._flat_weights = np.array(flat_weights, dtype=np.float64)
        # Each distinct keyword once, with the capabilities that declare it.
        keyword_docs: dict[tuple[bool, str], list[int]] = defaultdict(list)
        for index, c in enumerate(capabilities):
            for matcher in _keyword_matchers(c.keywords):
                keyword_docs[matcher].append(index)
        # Found by where they start (two characters, or the first word's stem), so a
        # request checks a handful of keywords, not every keyword of every capability.
        self._keywords_by_start: dict[str, list[tuple[bool, str, np.ndarray]]] = (
            defaultdict(list)
        )
        for (cjk, needle), indices in keyword_docs.items():
            start = needle[:2] if cjk else needle.split()[0]
            self._keywords_by_start[start].append(
                (cjk, needle, np.array(indices, dtype=np.int32)))
        self._keeps_language = np.array([not c.changes_language for c in capabilities],
                                        dtype=bool)
        self._speller = Speller(w for c in capabilities for w in words(c.document()))
        self._embedder = embedder
        self._vectors = embedder.embed([c.document() for c in capabilities]) if embedder else None

    def _weight(self, feature: str) -> float:
        return self._idf.get(feature, 0.0) * _kind_weight(feature)

    def lexical(self, text: str) -> dict[int, float]:
        """How much of the request a capability explains, in [0, 1]: the BM25 score of
        the capability against the request's known features, divided by the best
        score any document could reach; plus the keyword bonus, capped at 1.
        Misspelt words are corrected first."""
        text = self._speller.correct(text)
        # A concept named several ways in the request counts for more (capped);
        # any other feature counts once, however often it repeats.
        found = features(text)
        query = {
            f: self._weight(f) * (min(2.5, 1 + 0.5 * (n - 1)) if f[0] == "k" else 1.0)
            for f, n in found.items() if f in self._idf
        }
        # Words no capability knows are part of the request too: they count against
        # every match, so "zxqv plorf" sharing one trigram with a document is no match.
        # Unknown Chinese bigrams count less: many are particles and glue.
        unknown = sum(
            1.0 if f[0] == "w" else UNKNOWN_CJK_BIGRAM
            for f in found if f not in self._idf and (f[0] == "w" or
                                                      (f[0] == "c" and len(f) == 4))
        )
        qnorm = (sum(query.values()) + unknown * self._max_idf) * (BM25_K1 + 1) or 1.0
        if not query:
            return {}
        spans = [self._slices[f] for f in query]
        positions = np.concatenate([np.arange(a, b) for a, b in spans])
        scale = np.repeat(np.fromiter(query.values(), dtype=np.float64, count=len(query)),
                          [b - a for a, b in spans])
        sums = np.bincount(self._flat_docs[positions],
                           weights=self._flat_weights[positions] * scale,
                           minlength=len(self._ids))
        sims = sums / qnorm
        lowered = normalise(text)
        stem_list = [stem(w) for w in words(text)]
        stems = " " + " ".join(stem_list) + " "
        hits = np.zeros(len(self._ids))
        starts = {lowered[i:i + 2] for i in range(len(lowered) - 1)} | set(stem_list)
        seen: set[str] = set()
        for start in starts:
            for cjk, needle, indices in self._keywords_by_start.get(start, ()):
                if needle not in seen and needle in (lowered if cjk else stems):
                    seen.add(needle)
                    hits[indices] += 1
        touched = sums > 0
        sims = np.minimum(1.0, sims + np.minimum(KEYWORD_BONUS_CAP, KEYWORD_BONUS * hits))
        if TO_LANGUAGE in query:
            sims[self._keeps_language] *= OTHER_LANGUAGE_PENALTY
        candidates = np.nonzero(touched & (sims * LEXICAL_WEIGHT >= self.threshold * 0.5))[0]
        if len(candidates) > MAX_CANDIDATES:
            top = np.argpartition(-sims[candidates], MAX_CANDIDATES)[:MAX_CANDIDATES]
            candidates = candidates[top]
        return {int(i): float(sims[i]) for i in candidates}

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
        # A part whose best match is weak next to the others is a detail of its
        # neighbour ("…, 统计每个部门的平均工资" inside a SQL request), not a step.
        strongest = max((r[0].score for r in per_clause if r), default=0.0)
        plan: list[str] = []
        for ranked in per_clause:
            if (ranked and ranked[0].score >= STEP_SHARE * strongest
                    and ranked[0].capability_id not in plan):
                plan.append(ranked[0].capability_id)
        if len(plan) < 2:
            return Match(ranked=tuple(whole), clauses=tuple(parts))
        # One capability that matches every part reasonably well (a fair share of
        # that part's best) is a single step that covers the whole request.
        for candidate in whole[:3]:
            if candidate.capability_id not in plan and all(
                _score_of(r, candidate.capability_id) >= COVER_SHARE * r[0].score
                for r in per_clause if r
            ):
                ranked = (candidate, *[s for s in whole if s is not candidate])
                return Match(ranked=ranked, covered=True, clauses=tuple(parts))
        return Match(ranked=tuple(whole), plan=tuple(plan), clauses=tuple(parts))


def _score_of(ranked: Sequence[Score], capability_id: str) -> float:
    return next((s.score for s in ranked if s.capability_id == capability_id), 0.0)


def index_from_capabilities(
    capabilities: Mapping[str, CapabilityText], **kwargs
) -> IntentIndex:
    return IntentIndex(list(capabilities.values()), **kwargs)


def _keyword_matchers(keywords: Sequence[str]) -> tuple[tuple[bool, str], ...]:
    """``(is_cjk, needle)`` per keyword: CJK keywords match as substrings, others as
    whole stemmed words (so "reviews" finds "review" but "preview" does not)."""
    out = set()
    for keyword in keywords:
        k = normalise(keyword).strip()
        if len(k) < 2:
            continue
        if k.isascii():
            stems = [stem(w) for w in words(k)]
            if stems:
                out.add((False, " " + " ".join(stems) + " "))
        else:
            out.add((True, k))
    return tuple(sorted(out))


class Speller:
    """Corrects a word one edit (or one swap) away from the index's vocabulary.

    Symmetric-delete lookup: every vocabulary word is stored under itself and its
    one-deletion variants; a query word's own variants find candidates in a few
    dict lookups, whatever the vocabulary's size.
    """

    MIN_LENGTH = 5

    def __init__(self, vocabulary) -> None:
        self._vocabulary = {w for w in vocabulary if len(w) >= 4 and w.isalpha()}
        self._deletes: dict[str, set[str]] = defaultdict(set)
        for word in self._vocabulary:
            for variant in _deletions(word):
                self._deletes[variant].add(word)

    def _correct_word(self, word: str) -> str:
        if len(word) < self.MIN_LENGTH or word in self._vocabulary or not word.isalpha():
            return word
        found = set()
        for variant in _deletions(word):
            found |= self._deletes.get(variant, set())
        found = {w for w in found if _one_edit(word, w)}
        return min(found) if len(found) >= 1 else word

    def correct(self, text: str) -> str:
        lowered = normalise(text)
        replaced = {w: self._correct_word(w) for w in set(words(lowered))}
        if all(k == v for k, v in replaced.items()):
            return lowered
        return " ".join(replaced.get(t, t) for t in lowered.split(" "))


def _deletions(word: str) -> set[str]:
    return {word, *(word[:i] + word[i + 1:] for i in range(len(word)))}


def _one_edit(a: str, b: str) -> bool:
    """At most one insertion, deletion, substitution or adjacent swap apart."""
    if a == b:
        return True
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diffs = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diffs) == 1:
            return True
        return len(diffs) == 2 and diffs[1] == diffs[0] + 1 and (
            a[diffs[0]] == b[diffs[1]] and a[diffs[1]] == b[diffs[0]]
        )
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))
