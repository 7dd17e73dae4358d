"""Intent matching: which capability (or ordered plan of capabilities) a request means.

An exact capability id scores 1.0. Otherwise, with the sentence encoder (the default,
``routing.embedders``), a capability scores its calibrated semantic similarity to the
request (``routing.semantic``: its best units, read against everyday requests and
against the other capabilities written in its language) plus 0.3 x its lexical match,
minus a push when the request is closer to one of its "not for" hints; without the
encoder, half its lexical match. Lexical matching is BM25 over the features of
``routing.text`` (English stems and trigrams, Chinese n-grams, lexicon concepts), plus
a bonus when a declared keyword appears verbatim. A capability below ``threshold`` is
not a match; the best match carries a confidence and its margin to the runner-up.
Weights and thresholds were chosen on the tuning set of ``bench/routing.py`` only.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from immutables import Map

from routing.semantic import Vectors, background_floor, hub_of, negatives, units
from routing.text import (
    PART_TRIM,
    TO_LANGUAGE,
    asks_for_something,
    asks_to_do,
    clauses,
    disclaimers,
    features,
    normalise,
    phrase_of,
    stem,
    unshouted,
    without_addresses,
    without_disclaimers,
    without_quotations,
    words,
)
from routing.typos import heard

EXACT_SCORE = 1.0
# Without an embedder a score is half the lexical match, and 0.05 is enough.
LEXICAL_WEIGHT = 0.5
DEFAULT_THRESHOLD = 0.05
# With one, the calibrated semantic similarity leads and words add to it. Weights and
# threshold were chosen on the tuning set only (``bench/routing.py``): the threshold as
# the highest that wrongly refuses at most 3 % of its answerable requests.
SEMANTIC_LEXICAL_WEIGHT = 0.3
SEMANTIC_THRESHOLD = 0.19
# A request closer to a capability's "not for" hint than to anything it is for loses
# this much per unit of the difference, plus the base: enough to drop below another.
# How far a catalogue's texts sit from everyday requests (``hub_of``, mean over the
# visible texts) moves its bar: ``HUB_REFERENCE`` is the evaluation catalogue's, with its
# examples, where ``SEMANTIC_THRESHOLD`` was chosen. ``STYLE_WEIGHT`` was chosen on the
# tuning and development sets with that catalogue's examples removed: as few answerable
# requests refused as with them (3 % or so), where 25 % were.
STYLE_WEIGHT = 2.0
HUB_REFERENCE = 0.105
HUB_PRIOR = 10
NEGATIVE_WEIGHT = 2.0
NEGATIVE_BASE = 0.1
# A tenant's learned phrase (``routing feedback``) this close to the request counts as
# one of the capability's own texts, with a bonus: the tenant said so.
LEARNED_SIMILARITY = 0.75
LEARNED_LEXICAL_OVERLAP = 0.6
LEARNED_BONUS = 0.15
LEXICAL_SHORTLIST = 64
# A plan has at most this many steps: each part is matched on its own, and a request of
# hundreds of parts would hold a gateway's event loop for half a second.
MAX_STEPS = 5
# Two matches closer than this are a coin toss: a caller may ask to confirm.
AMBIGUITY_MARGIN = 0.03
# Confidence is the chance the decision is right: a logistic of the best score (against
# the default threshold, so an operator's own threshold moves no probability) and its
# lead over the runner-up (capped: past it a lead says no more), fitted on the tuning set
# (bench/routing.py --calibrate). Per matcher, as their scores differ in scale:
# (intercept, per score, per lead). Measured on the development set, never fitted on it:
# mean confidence 0.81 against 0.78 right (expected calibration error 0.044; the
# logistic of the score alone had 0.95 against 0.78, error 0.165); words only 0.63
# against 0.65 (0.070; was 0.214).
CALIBRATION = {"semantic": (-0.591, 9.243, 3.051), "lexical": (-1.240, 8.198, 12.541)}
CALIBRATION_LEAD_CAP = 0.3

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
# One capability scoring at least this share of every part's best covers the whole
# request (no plan); parts whose best is the same capability may take another that
# scores this share of their best (``_distinct_steps``). Both chosen on the tuning set.
COVER_SHARE = 0.7
REPEAT_SHARE = 0.8
# A later step that names its action but not its object ("然后发给 Tom") scores below the
# threshold everywhere; its closest capability is taken when it scores at least
# ``STEP_FLOOR`` and leads the next by ``STEP_LEAD``. Chosen on the tuning set (plans
# 0.613 -> 0.645, nothing else moved; any floor from 0.04 to 0.08 gave the same).
STEP_FLOOR = 0.08
STEP_LEAD = 0.06
UNKNOWN_CJK_BIGRAM = 0.2
# What of a request the sentence encoder reads (its words are all matched): its cost grows
# with the text, and a unique 1,000-character Chinese intent took some 150 ms of the event
# loop (a break test saw another tenant's calls wait that long). The labelled requests
# are at most 153 characters.
EMBEDDED_CHARS = 300
# Matches kept per request: the ranked list a dry run shows, and the pool a
# covering capability is looked for in.
MAX_CANDIDATES = 50
BM25_K1 = 1.2
BUILD_SLICE = 256  # capability texts added at a time when an index is built
BM25_B = 0.75
# Postings whose BM25 weights an index keeps worked out (``IntentIndex._bm25``): a float
# each, so at most 8 MB per index in use (a 10,000-capability index has 2.2 M postings;
# a request's features reach some 36,000 of them, most of which every request shares).
BM25_CACHE = 1_000_000


def _kind_weight(feature: str) -> float:
    if feature.startswith("c:") and len(feature) == 3:
        return _CJK_UNIGRAM_WEIGHT
    return _KIND_WEIGHT[feature[0]]


class Embedder(Protocol):
    """Maps texts to unit-length vectors of ``dimensions``; similarity is their dot
    product. ``routing.embedders`` has the real one."""

    dimensions: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class CapabilityText:
    """What the matcher reads about one capability id, as one tenant wrote it (``owner``)
    when several tenants offer the id: a tenant's hints (examples, what it is not for)
    must steer no other tenant's routing. ``owner`` None: one text for the id."""

    capability_id: str
    display_name: str = ""
    description: str = ""
    keywords: tuple[str, ...] = ()
    # Declares translation directions: it answers "in <language>" requests.
    changes_language: bool = False
    # Requests the team expects (A2A skills' ``examples``), and what it is not for
    # ("parcel tracking (use logistics.track)"): the second pushes matches away.
    examples: tuple[str, ...] = ()
    not_for: tuple[str, ...] = ()
    owner: int | None = None

    @property
    def key(self) -> str:
        """Its place in an index: the id, or the id and its writer's tenant."""
        return self.capability_id if self.owner is None else f"{self.capability_id}#{self.owner}"

    def units(self) -> list[str]:
        """The short texts it is embedded as (``routing.semantic.units``)."""
        return units(self.display_name, self.keywords, without_disclaimers(self.description),
                     self.examples)

    def counter_units(self) -> list[str]:
        """What it is not for, embedded apart: its ``not_for`` hints and the clauses of
        its description that say what it does not do."""
        return negatives((*self.not_for, *disclaimers(self.description)))

    def document(self) -> str:
        name = self.capability_id.replace(".", " ").replace("_", " ").replace("-", " ")
        # Names and keywords are what a team chose to be found by: counted twice.
        # Examples are how callers will ask; what it is not for never attracts a match.
        return " ".join([name, name, self.display_name, self.display_name,
                         " ".join(self.keywords), " ".join(self.keywords),
                         without_disclaimers(self.description), " ".join(self.examples)])


