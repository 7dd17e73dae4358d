"""The capability vectors' store: versions that never see each other's rows, compaction,
and the centroid shortlist of a large index agreeing with the full search."""

from __future__ import annotations

import numpy as np
import pytest

from routing import semantic
from routing.semantic import Vectors


def unit(rng: np.random.Generator, n: int, d: int = 16) -> np.ndarray:
    v = rng.normal(size=(n, d)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def full(vectors: Vectors, query: np.ndarray, slots: int, monkeypatch) -> tuple:
    with monkeypatch.context() as m:
        m.setattr(semantic, "SHORTLIST_FROM", 10**9)
        return vectors.best_two(query, slots)


def test_an_older_version_never_sees_a_later_versions_rows():
    rng = np.random.default_rng(1)
    a, b, c = unit(rng, 2), unit(rng, 3), unit(rng, 1)
    v1 = Vectors.empty(16).changed([], [(0, a)])
    v2 = v1.changed([], [(1, b)])
    v3 = v1.changed([], [(2, c)])  # a branch from the older version
    for version, query, slot in ((v2, b[2], 1), (v3, c[0], 2), (v1, a[1], 0)):
        first, _ = version.best_two(query, 3)
        assert first[slot] == pytest.approx(1.0, abs=1e-5)
    assert v1.best_two(b[0], 3)[0][1] == -1 and v2.best_two(c[0], 3)[0][2] == -1


def test_replacing_most_slots_compacts_and_answers_as_a_fresh_store(monkeypatch):
    rng = np.random.default_rng(2)
    blocks = {slot: unit(rng, 1 + slot % 4) for slot in range(600)}
    store = Vectors.empty(16).changed([], list(blocks.items()))
    for slot in range(450):  # three quarters of the rows replaced: dead rows dominate
        blocks[slot] = unit(rng, 2)
        store = store.changed([slot], [(slot, blocks[slot])])
    assert store.size < 2 * sum(len(v) for v in blocks.values())  # compacted
    fresh = Vectors.empty(16).changed([], list(blocks.items()))
    for query in unit(rng, 5):
        got, want = store.best_two(query, 600), fresh.best_two(query, 600)
        np.testing.assert_allclose(got[0], want[0], atol=1e-5)
        np.testing.assert_allclose(got[1], want[1], atol=1e-5)


def test_the_shortlist_of_a_large_store_finds_what_the_full_search_finds(monkeypatch):
    # The encoder's 512 dimensions: a capability's centroid stays near each of its units.
    rng = np.random.default_rng(3)
    slots = semantic.SHORTLIST_FROM + 1000
    store = Vectors.empty(512).changed([], [(s, unit(rng, 1 + s % 6, 512))
                                            for s in range(slots)])
    for target in (5, 1234, slots - 1):
        rows = store.rows.matrix[store.starts[target]:store.starts[target] + 1 + target % 6]
        query = rows[0] + 0.05 * unit(rng, 1, 512)[0]
        query /= np.linalg.norm(query)
        short_first, short_second = store.best_two(query, slots)
        full_first, full_second = full(store, query, slots, monkeypatch)
        assert int(np.argmax(short_first)) == int(np.argmax(full_first)) == target
        assert short_first[target] == pytest.approx(full_first[target], abs=1e-5)
        assert short_second[target] == pytest.approx(full_second[target], abs=1e-5)
    # A slot outside the shortlist is compared in full when asked for.
    far = int(np.argmin(full(store, query, slots, monkeypatch)[0]))
    first, _ = store.best_two(query, slots, also=np.array([far]))
    assert first[far] == pytest.approx(full(store, query, slots, monkeypatch)[0][far], abs=1e-5)
