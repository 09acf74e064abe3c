"""The confirmatory study's analysis (simpop.experiments.study): Holm, merging blocks, the recommendation rule."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simpop.experiments.study import analyse, holm, main, merge, recommend, table

METRICS = ("human_success", "heldout_success", "robust_success", "cpu_s_per_update", "realism_index")


def _block(first, shifts, n=6, cost=None, secondary=None, seed=0):
    """A block summary: frozen plus conditions whose human-fitted success is frozen's + shift + a zero-mean wobble."""
    rng = np.random.default_rng(seed + first)
    base = rng.uniform(0.4, 0.5, n)
    conditions = {}
    for name, shift in {"frozen": 0.0, **shifts}.items():
        wobble = rng.uniform(0.005, 0.015) * np.tile([1.0, -1.0], n // 2)  # mean 0: no shift, no difference
        values = {"human_success": base + shift + wobble,
                  "heldout_success": base + (secondary or {}).get(name, 0.0), "robust_success": base,
                  "cpu_s_per_update": np.full(n, (cost or {}).get(name, 0.03)), "realism_index": np.full(n, 0.7)}
        conditions[name] = {"metrics": {m: {"per_seed": list(map(float, values[m]))} for m in METRICS}}
    return {"setup": {"seeds": list(range(first, first + n)), "eval_episodes": 128,
                      "config": {"first_seed": first, "seeds": n, "human_panel": "p4g-act-human-v1"}},
            "conditions": conditions}


def test_holm_matches_the_step_down_definition():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([0.02, 0.02]) == pytest.approx([0.04, 0.04])


def test_blocks_merge_by_seed_and_must_share_the_plan():
    seeds, values = merge([_block(0, {"a": 0.1}), _block(6, {"a": 0.1})])
    assert seeds == list(range(12)) and len(values["a"]["human_success"]) == 12
    with pytest.raises(ValueError, match="share seeds"):
        merge([_block(0, {"a": 0.1}), _block(0, {"a": 0.1})])
    other = _block(6, {"a": 0.1})
    other["setup"]["config"]["seeds"] = 12
    with pytest.raises(ValueError, match="different settings"):
        merge([_block(0, {"a": 0.1}), other])


def test_the_rule_recommends_the_cheapest_of_the_best_and_flags_the_rest():
    blocks = [_block(f, {"fast": 0.10, "slow": 0.11, "none": 0.0, "bad": -0.1, "lopsided": 0.2},
                     cost={"fast": 0.02, "slow": 0.09, "lopsided": 0.01}, secondary={"lopsided": -0.2})
              for f in (0, 6)]
    result = analyse(blocks, planned_seeds=54)
    rows = result["rows"]
    assert result["interim"] and result["seeds"] == list(range(12))
    assert {n: rows[n]["verdict"] for n in rows if n != "frozen"} == {
        "fast": "better with people", "slow": "better with people", "none": "no difference shown",
        "bad": "worse with people", "lopsided": "better with people"}
    assert result["recommended"] == "fast"  # within 0.02 of slow's mean and cheaper
    assert rows["slow"]["recommendation"] == "also transfers" and rows["bad"]["recommendation"] == "avoid"
    assert rows["lopsided"]["recommendation"] == "not recommended: worse on the held-out panel"
    assert rows["none"]["recommendation"] == "no gain shown" and rows["frozen"]["recommendation"] == "baseline"
    assert rows["slow"]["cost_ratio"] == pytest.approx(3.0)
    assert rows["fast"]["human_difference"]["p_holm"] >= rows["fast"]["human_difference"]["p"]
    assert "| recommended (interim) |" in table(result)  # nothing is acted on before the planned seeds


def test_without_a_better_condition_nothing_is_recommended():
    result = analyse([_block(0, {"a": 0.0, "b": -0.1}, cost={"a": 0.01})], planned_seeds=6)
    assert result["recommended"] is None and "cheapest condition not worse with people is a" in result["reason"]
    assert not result["interim"]
    rows = {"frozen": {}, "x": {"verdict": "no difference shown", "heldout_difference": {"ci_high": 1},
                                "robust_difference": {"ci_high": 1}, "cpu_s_per_update": {"mean": 1}}}
    rows["frozen"]["cpu_s_per_update"] = {"mean": 2}
    assert recommend(rows)[0] is None


def test_cli_writes_the_table_and_plots(tmp_path, capsys):
    for first in (0, 6):
        (tmp_path / f"block-{first}").mkdir()
        (tmp_path / f"block-{first}" / "summary.json").write_text(json.dumps(_block(first, {"a": 0.1})))
    out = tmp_path / "out"
    assert main([str(out), str(tmp_path / "block-0"), str(tmp_path / "block-6"), "--planned-seeds", "12"]) == 0
    assert {p.name for p in out.iterdir()} == {"study-summary.json", "table.md", "human_success_per_seed.png",
                                              "human_difference_per_seed.png"}
    assert "| a |" in (out / "table.md").read_text() and "INTERIM" not in capsys.readouterr().out
    assert main([str(out), str(tmp_path / "missing")]) == 2
    assert "no summary.json" in capsys.readouterr().err
