"""Diversity metrics of a simulator's replies."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simpop.evaluation.diversity import distinct_n, label_entropy, load_embedder, semantic_diversity, tokens


def test_tokens_split_words_and_punctuation():
    assert tokens("I'll give $1.50!") == ["i", "'", "ll", "give", "$", "1", ".", "50", "!"]


def test_distinct_n():
    assert distinct_n(["a b c", "a b d"], 1) == pytest.approx(4 / 6)
    assert distinct_n(["a b c", "a b d"], 2) == pytest.approx(3 / 4)
    assert distinct_n(["same reply"] * 5, 2) == pytest.approx(1 / 5)
    assert math.isnan(distinct_n(["one", "two"], 2))
    with pytest.raises(ValueError):
        distinct_n(["a"], 0)


def test_label_entropy_in_bits():
    assert label_entropy(["donate"] * 4) == 0.0
    assert label_entropy(["donate", "refuse"] * 3) == pytest.approx(1.0)
    assert label_entropy(["donate", "refuse", "undecided"]) == pytest.approx(math.log2(3))
    assert math.isnan(label_entropy([]))


def test_semantic_diversity_with_a_given_embedder():
    table = {"x": [1.0, 0.0], "y": [0.0, 1.0], "z": [1.0, 0.0]}

    def embed(texts):
        return np.array([table[t] for t in texts])

    assert semantic_diversity(["x", "x"], embed) == 0.0
    assert semantic_diversity(["x", "y"], embed) == pytest.approx(1.0)
    assert semantic_diversity(["x", "y", "z"], embed) == pytest.approx(1 - 1 / 3)
    assert math.isnan(semantic_diversity(["x"], embed))


def test_bundled_embedder_ranks_paraphrases_closer_than_different_replies():
    embed = load_embedder()
    same = semantic_diversity(["I will donate one dollar.", "I'll give a dollar."], embed)
    different = semantic_diversity(["I will donate one dollar.", "What is your favourite movie?"], embed)
    assert semantic_diversity(["No thanks."] * 3, embed) == pytest.approx(0.0, abs=1e-6)
    assert 0 < same < different <= 2
