"""Sentence vectors of capability texts, and a request's calibrated similarity to them.

Each capability is embedded as several short units — its name with its keywords, each
sentence of its description, each example — because a sentence encoder compares
sentences, and one request resembles one of them, not their average. Its ``not_for``
hints are embedded apart: a request closer to a hint than to anything the capability
is for is pushed away from it.

Raw cosines are not comparable across languages: with a multilingual encoder a Chinese
request sits closer to everything than an English one does. A request's similarity is
therefore read against its similarity to a fixed set of everyday sentences that no
agent serves (``BACKGROUND``, in both languages): a match is what stands out from that.

Vectors live in one append-only matrix shared by every version of the index: an
update appends the new units' rows and gives the new version its own map of which row
belongs to which slot (-1: gone), so older versions, still read by calls in flight,
never see a change. Dead rows are dropped by copying when they are most of the matrix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from routing.text import asks_for_something

# Everyday requests no agent of an organisation serves: the floor a request's
# similarities are read against.
BACKGROUND = (
    "今天晚上吃什么好呢", "给我讲个笑话吧", "周末去哪里玩比较好", "这个电影好看吗", "你好，在吗",
    "帮我看看这个", "我有点无聊", "你觉得怎么样",
    "what should I have for dinner", "tell me a joke", "where should I go this weekend",
    "is this movie any good", "hello there", "can you help me with something",
    "I'm bored", "what do you think",
    "帮我弄一下这个 thing", "这个 issue 怎么搞", "hi 在吗 有个事", "周末 plan 是啥",
)
_SENTENCE = re.compile(r"(?<=[.!?。！？；;])\s*")
_ASIDE = re.compile(r"[（(][^）)]*[）)]")  # "(use logistics.track)": a pointer, not meaning


def units(display_name: str, keywords: Sequence[str], description: str,
          examples: Sequence[str]) -> list[str]:
    """The short texts one capability is embedded as."""
    head = display_name
    if keywords:
        head = f"{display_name}: {', '.join(keywords)}" if display_name else ", ".join(keywords)
    out = [head] if head else []
    out += [s.strip() for s in _SENTENCE.split(description) if s.strip()]
    out += [e for e in examples if e.strip()]
    # A text that says nothing ("x", "-", "TBD ok") means nothing: embedded, it sat
    # near every short request and drew them (a break test: a public capability
    # described as "x" took another tenant's "go", "run" and "查一下", and their input).
    return [u for u in out if asks_for_something(u)]


def negatives(not_for: Sequence[str]) -> list[str]:
    return [t for t in (_ASIDE.sub("", n).strip() for n in not_for) if t]


# A large index is searched by centroids first: past this many capabilities, only the
# rows of the closest ones are compared.
SHORTLIST_FROM = 2000
SHORTLIST = 256


class _Rows:
    """An append-only float32 matrix; a version of the index reads its first rows."""

    def __init__(self, dimensions: int, capacity: int = 256) -> None:
        self.matrix = np.zeros((capacity, dimensions), dtype=np.float32)
        self.count = 0

    def own(self, size: int) -> _Rows:
        """This matrix when ``size`` rows are all it holds, else a copy of those rows: a
        version that is not the latest must not append over a later version's rows."""
        if self.count == size:
            return self
        copy = _Rows(self.matrix.shape[1], max(256, 2 * size))
        copy.matrix[:size] = self.matrix[:size]
        copy.count = size
        return copy

    def append(self, vectors: np.ndarray) -> tuple[_Rows, int]:
        """Where ``vectors`` went: this matrix, or a bigger copy when it is full."""
        rows = self
        if self.count + len(vectors) > len(self.matrix):
            rows = _Rows(self.matrix.shape[1], max(2 * len(self.matrix),
                                                   self.count + len(vectors)))
            rows.matrix[:self.count] = self.matrix[:self.count]
            rows.count = self.count
        start = rows.count
        rows.matrix[start:start + len(vectors)] = vectors
        rows.count += len(vectors)
        return rows, start


