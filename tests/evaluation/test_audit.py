"""``simpop audit`` on a fake backend, and one small run of the embedded model through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

import simpop
from simpop.cli import main
from simpop.envs.dialogue import parse_observation
from simpop.envs.persuasion.outcome import parse_donation
from simpop.evaluation.audit import HISTORIES, audit, observation_for, outcome_label, render_report, \
    select_histories, write
from tests.simulators.fakes import PHRASES, FakeBackend, verbalized_json


def test_histories_cover_the_stages_and_replay_in_the_env():
    assert len(HISTORIES) >= 8 and len({h.id for h in HISTORIES}) == len(HISTORIES)
    env = simpop.make("simpop/Persuasion-v0")
    for history in HISTORIES:
        assert len(history.turns) % 2 == 1  # ends with the persuader's message
        assert all(parse_donation(t) is None for t in history.turns[1::2]), history.id
        messages = parse_observation(observation_for(env, history, "p4g-0003", seed=0))["messages"]
        assert [m["content"] for m in messages] == list(history.turns)
        assert {m["role"] for m in messages[::2]} == {"user"}


def test_outcome_labels():
    assert [outcome_label(t) for t in ["Sure [DONATE $0.50]", "No thanks, I'll pass.", "Tell me more."]] == [
        "donate", "refuse", "undecided"]


def respond(chat, params, rng):
    """Verbalized: a clean answer when asked to donate, prose otherwise; plain: greedy mode or a phrase."""
    if "JSON" in chat[0]["content"]:
        if "donate" in chat[-1]["content"]:
            return verbalized_json(("Yes [DONATE $1]", 0.5), ("No thanks [DONATE $0]", 0.3), ("Why?", 0.2))
        return "I am just a small model."
    return PHRASES[0] if params.greedy else PHRASES[int(rng.integers(len(PHRASES)))]


def embed(texts):
    """A fake embedder: one axis per distinct text (cosine 1 if equal, else 0)."""
    vocab = {t: i for i, t in enumerate(dict.fromkeys(texts))}
    return np.eye(len(vocab))[[vocab[t] for t in texts]]


def test_audit_measures_each_simulator_and_writes_reports(tmp_path):
    histories = select_histories("greeting,proposition,ask-amount")
    specs = ["frozen:fake", "frozen:fake?temperature=1.0", "verbalized:fake?k=3&floor=0.0"]
    summary = audit(specs, n=12, histories=histories, backends={"fake": FakeBackend(respond=respond)}, embed=embed,
                    progress=False)
    greedy, sampled, verbalized = (s["metrics"] for s in summary["simulators"])
    assert greedy["mode_share"] == 1.0 and greedy["semantic_diversity"] == 0.0 and greedy["outcome_entropy"] == 0.0
    assert greedy["distinct_1"] == pytest.approx(len({"sure", ",", "tell", "me", "more", "."}) / (6 * 12))
    assert sampled["mode_share"] < 1.0 and sampled["semantic_diversity"] > 0.5
    assert greedy["parse_failure_rate"] is None and greedy["format_repair_rate"] is None
    assert greedy["act_entropy"] is None
    rows = summary["simulators"][2]["per_history"]
    assert [r["parse_failure_rate"] for r in rows] == [1.0, 0.0, 0.0]  # "donate" is asked in the last two
    assert verbalized["parse_failure_rate"] == pytest.approx(1 / 3)
    assert rows[1]["outcome_entropy"] > 1.0
    assert set(rows[1]["replies"]) <= {"Yes [DONATE $1]", "No thanks [DONATE $0]", "Why?"}
    assert summary["simulators"][2]["resolved"].startswith(
        "verbalized:fake?constrained=True&fallback_max_new_tokens=64&fallback_temperature=1.0&floor=0.0&k=3")

    out = write(summary, tmp_path / "audit")
    saved = json.loads((out / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert saved["config"]["n"] == 12 and len(saved["simulators"]) == 3
    report = (out / "report.md").read_text()
    for spec in specs:
        assert f"| `{spec}` |" in report
    assert "n/a" in report and "1.000" in report


def test_the_verbalized_row_measures_verbalized_sampling_when_the_backend_constrains_its_output():
    def structured(chat, params, rng):  # a small model: prose unless its decoding is constrained
        if params.json_schema is None:
            return "Sounds good to me!" if "JSON" in chat[0]["content"] else PHRASES[int(rng.integers(len(PHRASES)))]
        return verbalized_json(("Yes [DONATE $1]", 0.5), ("No thanks [DONATE $0]", 0.3), ("Why?", 0.2))

    backend = FakeBackend(respond=structured)
    summary = audit(["verbalized:fake?k=3&floor=0.0", "verbalized:fake?k=3&floor=0.0&constrained=false"], n=12,
                    histories=select_histories("greeting,proposition"), backends={"fake": backend}, embed=embed,
                    progress=False)
    constrained, free = (s["metrics"] for s in summary["simulators"])
    assert constrained["parse_failure_rate"] == 0.0 and constrained["format_repair_rate"] == 0.0
    assert constrained["outcome_entropy"] > 1.0 and constrained["mode_share"] < 1.0
    assert free["parse_failure_rate"] == 1.0  # every reply is the plain-sampling fallback
    assert all(set(r["replies"]) <= set(PHRASES) for r in summary["simulators"][1]["per_history"])
    assert "VS format repairs" in render_report(summary)


def test_unknown_history_ids_are_listed():
    with pytest.raises(ValueError, match="valid: greeting"):
        select_histories("greeting,nope")


def test_cli_runs_the_embedded_model(tmp_path, capsys):
    import torch

    out = tmp_path / "audit"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny generations are latency-bound; two threads thrash on a shared CPU
    try:
        assert main(["audit", "--sim", "frozen:smollm2?max_new_tokens=6", "--sim",
                     "verbalized:smollm2?k=2&max_new_tokens=64&fallback_max_new_tokens=6", "--n", "2",
                     "--histories", "proposition", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    summary = json.loads((out / "summary.json").read_text())
    replies = [s["per_history"][0]["replies"] for s in summary["simulators"]]
    assert all(len(r) == 2 and all(isinstance(x, str) and x for x in r) for r in replies)
    assert replies[0][0] == replies[0][1]  # greedy: the same reply for both samples
    # Constrained decoding: the answer always parses (64 tokens hold a whole first candidate).
    assert summary["simulators"][1]["metrics"]["parse_failure_rate"] == 0.0
    assert "Simulator diversity audit" in capsys.readouterr().out