@dataclass(frozen=True)
class Score:
    capability_id: str
    score: float
    exact: float = 0.0
    lexical: float = 0.0
    semantic: float = 0.0
    negative: float = 0.0
    learned: float = 0.0


@dataclass(frozen=True)
class Match:
    """The matcher's answer. ``plan`` has two or more ids when the request asks for several
    things in order and no single capability covers them; else it is empty and ``ranked``
    (best first, above threshold) says which capability is meant."""

    ranked: tuple[Score, ...]
    plan: tuple[str, ...] = ()
    covered: bool = False  # a multi-part request that one capability covers
    clauses: tuple[str, ...] = field(default=())
    # The closest capabilities below the threshold, when nothing matched: what a refusal
    # suggests instead.
    suggestions: tuple[Score, ...] = ()
    # How sure the best match is, in (0, 1): 0.5 at the threshold. ``margin`` is its lead
    # over the runner-up (its whole score when alone).
    confidence: float = 0.0
    margin: float = 0.0
    # Per step of a plan, its confidence; and the first step's matches (its pick first)
    # with that pick's lead: the step a call runs, so the one a caller may confirm.
    step_confidence: tuple[float, ...] = ()
    first_step: tuple[Score, ...] = ()
    first_margin: float = 0.0

    @property
    def best(self) -> Score | None:
        return self.ranked[0] if self.ranked else None

    @property
    def ambiguous(self) -> bool:
        """Two capabilities both match and nearly tie (for a plan: in its first step,
        the one a call runs): ask rather than guess."""
        ranked, margin = (self.first_step, self.first_margin) if self.plan else \
            (self.ranked, self.margin)
        return len(ranked) > 1 and margin < AMBIGUITY_MARGIN and ranked[0].exact == 0.0

    @property
    def choices(self) -> tuple[Score, ...]:
        """What a confirmation chooses among: the matches of the step a call runs."""
        return self.first_step if self.plan else self.ranked


