"""The defaults grid (simpop.experiments.defaults): runs, resume, the rule, and the defaults it picked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simpop.experiments import defaults
from simpop.experiments.defaults import DefaultsConfig, grpo_cell, outcome, pick, run_defaults

ROOT = Path(__file__).resolve().parents[2]


def test_grid_writes_each_run_and_a_summary_and_skips_finished_runs(tmp_path: Path, monkeypatch) -> None:
    grids = {"grpo": (grpo_cell(2, 2, 1e-2, 0.0), grpo_cell(2, 3, 3e-2, 0.1))}
    config = DefaultsConfig(trainers=("grpo",), seeds=(7,), updates=2, episodes=2, window=2, variants=False)
    table = run_defaults(config, tmp_path, grids, log=lambda line: None)

    for cell in grids["grpo"]:
        run = tmp_path / "grpo" / cell.name / "seed-7"
        result = json.loads((run / "result.json").read_text())
        assert set(result) == {"seed", "untrained", "heldout", "collapsed", "zero_var_tail", "wall_s"}
        assert 0 <= result["heldout"] <= 1 and 0 <= result["untrained"] <= 1 and result["wall_s"] > 0
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line)["kind"] == "eval"]
        assert steps == [0, 2]  # the untrained policy and the trained one
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = summary["grids"]["grpo"]["rows"]
    assert list(rows) == ["g2x2-lr0.01-kl0", "g2x3-lr0.03-kl0.1"]
    assert rows["g2x3-lr0.03-kl0.1"]["cost"] == 6 and rows["g2x2-lr0.01-kl0"]["seeds"] == 1
    assert summary["grids"]["grpo"]["picked"] is None  # one seed gives no interval: nothing is eligible
    assert "g2x2-lr0.01-kl0" in table.read_text()

    calls: list[list[str]] = []
    real = defaults.run_one

    def counted(config, trainer, flags, seed, run_dir):
        if not (run_dir / "result.json").exists():
            calls.append(list(flags))
        return real(config, trainer, flags, seed, run_dir)

    monkeypatch.setattr(defaults, "run_one", counted)
    run_defaults(config, tmp_path, grids, log=lambda line: None)
    assert calls == []  # every run finished: nothing runs again
    (tmp_path / "grpo" / "g2x2-lr0.01-kl0" / "seed-7" / "result.json").unlink()  # as if killed mid-run
    run_defaults(config, tmp_path, grids, log=lambda line: None)
    assert calls == [list(grids["grpo"][0].flags)]


def test_outcome_marks_a_run_collapsed_only_when_its_whole_last_window_has_no_variance() -> None:
    evals = [{"kind": "eval", "step": 0, "heldout_success": 0.2}, {"kind": "eval", "step": 5, "heldout_success": 0.0}]
    train = [{"kind": "train", "step": s, "zero_var_frac": z} for s, z in enumerate([0.5, 1.0, 1.0, 1.0, 1.0], 1)]
    assert outcome(evals + train, updates=5, window=4)["collapsed"]
    assert not outcome(evals + train, updates=5, window=5)["collapsed"]
    assert outcome(evals + train, updates=5, window=4)["untrained"] == 0.2
    ppo = [{"kind": "train", "step": 1, "entropy": 1.0}]  # no groups: never collapsed
    assert not outcome(evals + ppo, updates=5, window=1)["collapsed"]


def _row(mean: float, gain_low: float, cost: int, kl: float = 0.0, collapsed: int = 0, complete: bool = True):
    return {"heldout": {"mean": mean}, "gain": {"ci_low": gain_low}, "cost": cost, "kl_coef": kl,
            "collapsed": collapsed, "complete": complete,
            "eligible": complete and not collapsed and gain_low > 0}


def test_pick_takes_the_cheapest_eligible_cell_within_the_tie_margin_of_the_best() -> None:
    rows = {"big": _row(0.60, 0.1, 64), "small": _row(0.59, 0.1, 16, kl=0.1), "small-nokl": _row(0.585, 0.1, 16),
            "collapsed": _row(0.9, 0.1, 8, collapsed=1), "no-gain": _row(0.8, -0.01, 8)}
    assert pick(rows)[0] == "small-nokl"  # within 0.02 of 0.60, 16 dialogues, no KL pass
    rows["big"] = _row(0.65, 0.1, 64)
    assert pick(rows)[0] == "big"  # the others are now more than 0.02 behind
    assert pick({"a": _row(0.5, -0.1, 16)})[0] is None
    assert pick({"a": _row(0.9, 0.1, 16), "b": _row(0.5, 0.1, 8, complete=False)})[0] is None  # incomplete grid


def test_the_trainers_defaults_are_the_grids_picks() -> None:
    """The shipped defaults are the cells the study's rule picked (docs/defaults-study/summary.json)."""
    from simpop.train.grpo import DEFAULT_LR, GRPOConfig
    from simpop.train.ppo import PPOConfig

    summary = json.loads((ROOT / "docs" / "defaults-study" / "summary.json").read_text())
    shipped = {"grpo": GRPOConfig(), "ppo": PPOConfig()}
    flags = {"grpo": {"--group-size": "group_size", "--scenarios-per-update": "scenarios_per_update",
                      "--kl-coef": "kl_coef"},
             "ppo": {"--n-envs": "n_envs", "--n-steps": "n_steps", "--lr": "lr", "--ent-coef": "ent_coef"}}
    for trainer, part in summary["grids"].items():
        if part["picked"] is None:
            continue
        cell = next(c for c in defaults.GRIDS[trainer] if c.name == part["picked"])
        given = dict(zip(cell.flags[::2], cell.flags[1::2]))
        for flag, field in flags[trainer].items():
            assert float(getattr(shipped[trainer], field)) == pytest.approx(float(given[flag])), (trainer, field)
        if trainer == "grpo":  # lr None picks the act-level rate
            assert DEFAULT_LR["act"] == pytest.approx(float(given["--lr"]))


def test_experiment_defaults_refuses_bad_settings_in_one_line(tmp_path: Path, capsys) -> None:
    from simpop.cli import main

    assert main(["experiment", "defaults", "--out", str(tmp_path / "x"), "--panel", "p4g-text-v1"]) == 2
    assert "p4g-text-v1" in capsys.readouterr().err
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "summary.json").write_text("{}")
    assert main(["experiment", "defaults", "--out", str(tmp_path / "y"), "--updates", "2"]) == 2
    assert "--resume" in capsys.readouterr().err
