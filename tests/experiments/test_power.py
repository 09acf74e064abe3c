"""Sizing a comparison from a pilot (simpop.experiments.power, ``simpop experiment collapse --plan``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from simpop.cli import main
from simpop.experiments.power import plan, power, read_summary, seeds_needed, variances


def _summary(frozen, others, episodes=64, human_panel="p4g-act-human-v1"):
    metrics = lambda values: {"human_success": {"per_seed": list(values)}}  # noqa: E731
    return {"setup": {"eval_episodes": episodes, "config": {"human_panel": human_panel}},
            "conditions": {"frozen": {"metrics": metrics(frozen)},
                           **{name: {"metrics": metrics(v)} for name, v in others.items()}}}


def test_seeds_needed_matches_the_normal_approximation_and_power_is_finite_far_in_the_tail():
    # n ~ ((z_{1-a/2} + z_power) sd / d)^2 + z_{1-a/2}^2 / 2 (Guenther's correction for the t distribution)
    for sd, alpha in ((0.09, 0.05), (0.1, 0.05 / 8)):
        z = stats.norm.ppf(1 - alpha / 2)
        n = seeds_needed(0.05, sd, alpha)
        assert abs(n - (((z + stats.norm.ppf(0.8)) * sd / 0.05) ** 2 + z**2 / 2)) <= 1
        assert power(n, 0.05, sd, alpha) >= 0.8 > power(n - 1, 0.05, sd, alpha)
    # scipy's noncentral t returns NaN here; the search must still see power near 1
    assert power(5001, 0.05, 0.124, 0.05 / 8) == pytest.approx(1.0)
    assert seeds_needed(0.05, 0.124, 0.05 / 8) == seeds_needed(0.05, 0.124, 0.05 / 8, 0.8)
    assert power(1, 0.05, 0.1, 0.05) == 0.0


def test_variance_is_split_into_seeds_and_evaluation():
    rng = np.random.default_rng(0)
    frozen = rng.uniform(0.3, 0.6, 12)
    others = {"a": frozen + rng.normal(0.05, 0.1, 12), "b": frozen + rng.normal(0.0, 0.05, 12)}
    (v,) = variances([_summary(frozen, others)])
    n = 64 * 3  # the human-fitted panel has three members
    totals = [np.var(x - frozen, ddof=1) for x in others.values()]
    evals = [np.mean(x * (1 - x) + frozen * (1 - frozen)) / n for x in others.values()]
    assert v.panel == "human" and v.dialogues == n and v.comparisons == ["a", "b"]
    assert v.total == pytest.approx(np.mean(totals)) and v.eval == pytest.approx(np.mean(evals))
    assert v.seed == pytest.approx(max(np.mean(totals) - np.mean(evals), 0.0)) and v.largest == max(totals)
    assert v.sd(4) == pytest.approx(math.sqrt(v.seed + v.eval / 4)) and v.sd(4) < v.sd(1)


def test_plan_prints_seeds_per_evaluation_size(tmp_path):
    rng = np.random.default_rng(1)
    frozen = rng.uniform(0.3, 0.6, 12)
    pilot = tmp_path / "pilot"
    pilot.mkdir()
    (pilot / "summary.json").write_text(json.dumps(_summary(frozen, {"v": frozen + rng.normal(0, 0.1, 12)})))
    text = plan([pilot], 0.05, 8)
    assert "human panel" in text and "alpha 0.05 / 8" in text
    rows = [line.split() for line in text.splitlines() if line.strip() and line.split()[0] in ("64", "128", "256",
                                                                                               "512")]
    assert [r[0] for r in rows] == ["64", "128", "256", "512"]
    seeds = [int(r[2]) for r in rows]
    assert seeds == sorted(seeds, reverse=True)  # more evaluation never needs more seeds
    assert int(plan([pilot], 0.1, 8).splitlines()[4].split()[2]) < seeds[0]  # a larger difference needs fewer


def test_unusable_pilots_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="no summary.json"):
        read_summary(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"setup": {}, "conditions": {"verbalized": {}}}))
    with pytest.raises(ValueError, match="frozen"):
        read_summary(tmp_path)
    (tmp_path / "summary.json").write_text("{")
    with pytest.raises(ValueError, match="not readable JSON"):
        read_summary(tmp_path)
    one = tmp_path / "one.json"
    one.write_text(json.dumps(_summary([0.5], {"v": [0.6]})))
    with pytest.raises(ValueError, match="two or more seeds"):
        plan([one], 0.05, 1)
    assert main(["experiment", "collapse", "--plan", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no summary.json" in err


def test_cli_plan_counts_the_comparisons_with_frozen(tmp_path, capsys):
    rng = np.random.default_rng(2)
    frozen = rng.uniform(0.3, 0.6, 12)
    (tmp_path / "summary.json").write_text(json.dumps(_summary(frozen, {"v": frozen + rng.normal(0, 0.1, 12)})))
    assert main(["experiment", "collapse", "--plan", str(tmp_path), "--conditions", "frozen", "verbalized",
                 "rotation", "--plan-difference", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "difference of 0.1" in out and "alpha 0.05 / 2 comparison(s)" in out
    assert not (tmp_path / "runs").exists()  # a plan runs nothing