@dataclass(frozen=True)
class Vectors:
    """One version's rows, in blocks: a slot's vectors are one run of rows, block ``i``
    starting at ``starts[i]`` and belonging to slot ``block_slot[i]`` (-1: gone). ``size``
    rows of the shared matrix are this version's."""

    rows: _Rows
    starts: np.ndarray
    block_slot: np.ndarray
    block_of_row: np.ndarray
    size: int
    # Per block, in the same order, the normalised mean of its rows: a large index is
    # searched by these first, and only the closest blocks' rows are compared.
    centroids: _Rows | None = None

    @classmethod
    def empty(cls, dimensions: int) -> Vectors:
        none = np.zeros(0, dtype=np.int32)
        return cls(_Rows(dimensions), none, none, none, 0, _Rows(dimensions))

    @property
    def alive(self) -> int:
        return int((self.block_slot >= 0).sum())

    def changed(self, leaving: Sequence[int], joining: Sequence[tuple[int, np.ndarray]]
                ) -> Vectors:
        """Without the rows of the ``leaving`` slots, with ``(slot, vectors)`` added."""
        rows, starts, size, centroids = self.rows, self.starts, self.size, self.centroids
        block_slot = self.block_slot.copy()
        if len(leaving):
            block_slot[np.isin(block_slot, np.asarray(leaving, dtype=np.int32))] = -1
        lengths = np.diff(np.append(starts, size)).astype(np.int32)
        live_rows = int(lengths[block_slot >= 0].sum())
        if size > 1024 and live_rows < size // 2:  # mostly dead rows: keep the live ones
            keep = block_slot >= 0
            fresh = _Rows(rows.matrix.shape[1], max(256, 2 * live_rows))
            taken = np.repeat(keep, lengths)
            fresh.matrix[:live_rows] = rows.matrix[:size][taken]
            fresh.count = size = live_rows
            kept = _Rows(rows.matrix.shape[1], max(256, 2 * int(keep.sum())))
            kept.matrix[:int(keep.sum())] = centroids.matrix[:len(keep)][keep]
            kept.count = int(keep.sum())
            centroids = kept
            lengths, block_slot = lengths[keep], block_slot[keep]
            starts = (np.cumsum(lengths) - lengths).astype(np.int32)
            rows = fresh
        blocks = [(slot, v) for slot, v in joining if len(v)]
        if blocks:
            # A later version of the index appended past this one: continue on copies.
            rows = rows.own(size)
            centroids = centroids.own(len(block_slot))
            rows, at = rows.append(np.concatenate([v for _, v in blocks]))
            means = np.stack([v.mean(axis=0) for _, v in blocks]).astype(np.float32)
            means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-9)
            centroids, _ = centroids.append(means)
            new_lengths = np.array([len(v) for _, v in blocks], dtype=np.int32)
            starts = np.concatenate([starts, at + np.cumsum(new_lengths) - new_lengths]
                                    ).astype(np.int32)
            block_slot = np.concatenate([block_slot, [slot for slot, _ in blocks]]
                                        ).astype(np.int32)
            lengths = np.concatenate([lengths, new_lengths])
            size = at + int(new_lengths.sum())
        block_of_row = np.repeat(np.arange(len(starts), dtype=np.int32), lengths)
        return Vectors(rows, starts, block_slot, block_of_row, size, centroids)

    def best_two(self, query: np.ndarray, slots: int, also: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Per slot, the best and the second-best similarity of its rows to ``query``
        (-1 where a slot has fewer rows). One matrix product and two segment maxima.

        Past ``SHORTLIST_FROM`` blocks, only the rows of the ``SHORTLIST`` blocks whose
        centroids are closest (and of the slots in ``also``) are compared; every other
        slot gets its centroid's similarity as its best. The matrix product then reads a
        few thousand rows, not the fleet's (10,000 capabilities: 60,000 rows, 120 MB)."""
        first = np.full(slots, -1.0, dtype=np.float32)
        second = np.full(slots, -1.0, dtype=np.float32)
        if not self.size or not self.alive:
            return first, second
        if len(self.starts) > SHORTLIST_FROM:
            return self._shortlisted(query, first, second, also)
        sims = self.rows.matrix[:self.size] @ query
        best = np.maximum.reduceat(sims, self.starts)
        rest = np.where(sims >= best[self.block_of_row], np.float32(-1.0), sims)
        runner_up = np.maximum.reduceat(rest, self.starts)
        alive = self.block_slot >= 0
        first[self.block_slot[alive]] = best[alive]
        second[self.block_slot[alive]] = runner_up[alive]
        return first, second

    def _shortlisted(self, query, first, second, also):
        blocks = len(self.starts)
        alive = self.block_slot >= 0
        near = np.where(alive, self.centroids.matrix[:blocks] @ query, -np.inf)
        chosen = np.argpartition(-near, SHORTLIST)[:SHORTLIST]
        if also is not None and len(also):
            block_of_slot = np.full(max(len(first), 1), -1, dtype=np.int64)
            block_of_slot[self.block_slot[alive]] = np.nonzero(alive)[0]
            extra = block_of_slot[also[also < len(block_of_slot)]]
            chosen = np.union1d(chosen, extra[extra >= 0])
        chosen = np.sort(chosen[alive[chosen]])
        first[self.block_slot[alive]] = near[alive]
        lengths = np.diff(np.append(self.starts, self.size))[chosen]
        # The chosen blocks' rows, gathered: each block's start repeated over its rows,
        # plus each row's offset within its block.
        offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths,
                                                             lengths)
        rows = np.repeat(self.starts[chosen], lengths) + offsets
        sims = self.rows.matrix[rows] @ query
        cuts = (np.cumsum(lengths) - lengths).astype(np.int64)
        best = np.maximum.reduceat(sims, cuts)
        rest = np.where(sims >= np.repeat(best, lengths), np.float32(-1.0), sims)
        runner_up = np.maximum.reduceat(rest, cuts)
        first[self.block_slot[chosen]] = best
        second[self.block_slot[chosen]] = runner_up
        return first, second


def hub_of(embedder, vectors: np.ndarray) -> float:
    """How close one capability's units sit to requests no agent serves: per
    ``BACKGROUND`` sentence the mean of its best two similarities (as a request is
    scored), averaged. Units written as requests (examples) sit closer than a
    description's sentences do; see ``IntentIndex`` for what it corrects."""
    if not len(vectors):
        return float("nan")
    sims = vectors @ _background(embedder).T  # units x background sentences
    if len(vectors) == 1:
        return float(sims[0].mean())
    top = np.sort(sims, axis=0)[-2:]
    return float(top.mean())


def background_floor(embedder, query: np.ndarray) -> float:
    """How close ``query`` sits to requests no agent serves: its mean similarity to
    ``BACKGROUND``, the same for every capability, so it moves the score, not the order."""
    return float((_background(embedder) @ query).mean())


_BACKGROUNDS: dict[int, np.ndarray] = {}


def _background(embedder) -> np.ndarray:
    key = id(embedder)
    if key not in _BACKGROUNDS:
        _BACKGROUNDS[key] = np.asarray(embedder.embed(list(BACKGROUND)), dtype=np.float32)
    return _BACKGROUNDS[key]