class IntentIndex:
    """An inverted index over capability texts; read-only.

    ``updated`` makes the index of a changed set of texts from this one: only the
    changed texts are featurised (and embedded), everything else is shared. For that,
    postings keep raw term frequencies: what depends on every document (idf, the average
    length) comes from counts a change adjusts, and BM25 weights are worked out when a
    request is scored. Where a text sits in the index changes no answer, so an updated
    index answers exactly as one built from scratch over the same texts.
    """

    def __init__(
        self,
        capabilities: Sequence[CapabilityText],
        *,
        embedder: Embedder | None = None,
        threshold: float | None = None,
    ) -> None:
        if threshold is None:
            threshold = SEMANTIC_THRESHOLD if embedder else DEFAULT_THRESHOLD
        self.threshold = threshold
        self._embedder = embedder
        # Per slot, the text there; None is a free slot, taken by the next text added.
        self._texts: list[CapabilityText | None] = []
        self._slots: dict[str, int] = {}  # by text key
        self._by_id: dict[str, tuple[int, ...]] = {}  # the slots of each capability id
        self._free: list[int] = []
        self._lengths = np.zeros(0)
        self._keeps_language = np.zeros(0, dtype=bool)
        # Per slot, the language its text is written in (0 English or other, 1 Chinese).
        self._written_in = np.zeros(0, dtype=np.int8)
        # Per slot, its units' closeness to requests no agent serves (``hub_of``).
        self._hub = np.zeros(0, dtype=np.float32)
        self._units = Vectors.empty(embedder.dimensions) if embedder else None
        self._negatives = Vectors.empty(embedder.dimensions) if embedder else None
        # Per feature, a (2, documents) array: the slots it occurs in, and how often.
        self._postings: Map = Map()  # feature -> np.ndarray
        # How many features occur in each number of documents: the rarest gives max idf.
        self._df_counts: Counter = Counter()
        self._total_length = 0
        # Each distinct keyword once, with the slots of the capabilities that declare it,
        # found by where it starts (two characters, or the first word's stem), so a
        # request checks a handful of keywords, not every keyword of every capability.
        self._keyword_slots: dict[tuple[bool, str], np.ndarray] = {}
        self._keywords_by_start: dict[str, tuple[tuple[bool, str], ...]] = {}
        self._speller = Speller()
        # In slices: a whole fleet's features at once (10,000 capabilities) leave the
        # index's few long-lived objects scattered over some 30 MB of the allocator's
        # arenas, which stay with the process; slices reuse one slice's worth of room.
        capabilities = list(capabilities)
        for start in range(0, max(1, len(capabilities)), BUILD_SLICE):
            self._change([], capabilities[start:start + BUILD_SLICE])

    def updated(self, texts: Iterable[CapabilityText] = (),
                removed: Iterable[str] = ()) -> IntentIndex:
        """This index with ``texts`` replacing (or joining) those of their keys, and the
        ``removed`` keys gone; ``self`` when that changes nothing. Equal to an index built
        from scratch over the resulting texts. Keys must be unique."""
        slots = self._slots
        new = [c for c in texts if self._text_of(c.key) != c]
        leaving = {c.key for c in new if c.key in slots}
        leaving.update(key for key in removed if key in slots)
        if not new and not leaving:
            return self
        index = copy.copy(self)
        index._change([self._texts[slots[key]] for key in leaving], new)
        return index

    def keys_of(self, capability_id: str) -> list[str]:
        """The keys of the texts indexed for ``capability_id``."""
        return [self._texts[slot].key for slot in self._by_id.get(capability_id, ())]

    def _text_of(self, key: str) -> CapabilityText | None:
        slot = self._slots.get(key)
        return None if slot is None else self._texts[slot]

    def _seen(self, capability_id: str, mask: np.ndarray | None) -> bool:
        """Whether a text of ``capability_id`` is in the index and in ``mask`` (None: all)."""
        found = self._by_id.get(capability_id, ())
        return bool(found) and (mask is None or any(mask[slot] for slot in found))

    def _change(self, gone: list[CapabilityText], new: list[CapabilityText]) -> None:
        """Take ``gone`` out and put ``new`` in, on a fresh copy: every container this
        touches is copied first, for readers of the index it was copied from."""
        texts, slots, free = list(self._texts), dict(self._slots), list(self._free)
        leaving = [(slots.pop(c.key), _parts(c)) for c in gone]
        for slot, _ in leaving:
            texts[slot] = None
            free.append(slot)
        joining = []
        for c in new:
            slot = free.pop() if free else len(texts)
            if slot == len(texts):
                texts.append(None)
            texts[slot] = c
            slots[c.key] = slot
            joining.append((slot, _parts(c)))
        self._texts, self._slots, self._free = texts, slots, free
        by_id: dict[str, list[int]] = defaultdict(list)
        for slot in slots.values():
            by_id[texts[slot].capability_id].append(slot)
        self._by_id = {cid: tuple(sorted(found)) for cid, found in by_id.items()}
        self._total_length += sum(p.length for _, p in joining) - sum(
            p.length for _, p in leaving)
        self._lengths = _per_slot(self._lengths, len(texts),
                                  ((s, p.length) for s, p in joining))
        self._live = np.fromiter((t is not None for t in texts), dtype=bool, count=len(texts))
        self._written_in = _per_slot(self._written_in, len(texts),
                                     ((s, _language_of(c)) for (s, _), c in
                                      zip(joining, new, strict=True)))
        self._keeps_language = _per_slot(self._keeps_language, len(texts),
                                         ((s, not c.changes_language)
                                          for (s, _), c in zip(joining, new, strict=True)))
        if self._embedder is not None:
            unit_vectors = self._embedded(joining, new, CapabilityText.units)
            self._units = self._units.changed([s for s, _ in leaving], unit_vectors)
            self._hub = _per_slot(self._hub, len(texts), (
                (s, hub_of(self._embedder, v) if len(v) else HUB_REFERENCE)
                for s, v in unit_vectors))
            self._negatives = self._negatives.changed(
                [s for s, _ in leaving],
                self._embedded(joining, new, CapabilityText.counter_units))
        self._change_postings(leaving, joining)
        self._change_keywords(leaving, joining)
        self._speller = self._speller.changed(
            (w for _, p in leaving for w in p.words), (w for _, p in joining for w in p.words))
        documents = len(slots)
        average = (self._total_length / documents) if documents else 1.0
        # BM25's length normalisation, per slot (shorter documents favoured).
        self._norms = BM25_K1 * (1 - BM25_B + BM25_B * self._lengths / average)
        # Per feature asked for, its postings' slots and BM25 term weights (``_bm25``):
        # they change with every text added or removed, so they start afresh here.
        self._bm25_cache: dict[str, tuple] = {}
        self._bm25_cached = 0
        # A feature's idf by how many documents have it: few distinct counts, whatever
        # the number of features, so worked out anew for every change.
        self._idf = {d: _idf(documents, d) for d in self._df_counts}
        self._max_idf = max(self._idf.values(), default=1.0)

    def _change_postings(self, leaving: list[tuple[int, _Parts]],
                         joining: list[tuple[int, _Parts]]) -> None:
        out: dict[str, list[int]] = defaultdict(list)
        into: dict[str, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        for slot, parts in leaving:
            for f in parts.features:
                out[f].append(slot)
        for slot, parts in joining:
            for f, tf in parts.features.items():
                rows = into[f]
                rows[0].append(slot)
                rows[1].append(tf)
        # A persistent map: the features one text brings are set in a new map sharing
        # the rest with the old one, whatever the number of features of the fleet.
        df_counts = self._df_counts.copy()
        with self._postings.mutate() as postings:
            for f in out.keys() | into.keys():
                before = postings.get(f)
                after = _changed_rows(before, out.get(f, ()), into.get(f))
                _recount(df_counts, 0 if before is None else before.shape[1],
                         0 if after is None else after.shape[1])
                if after is None:
                    if f in postings:
                        del postings[f]
                else:
                    postings[f] = after
            self._postings = postings.finish()
        self._df_counts = df_counts

    def _change_keywords(self, leaving: list[tuple[int, _Parts]],
                         joining: list[tuple[int, _Parts]]) -> None:
        out: dict[tuple[bool, str], list[int]] = defaultdict(list)
        into: dict[tuple[bool, str], list[int]] = defaultdict(list)
        for slot, parts in leaving:
            for matcher in parts.matchers:
                out[matcher].append(slot)
        for slot, parts in joining:
            for matcher in parts.matchers:
                into[matcher].append(slot)
        if not out and not into:
            return
        keyword_slots, by_start = self._keyword_slots.copy(), self._keywords_by_start.copy()
        for matcher in out.keys() | into.keys():
            before = keyword_slots.get(matcher)
            after = before if before is not None else np.zeros(0, dtype=np.int32)
            if matcher in out:
                after = after[_without(after, out[matcher])]
            if matcher in into:
                after = np.concatenate([after, np.array(into[matcher], dtype=np.int32)])
            cjk, needle = matcher
            start = needle[:2] if cjk else needle.split()[0]
            if len(after):
                keyword_slots[matcher] = after
                if before is None:
                    by_start[start] = (*by_start.get(start, ()), matcher)
            else:
                keyword_slots.pop(matcher, None)
                kept = tuple(m for m in by_start.get(start, ()) if m != matcher)
                if kept:
                    by_start[start] = kept
                else:
                    by_start.pop(start, None)
        self._keyword_slots, self._keywords_by_start = keyword_slots, by_start

    def _embedded(self, joining, new, texts_of) -> list[tuple[int, np.ndarray]]:
        """``(slot, vectors of texts_of(text))`` per joining text, in one embedding call."""
        per_text = [texts_of(c) for c in new]
        flat = [t for texts in per_text for t in texts]
        vectors = np.asarray(self._embedder.embed(flat), dtype=np.float32) if flat else None
        out, at = [], 0
        for (slot, _), texts in zip(joining, per_text, strict=True):
            out.append((slot, vectors[at:at + len(texts)] if texts else np.zeros((0, 1))))
            at += len(texts)
        return out

    def _weight(self, feature: str) -> float:
        return self._idf[self._postings[feature].shape[1]] * _kind_weight(feature)

    def lexical(self, text: str, allowed: np.ndarray | None = None) -> dict[int, float]:
        """Per slot with a lexical match worth keeping, its lexical score (below)."""
        found = self._lexical_array(text, allowed)
        if found is None:
            return {}
        sims, touched = found
        if allowed is not None:
            touched = touched & allowed
        candidates = np.nonzero(touched & (sims * LEXICAL_WEIGHT >= self.threshold * 0.5))[0]
        if len(candidates) > MAX_CANDIDATES:
            candidates = self._best(candidates, sims)
        return {int(i): float(sims[i]) for i in candidates}

    def _lexical_array(self, text: str, allowed: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray] | None:
        """How much of the request a capability explains, in [0, 1]: the BM25 score of
        the capability against the request's known features, divided by the best
        score any document could reach; plus the keyword bonus, capped at 1.
        Misspelt words are corrected first. With ``allowed`` (the slots the caller may
        see) a feature's rarity and a text's length are weighed against those texts
        only: another tenant's private texts made a caller's words common (a break
        test: a private agent repeating "翻译 日文" turned another tenant's translation
        request into a 404). That costs the weights worked out per request (about 1 ms
        in a 10,000-capability index), only when the caller cannot see every text."""
        # Corrected toward the words of the texts the caller may see: another tenant's
        # private word is no word here (a break test: a private "payrolk" stopped
        # another tenant's "payrolk" being read as "payroll", and dry runs told whether a
        # codename was in someone's private descriptor).
        text = self._speller.correct(text, None if allowed is None or allowed.all()
                                     else functools.partial(self._visible_word, allowed))
        found = features(text)
        norms = None
        if allowed is None or allowed.all():
            query = {f: self._weight(f) * _repeats(f, n)
                     for f, n in found.items() if f in self._postings}
            max_idf = self._max_idf
        else:
            query, visible = {}, int(np.count_nonzero(allowed))
            average = float(self._lengths[allowed].sum()) / visible if visible else 1.0
            norms = BM25_K1 * (1 - BM25_B + BM25_B * self._lengths / (average or 1.0))
            for f, n in found.items():
                if f in self._postings:
                    frequency = int(np.count_nonzero(allowed[self._postings[f][0]]))
                    if frequency:
                        query[f] = _idf(visible, frequency) * _kind_weight(f) * _repeats(f, n)
            max_idf = _idf(visible, 1)
        # Words no capability knows are part of the request too: they count against
        # every match, so "zxqv plorf" sharing one trigram with a document is no match.
        # Unknown Chinese bigrams count less: many are particles and glue.
        unknown = sum(
            1.0 if f[0] == "w" else UNKNOWN_CJK_BIGRAM
            for f in found if f not in query and (f[0] == "w" or
                                                  (f[0] == "c" and len(f) == 4))
        )
        qnorm = (sum(query.values()) + unknown * max_idf) * (BM25_K1 + 1) or 1.0
        if not query:
            return None
        # The query's features' postings side by side, summed per slot in one bincount.
        if norms is None:
            rows = [self._bm25(f) for f in query]
            slots = np.concatenate([r[0] for r in rows])
            weights = np.concatenate([r[1] if q == r[2] else self._bm25_of(f) * q
                                      for r, (f, q) in zip(rows, query.items(), strict=True)])
        else:  # lengths against the visible texts' average: worked out for this request
            slots = np.concatenate([self._postings[f][0] for f in query])
            weights = np.concatenate([self._bm25_of(f, norms) * q for f, q in query.items()])
        sums = np.bincount(slots, weights=weights, minlength=len(self._texts))
        sims = sums / qnorm
        lowered = normalise(text)
        stem_list = [stem(w) for w in words(text)]
        stems = " " + " ".join(stem_list) + " "
        hits = np.zeros(len(self._texts))
        starts = {lowered[i:i + 2] for i in range(len(lowered) - 1)} | set(stem_list)
        seen: set[str] = set()
        for start in starts:
            for matcher in self._keywords_by_start.get(start, ()):
                cjk, needle = matcher
                if needle not in seen and needle in (lowered if cjk else stems):
                    seen.add(needle)
                    hits[self._keyword_slots[matcher]] += 1
        touched = sums > 0
        sims = np.minimum(1.0, sims + np.minimum(KEYWORD_BONUS_CAP, KEYWORD_BONUS * hits))
        if TO_LANGUAGE in query:
            sims[self._keeps_language] *= OTHER_LANGUAGE_PENALTY
        return sims, touched

    def _visible_word(self, allowed: np.ndarray, word: str) -> bool:
        """Whether a text in ``allowed`` has ``word`` (a text's words are its ``w:``
        features' sources, so the word's stem is posted for that text's slot)."""
        postings = self._postings.get("w:" + stem(word))
        return postings is not None and bool(allowed[postings[0]].any())

    def _bm25(self, feature: str) -> tuple[np.ndarray, np.ndarray, float]:
        """The slots that have ``feature``, its BM25 weight in each times the feature's
        own weight, and that weight. Kept once worked out: common features (a trigram
        in thousands of texts) are most of a request's postings, and weighting them was
        most of a lexical decision's time in a 10,000-capability index. At most
        ``BM25_CACHE`` postings are kept, the first asked for: the features most requests
        share are among them, and a rare feature has few postings to work out."""
        found = self._bm25_cache.get(feature)
        if found is None:
            weight = self._weight(feature)
            slots = self._postings[feature][0]
            found = (slots, self._bm25_of(feature) * weight, weight)
            if self._bm25_cached + len(slots) <= BM25_CACHE:
                self._bm25_cache[feature] = found
                self._bm25_cached += len(slots)
        return found

    def _bm25_of(self, feature: str, norms: np.ndarray | None = None) -> np.ndarray:
        """Per slot that has ``feature``: saturating term frequency, shorter documents
        favoured (BM25); ``norms``: the length norms to weigh by (the whole index's)."""
        slots, tf = self._postings[feature]
        return tf * (BM25_K1 + 1) / (tf + (self._norms if norms is None else norms)[slots])

    def _best(self, candidates: np.ndarray, sims: np.ndarray) -> np.ndarray:
        """The ``MAX_CANDIDATES`` best; ties at the cut go to the smaller capability ids,
        so the choice does not depend on the slots the texts happen to sit in."""
        values = sims[candidates]
        cut = np.partition(values, len(values) - MAX_CANDIDATES)[len(values) - MAX_CANDIDATES]
        best = candidates[values >= cut]
        if len(best) == MAX_CANDIDATES:  # no tie across the cut
            return best
        above = candidates[values > cut]
        tied = sorted(candidates[values == cut].tolist(),
                      key=lambda i: self._texts[i].capability_id)
        return np.concatenate([above, np.array(tied[:MAX_CANDIDATES - len(above)],
                                               dtype=above.dtype)])

    def scores(self, text: str, learned: Sequence = (),
               allowed: np.ndarray | None = None, home: np.ndarray | None = None
               ) -> list[Score]:
        """Every capability at or above the threshold, best first. ``learned``: the
        calling tenant's learned phrases (items with ``capability_id`` and ``phrase``);
        ``allowed``: the slots the caller may see (``allowed_slots``), None for all;
        ``home``: the slots of its own and granted capabilities, which go first when
        they match (None: no preference)."""
        return self._scored(text, learned, allowed, home)[0]

    def _step_scores(self, text: str, learned: Sequence, allowed: np.ndarray | None,
                     home: np.ndarray | None, *, later: bool) -> list[Score]:
        """One part of a request of several: its matches; for a later part that matched
        nothing, its closest capability when that leads the others clearly."""
        matched, near = self._scored(text, learned, allowed, home)
        if matched or not later or not near:
            return matched
        lead = near[0].score - (near[1].score if len(near) > 1 else 0.0)
        if near[0].score >= STEP_FLOOR and lead >= STEP_LEAD:
            return [near[0]]
        return matched

    @property
    def default_threshold(self) -> float:
        """The threshold chosen for this matcher (``CALIBRATION`` is fitted against it)."""
        return SEMANTIC_THRESHOLD if self._embedder is not None else DEFAULT_THRESHOLD

    def allowed_slots(self, visible: Callable[[CapabilityText], bool]) -> np.ndarray:
        """Per slot, whether its text is one the caller may see: a request is matched
        among those only, so another tenant's private capabilities (and its hints on an id
        the caller offers too) never move a caller's choice, its plan, its confidence or
        its margin."""
        return np.fromiter((t is not None and visible(t) for t in self._texts),
                           dtype=bool, count=len(self._texts))

    def _scored(self, text: str, learned: Sequence = (), allowed: np.ndarray | None = None,
                home: np.ndarray | None = None) -> tuple[list[Score], list[Score]]:
        """The matches, and the closest capabilities below the threshold (at most 3)."""
        stripped = heard(unshouted(without_quotations(without_addresses(text)))).strip()
        if not asks_for_something(stripped):
            return self._finish(stripped, [], [], allowed, home)  # an exact id still counts
        # A learned phrase that says nothing ("帮我", taught once) would draw every request
        # near it in meaning (a break test: "help me" went to a refund agent at 0.99).
        learned = [entry for entry in learned if asks_for_something(entry.phrase)]
        if self._embedder is None:
            boosted = self._learned_lexical(stripped, learned, phrase_of(text))
            # Below the threshold a match goes (``_finish``) unless a learned phrase lifts
            # it: dropped here, it costs no Score and no visibility check.
            floor = self.threshold if not boosted else -np.inf
            matched = []
            for i, v in self.lexical(stripped, allowed).items():
                score = round(LEXICAL_WEIGHT * v, 6)
                if score >= floor:
                    matched.append(Score(self._texts[i].capability_id, score, 0.0, v))
            matched = [m for m in _with_learned(matched, boosted, self._by_id)
                       if self._seen(m.capability_id, allowed)]
            return self._finish(stripped, matched, [], allowed, home)
        slots = len(self._texts)
        found = self._lexical_array(stripped, allowed)
        lexical = found[0] if found is not None else np.zeros(slots)
        (query,) = np.asarray(self._embedder.embed([stripped[:EMBEDDED_CHARS]]),
                              dtype=np.float32)
        # Capabilities the words point at are compared in full even in a large index.
        also = np.argpartition(-lexical, LEXICAL_SHORTLIST)[:LEXICAL_SHORTLIST] \
            if slots > LEXICAL_SHORTLIST else None
        first, second = self._units.best_two(query, slots, also)
        said = phrase_of(text) if learned else ""
        for entry in learned:  # the tenant's own phrases count as the capability's units
            found = self._by_id.get(entry.capability_id, ())
            if found:
                if entry.phrase == said:  # the phrase itself, in any case or punctuation
                    sim = 1.0
                else:
                    (vector,) = np.asarray(self._embedder.embed([entry.phrase]),
                                           dtype=np.float32)
                    sim = float(vector @ query)
                for slot in found:
                    if entry.phrase == said:
                        # The tenant said what this very request is for: that decides,
                        # whatever its words match (helper-46: taught four times,
                        # "track my parcel" still went where "parcel" pointed).
                        first[slot] = second[slot] = sim + LEARNED_BONUS
                    elif sim >= LEARNED_SIMILARITY and sim + LEARNED_BONUS > first[slot]:
                        second[slot] = max(second[slot], first[slot])
                        first[slot] = sim + LEARNED_BONUS
        live = self._live if allowed is None else self._live & allowed
        # A catalogue written in descriptions only scores every request lower than one
        # with examples (written as requests, they sit closer to requests): its bar is
        # lowered by how much further its texts sit from everyday requests than the
        # reference's (without its examples, the evaluation catalogue refused 25 % of
        # answerable requests). A few texts say little about how a catalogue is written:
        # their mean is drawn to the reference as if ``HUB_PRIOR`` texts there joined it.
        level = (float(self._hub[live].sum()) + HUB_PRIOR * HUB_REFERENCE) / (
            int(live.sum()) + HUB_PRIOR)
        semantic = _centred_by_language(
            np.where(second > -1, (first + second) / 2, first), self._written_in, live
        ) - background_floor(self._embedder, query) + STYLE_WEIGHT * (HUB_REFERENCE - level)
        against, _ = self._negatives.best_two(query, slots, also)
        push = np.where(against > first, NEGATIVE_WEIGHT * (against - first) + NEGATIVE_BASE, 0.0)
        total = SEMANTIC_LEXICAL_WEIGHT * np.minimum(lexical, 1.0) + semantic - push
        ranked = np.where(live, total, -np.inf)
        if slots > MAX_CANDIDATES:  # the best few without sorting the fleet
            top = np.argpartition(-ranked, MAX_CANDIDATES)[:MAX_CANDIDATES]
            order = top[np.lexsort((top, -ranked[top]))]
        else:
            order = np.argsort(-ranked, kind="stable")
        matched, near = [], []
        for i in order:
            if not live[i]:
                break
            # Rounded: an index updated in place and one built afresh hold the same
            # vectors in other rows, and a matrix product may differ in the last bits.
            score = Score(self._texts[i].capability_id, round(float(total[i]), 6), 0.0,
                          round(float(lexical[i]), 6), round(float(semantic[i]), 6),
                          round(float(push[i]), 6), 1.0 if first[i] > 1 else 0.0)
            (matched if total[i] >= self.threshold else near).append(score)
        return self._finish(stripped, matched, near[:3], allowed, home)

    def _finish(self, stripped: str, matched: list[Score], near: list[Score],
                allowed: np.ndarray | None, home: np.ndarray | None = None
                ) -> tuple[list[Score], list[Score]]:
        matched = [s for s in matched if s.score >= self.threshold]
        if self._seen(stripped, allowed):
            matched = [s for s in matched if s.capability_id != stripped]
            matched.append(Score(stripped, EXACT_SCORE, EXACT_SCORE))
        key = lambda s: (-s.score, s.capability_id)  # noqa: E731
        matched.sort(key=key)
        if len(self._by_id) < len(self._slots):  # an id with several texts: its best counts
            best: dict[str, Score] = {}
            for s in matched:
                best.setdefault(s.capability_id, s)
            matched = list(best.values())
        if home is not None and matched and not matched[0].exact:
            # The caller's own and granted capabilities that match go first: another
            # tenant's public one is a fallback, never a rival. Its text is another
            # tenant's to write, and one stuffed with this tenant's phrases outscores
            # any honest description: no margin would keep its intents (and inputs) home.
            own, others = [], []
            for s in matched:
                (own if self._seen(s.capability_id, home) else others).append(s)
            matched = own + others
        return matched, sorted(near, key=key)

    def _learned_lexical(self, text: str, learned: Sequence, said: str) -> dict[str, float]:
        """Without an embedder: a learned phrase sharing most of its features with the
        request lifts its capability to at least the phrase's overlap (1 for the phrase
        itself, ``said`` being the request as a phrase)."""
        if not learned:
            return {}
        mine = set(features(text))
        out: dict[str, float] = {}
        for entry in learned:
            theirs = set(features(entry.phrase))
            if entry.phrase == said:
                out[entry.capability_id] = 1.0
            elif mine and theirs:
                overlap = len(mine & theirs) / len(mine | theirs)
                if overlap >= LEARNED_LEXICAL_OVERLAP:
                    out[entry.capability_id] = max(out.get(entry.capability_id, 0.0), overlap)
        return out

    def match(self, text: str, *, learned: Sequence = (),
              allowed: np.ndarray | None = None, home: np.ndarray | None = None) -> Match:
        parts = clauses(text)
        # One part left of several (one said not to do something, "…，先别退款"; or a
        # time, "before the meeting, …"): it is the request, not the words left out.
        whole, near = self._scored(
            parts[0] if len(parts) == 1 and parts[0] != text.strip(PART_TRIM) else text,
            learned, allowed, home)
        if len(parts) > MAX_STEPS:  # the rest is one last part
            parts = [*parts[:MAX_STEPS - 1], " ".join(parts[MAX_STEPS - 1:])]
        single = Match(ranked=tuple(whole), clauses=tuple(parts), suggestions=tuple(near),
                       **self._sureness(whole))
        if len(parts) < 2:
            return single
        per_clause = [self._step_scores(p, learned, allowed, home, later=i > 0)
                      for i, p in enumerate(parts)]
        plan: list[str] = []
        sureness: list[float] = []
        first_step: tuple[Score, ...] = ()
        first_margin = 0.0
        steps = _distinct_steps(per_clause)
        first_at = next((i for i, step in enumerate(steps) if step is not None), len(parts))
        if any(not per_clause[i] and asks_to_do(parts[i]) for i in range(first_at)):
            # What is asked to be done first, no capability does (a part that only tells,
            # "我刚开完会，然后…", is no step): the later steps may depend on
            # it, and run alone they do half a job (helper-47: "book a meeting with
            # Alice, then remind me an hour before" set the reminder, no meeting booked).
            return Match(ranked=(), clauses=tuple(parts),
                         suggestions=tuple(whole[:3]) or tuple(near))
        for ranked, step in zip(per_clause, steps, strict=True):
            if step is not None:
                ordered = (step, *[r for r in ranked if r is not step])
                sure = self._sureness(ordered)
                if not plan:
                    first_step, first_margin = ordered, sure["margin"]
                plan.append(step.capability_id)
                sureness.append(sure["confidence"])
        if len(plan) < 2:
            if plan and (not whole or whole[0].capability_id != plan[0]):
                # One part names a job, and the whole request matched nothing (a "not
                # for" hint pushed it away, say) or another capability, one no part asked
                # for ("email the team, then remind me tomorrow" went to the reminder,
                # its second part matching nothing): that part is what can be done.
                return replace(single, ranked=first_step, **self._sureness(first_step))
            return single
        # The whole request's best match, when it matches every part reasonably well
        # (a fair share of that part's best), is a single step that covers it. Only the
        # best: a runner-up "covering" both parts was a worse guess than the plan (a break
        # test: "summarize the report, after that email it to the team" became one draft
        # step); on the tuning and development sets it had decided one request, wrongly.
        best = whole[0] if whole else None
        # Another tenant's public capability never covers steps the caller's own match
        # (a re-test: a stuffed one took "where is my order 12345 and then reset my
        # password", and its input, from the owner of both steps' capabilities).
        foreign = home is not None and best is not None and not self._seen(
            best.capability_id, home) and any(self._seen(cid, home) for cid in plan)
        if best is not None and best.capability_id not in plan and not foreign and all(
            _score_of(r, best.capability_id) >= COVER_SHARE * r[0].score
            for r in per_clause if r
        ):
            return replace(single, covered=True)
        return replace(single, plan=tuple(plan), step_confidence=tuple(sureness),
                       first_step=first_step, first_margin=first_margin)

    def _sureness(self, ranked: Sequence[Score]) -> dict:
        if not ranked:
            return {"confidence": 0.0, "margin": 0.0}
        best = ranked[0].score
        # The lead over the best of the others: below zero (a tie, as unsure) when the
        # caller's own capability went first though another tenant's public one scored
        # higher, whichever place that one took after the caller's others.
        margin = max(0.0, best - max((r.score for r in ranked[1:]), default=0.0))
        confidence = calibrated(best - self.default_threshold, margin,
                                semantic=self._embedder is not None)
        if margin < AMBIGUITY_MARGIN and len(ranked) > 1:
            # A tie (or a public capability that scored higher, put behind the
            # caller's own) is a coin toss at best, whatever the score (a re-test read
            # 0.99 here), and a near tie little better: up to 1.0 at the margin's edge.
            confidence = min(confidence, 0.5 + 0.5 * margin / AMBIGUITY_MARGIN)
        return {"confidence": round(confidence, 4), "margin": round(margin, 4)}


def _distinct_steps(per_clause: Sequence[Sequence[Score]]) -> list[Score | None]:
    """Each part's step: a capability of its own, the part's best or one nearly as good
    (``REPEAT_SHARE`` of it, among its best three), or None (a detail of another step).
    Of the ways to choose, the one with the most steps, then the highest total score:
    "polish it first (in Chinese), then translate it to English" had its first part
    matched best to translation, and the second, which has nothing else, was dropped;
    a part-by-part choice can only move the later part ("draft it, then send it")."""
    bests = [ranked[0] if ranked else None for ranked in per_clause]
    ids = [s.capability_id for s in bests if s is not None]
    if len(ids) == len(set(ids)):
        return bests  # no two parts want the same capability: each takes its best
    options = [[None, *(s for s in ranked[:3] if s.score >= REPEAT_SHARE * ranked[0].score)]
               if ranked else [None] for ranked in per_clause]
    best: tuple | None = None
    chosen: tuple = ()
    for steps in itertools.product(*options):
        ids = [s.capability_id for s in steps if s is not None]
        if len(ids) != len(set(ids)):
            continue
        # Ties go to the earlier parts: they keep a step, and their best.
        rank = (len(ids), round(sum(s.score for s in steps if s is not None), 9),
                tuple(s is not None for s in steps),
                tuple(bool(part) and s is part[0]
                      for part, s in zip(per_clause, steps, strict=True)))
        if best is None or rank > best:
            best, chosen = rank, steps
    return list(chosen)


def calibrated(over: float, margin: float, *, semantic: bool) -> float:
    """The chance a decision is right whose best score is ``over`` the matcher's default
    threshold, with this lead (``CALIBRATION``)."""
    intercept, per_score, per_lead = CALIBRATION["semantic" if semantic else "lexical"]
    z = intercept + per_score * over + per_lead * min(margin, CALIBRATION_LEAD_CAP)
    return 1.0 / (1.0 + math.exp(-z))


def _with_learned(matched: list[Score], boosted: Mapping[str, float],
                  indexed: Mapping[str, tuple[int, ...]]) -> list[Score]:
    """Lexical scores with the learned overlaps folded in (the larger wins, plus a bonus)."""
    if not boosted:
        return matched
    best: dict[str, Score] = {}
    for s in matched:  # an id with several texts: its best
        if s.capability_id not in best or s.score > best[s.capability_id].score:
            best[s.capability_id] = s
    for cid, overlap in boosted.items():
        if cid not in indexed:
            continue
        was = best.get(cid)
        score = max(was.score if was else 0.0, LEXICAL_WEIGHT * overlap + LEARNED_BONUS)
        best[cid] = Score(cid, round(score, 6), 0.0, was.lexical if was else 0.0, 0.0, 0.0,
                          overlap)
    return list(best.values())


# A group needs a few members for its mean to say anything about the encoder's bias.
_GROUP_MIN = 3


def _centred_by_language(similarity: np.ndarray, written_in: np.ndarray, live: np.ndarray
                         ) -> np.ndarray:
    """Similarities with each description language's mean taken out and the overall mean
    put back: the encoder ranks a request's own language closer than a translation of
    the same meaning, so a Chinese request would favour Chinese descriptions; only how a
    capability stands among those written in its language is compared."""
    groups = np.bincount(written_in[live], minlength=2)
    if (groups < _GROUP_MIN).any():
        return similarity
    sums = np.bincount(written_in[live], weights=similarity[live], minlength=2)
    means = sums / groups
    return similarity - means[written_in] + sums.sum() / groups.sum()


def _language_of(c: CapabilityText) -> int:
    """1 when a capability is described mostly in Chinese, else 0."""
    text = f"{c.display_name} {c.description}"
    cjk = sum(1 for ch in text if "\u3400" <= ch <= "\u9fff")
    return int(cjk > 0.3 * max(1, len(text.replace(" ", ""))))


def _score_of(ranked: Sequence[Score], capability_id: str) -> float:
    return next((s.score for s in ranked if s.capability_id == capability_id), 0.0)


def index_from_capabilities(
    capabilities: Mapping[str, CapabilityText], **kwargs
) -> IntentIndex:
    return IntentIndex(list(capabilities.values()), **kwargs)


@dataclass(frozen=True)
class _Parts:
    """What one capability text puts in an index. Worked out again when the text leaves
    rather than kept: kept, it would cost every document its bag of features."""

    features: Counter
    length: int
    matchers: tuple[tuple[bool, str], ...]
    words: frozenset[str]


def _parts(c: CapabilityText) -> _Parts:
    document = c.document()
    bag = features(document)
    if c.changes_language:
        bag[TO_LANGUAGE] += 2
    return _Parts(bag, sum(bag.values()), _keyword_matchers(c.keywords),
                  frozenset(w for w in words(document) if _spellable(w)))


def _repeats(feature: str, count: int) -> float:
    """A lexicon concept named several ways counts for more (capped); any other feature
    counts once, however often it repeats."""
    return min(2.5, 1 + 0.5 * (count - 1)) if feature[0] == "k" else 1.0


def _idf(documents: int, frequency: int) -> float:
    # BM25's idf, floored so a feature in every document still counts a little.
    return max(0.05, math.log(1 + (documents - frequency + 0.5) / (frequency + 0.5)))


def _per_slot(values: np.ndarray, size: int, joining: Iterable[tuple[int, object]]
              ) -> np.ndarray:
    """A copy of ``values`` grown to ``size`` with the joining ``(slot, value)`` pairs set.
    What a free slot holds does not matter: no posting or keyword points at it."""
    out = np.zeros(size, dtype=values.dtype)
    out[:len(values)] = values
    for slot, value in joining:
        out[slot] = value
    return out


def _changed_rows(rows: np.ndarray | None, leaving: Sequence[int],
                  joining: tuple[list[int], list[int]] | None) -> np.ndarray | None:
    """A feature's postings without the ``leaving`` slots and with the ``joining``
    ``(slots, frequencies)``; None when none are left. Their order within the feature
    does not matter: a slot is there once, and a request sums per slot."""
    if rows is not None and leaving:
        # Row by row: a boolean mask across a (2, n) array is many times slower.
        keep = _without(rows[0], leaving)
        rows = np.stack([rows[0][keep], rows[1][keep]])
    if joining is not None:
        added = np.array(joining, dtype=np.int32)
        rows = added if rows is None else np.concatenate([rows, added], axis=1)
    return rows if rows is not None and rows.shape[1] else None


def _without(values: np.ndarray, leaving: Sequence[int]) -> np.ndarray:
    """The mask of ``values`` not in ``leaving``."""
    if len(leaving) > 4:
        return np.isin(values, leaving, invert=True)
    # One agent changed: a few slots, and comparing to each beats isin's set-up.
    keep = values != leaving[0]
    for slot in leaving[1:]:
        keep &= values != slot
    return keep


def _recount(counts: Counter, before: int, after: int) -> None:
    if before == after:
        return
    if before:
        counts[before] -= 1
        if not counts[before]:
            del counts[before]
    if after:
        counts[after] += 1


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

    def __init__(self, vocabulary: Iterable[str] = ()) -> None:
        # How many times each word was given (by an index: how many documents have it).
        self._counts = Map(Counter(w for w in vocabulary if _spellable(w)))
        self._deletes = _Deletions(self._counts)

    def changed(self, gone: Iterable[str], new: Iterable[str]) -> Speller:
        """The speller with ``gone`` given once less each and ``new`` once more."""
        added = [w for w in new if _spellable(w)]
        with self._counts.mutate() as counts:
            for word in gone:
                left = counts.get(word, 0) - 1
                if left > 0:
                    counts[word] = left
                elif word in counts:
                    del counts[word]
            for word in added:
                counts[word] = counts.get(word, 0) + 1
            counts = counts.finish()
        speller = copy.copy(self)
        speller._counts = counts
        # Words that left stay in the shared variants until they are most of them.
        if len(self._deletes.words) > 2 * len(counts) + 1000:
            speller._deletes = _Deletions(counts)
        else:
            self._deletes.add(added)
        return speller

    def _correct_word(self, word: str, known: Callable[[str], bool] | None) -> str:
        if len(word) < self.MIN_LENGTH or not word.isalpha() or (
                word in self._counts and (known is None or known(word))):
            return word
        found = set()
        for variant in _deletions(word):
            found |= self._deletes.variants.get(variant, set())
        found = {w for w in found if w in self._counts and _one_edit(word, w)
                 and (known is None or known(w))}
        return min(found) if len(found) >= 1 else word

    def correct(self, text: str, known: Callable[[str], bool] | None = None) -> str:
        """``text`` with its misspelt words corrected; ``known``: whether the caller may
        see a text with this word (None: every word of the vocabulary counts)."""
        lowered = normalise(text)
        replaced = {w: self._correct_word(w, known) for w in set(words(lowered))}
        if all(k == v for k, v in replaced.items()):
            return lowered
        return " ".join(replaced.get(t, t) for t in lowered.split(" "))


class _Deletions:
    """Words under their one-deletion variants, shared by the spellers an index's
    updates make: it only grows, and each speller ignores the words it does not have,
    so adding to it never changes an older speller's answers (and, one dict or set
    operation at a time under the GIL, never breaks one reading it)."""

    def __init__(self, vocabulary: Iterable[str] = ()) -> None:
        self.words: set[str] = set()
        self.variants: dict[str, set[str]] = defaultdict(set)
        self.add(vocabulary)

    def add(self, vocabulary: Iterable[str]) -> None:
        for word in vocabulary:
            if word not in self.words:
                self.words.add(word)
                for variant in _deletions(word):
                    self.variants[variant].add(word)


def _spellable(word: str) -> bool:
    return len(word) >= 4 and word.isalpha()


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
