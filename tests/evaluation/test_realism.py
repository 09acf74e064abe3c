"""The realism index: statistics, distances, the human ceiling, and the ordering it must give on a fixture corpus
whose people are the sampled native persuadee (a collapsed simulator ranks below the ceiling and the sampled ones)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from simpop.cli import main
from simpop.evaluation.diversity import semantic_diversity
from simpop.evaluation.realism import (STATISTICS, Conversation, Sample, Turn, ceiling, counts, distance, finish,
                                       human_reference, score, shipped_reference, simulator_conversations)

from tests.envs.persuasion.p4g_fixture import write_p4g_corpus


def embed(texts):
    """A deterministic bag-of-words embedder (normalised), so that text statistics need no model here."""
    out = np.zeros((len(texts), 64))
    for i, text in enumerate(texts):
        for word in text.lower().split():
            out[i, sum(map(ord, word)) % 64] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms > 0, norms, 1.0)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """People: 240 annotated dialogues of the sampled native persuadee facing the reference persuader."""
    directory = write_p4g_corpus(tmp_path_factory.mktemp("people"), n_dialogues=240, n_annotated=240, seed=11)
    return human_reference(str(directory), embed=embed, replicates=60)


def test_statistics_of_handmade_conversations():
    act = Conversation(0.5, [Turn("greeting", "greeting"), Turn("emotion-appeal", "positive-reaction-to-donation"),
                             Turn("proposition-of-donation", "agree-donation")], "act")
    c = counts(act)
    assert finish("donor_rate", c["donor_rate"]) == 1.0 and finish("decision_rate", c["decision_rate"]) == 1.0
    assert finish("decision_turn", c["decision_turn"])[2] == 1.0 and finish("amount", c["amount"])[3] == 1.0
    assert finish("cooperation", c["cooperation"]) == pytest.approx(2 / 3)
    response = finish("strategy_response", c["strategy_response"])
    assert response[1].tolist() == [1.0, 0.0, 0.0, 0.0] and np.isnan(response[0]).all()
    text = Conversation(0.0, [Turn("Hi there, how are you?", "Hi, I'm fine."),
                              Turn("Imagine a child in a war zone going to bed hungry tonight.", "Yes, that's sad."),
                              Turn("Will you donate?", "No, I won't donate anything.")], "text")
    c = counts(text)
    assert finish("decision_rate", c["decision_rate"]) == 1.0 and finish("decision_turn", c["decision_turn"])[2] == 1
    assert finish("agreement", c["agreement"]) == pytest.approx(1 / 3)
    assert finish("reply_length", c["reply_length"])[1] == pytest.approx(2 / 3)
    assert distance("donor_rate", 0.2, 0.5) == pytest.approx(0.3)
    assert distance("amount", [1, 0], [0.5, 0.5]) == pytest.approx(0.5)
    assert distance("strategy_response", [[1, 0], [np.nan, np.nan]], [[0, 1], [1, 0]]) == pytest.approx(1.0)
    assert set(STATISTICS) >= {"donor_rate", "semantic_diversity", "strategy_response"}


def test_weighted_semantic_diversity_is_the_pairwise_one():
    replies = ["yes I will", "no thanks", "maybe later", "I love children", "how much?"]
    conversations = [Conversation(0.0, [Turn("hello", r)], "text") for r in replies]
    sample = Sample(conversations, "text", embed)
    assert sample.statistics()["semantic_diversity"] == pytest.approx(semantic_diversity(replies, embed))
    w = np.array([2, 0, 1, 1, 0])  # a bootstrap draw: pairs of draws from different dialogues only
    v = embed(replies)
    pairs = [(i, j) for i in range(5) for j in range(5) if i != j]
    expected = 1 - sum(w[i] * w[j] * v[i] @ v[j] for i, j in pairs) / sum(w[i] * w[j] for i, j in pairs)
    assert sample.statistics(w)["semantic_diversity"] == pytest.approx(expected)


def test_collapsed_simulator_ranks_below_people_and_sampled_simulators(reference):
    scores = {spec: score(simulator_conversations(spec, "act", 64, seed=3), reference, "act", spec, seed=3)
              for spec in ("persuadee?decoding=greedy&personas=modal", "persuadee", "verbalized:persuadee")}
    collapsed = scores.pop("persuadee?decoding=greedy&personas=modal")
    assert collapsed.ceiling_size == 64 and collapsed.ci[0] <= collapsed.index <= collapsed.ci[1]
    assert collapsed.ci[1] < collapsed.ceiling_ci[0]  # below the human ceiling, CIs apart
    for sampled in scores.values():
        assert collapsed.ci[1] < sampled.ci[0]  # below every sampled simulator, CIs apart
        assert sampled.ci[1] > sampled.ceiling_ci[0]  # the people's own process reaches the ceiling
    assert collapsed.distances["amount"] > 0.5  # one amount for every donor


def test_text_level_scores_and_the_ceiling(reference):
    people = reference["levels"]["text"]
    assert set(people["point"]) == {n for n, (levels, _) in STATISTICS.items() if "text" in levels}
    assert len(people["replicates"]) == 60 and set(people["ceiling"]) == {"8", "16", "32", "64"}
    s = score(simulator_conversations("persuadee", "text", 8, seed=1), reference, "text", "persuadee", embed)
    assert s.ceiling_size == 8 and not math.isnan(s.index) and s.ci[0] <= s.ci[1]
    sample = Sample([Conversation(0.1, [Turn("greeting", "greeting")], "act")] * 4, "act")
    assert ceiling(sample, 2, 3, 0) == [1.0, 1.0, 1.0]  # identical dialogues: identical statistics


def test_shipped_reference_and_cli(tmp_path, reference, capsys):
    shipped = shipped_reference()
    assert shipped["corpus"]["commit"] and shipped["command"].startswith("simpop fit-p4g")
    assert shipped["levels"]["act"]["dialogues"] > 250 and shipped["levels"]["text"]["dialogues"] > 900
    out = tmp_path / "audit"
    assert main(["audit", "--realism", "--act-sim", "persuadee", "--act-episodes", "16", "--out", str(out)]) == 0
    summary = json.loads((out / "realism.json").read_text())
    assert summary["reference"]["source"] == "shipped" and summary["scores"][0]["spec"] == "persuadee"
    assert "| `persuadee` | 16 |" in (out / "realism.md").read_text()
    capsys.readouterr()
    assert main(["audit", "--realism", "--act-episodes", "1", "--out", str(out)]) == 2
    assert "from 2 to 100000" in capsys.readouterr().err
    assert main(["audit", "--realism", "--corpus", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "no such folder" in capsys.readouterr().err
