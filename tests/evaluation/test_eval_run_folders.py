"""``simpop eval --policy run:DIR`` on every kind of run folder the project writes: each run of ``simpop experiment
collapse`` / ``adaptive`` / ``monitor`` (tiny budgets, act level); ``simpop train`` runs are
``test_eval_policies.py::test_a_real_training_run_evaluates``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import simpop
from simpop import checkpoint
from simpop.cli import main
from simpop.evaluation.policies import PolicySpecError, load_policy

ENV = "simpop/PersuasionAct-v0"
EVAL = ["eval", "--env", ENV, "--panel", "p4g-act-v1", "--episodes", "2", "--no-progress"]
GRPO = ["--grpo.group-size", "2", "--grpo.scenarios-per-update", "2"]


def _evaluates(run: Path, tmp_path: Path, capsys) -> None:
    """The run's policy loads with its newest checkpoint's weights, and simpop eval runs it on a panel."""
    env = simpop.make(ENV)
    policy = load_policy(f"run:{run}", env, env_id=ENV)
    _, state = checkpoint.load(checkpoint.latest(run), restore_rng=False)
    while "policy" not in state:
        state = state.get("policy_trainer") or state["inner"]
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in state["policy"].items())
    out = tmp_path / f"eval-{run.parent.name}-{run.name}"
    capsys.readouterr()
    assert main([*EVAL, "--policy", f"run:{run}", "--out", str(out)]) == 0, capsys.readouterr().err
    assert f"is held out from the simulators of {run}" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["episodes"] == 2 * 3  # 3 members x 2


def test_collapse_runs_of_every_trainer(tmp_path, capsys):
    out = tmp_path / "collapse"
    assert main(["experiment", "collapse", "--out", str(out), "--seeds", "1", "--conditions", "frozen", "population",
                 "--updates", "1", "--eval-every", "1", "--eval-episodes", "2", "--max-turns", "4", "--workers", "1",
                 "--no-robust-panel", *GRPO, "--cotrain.population-size", "2", "--cotrain.pool-size", "2",
                 "--quiet"]) == 0
    for condition in ("frozen", "population"):
        _evaluates(out / "runs" / condition / "seed0", tmp_path, capsys)


def test_adaptive_pool_runs(tmp_path, capsys):
    out = tmp_path / "adaptive"
    assert main(["experiment", "adaptive", "--out", str(out), "--seeds", "1", "--conditions", "failure",
                 "--updates", "2", "--eval-every", "2", "--eval-episodes", "2", "--grow-every", "1", "--max-turns", "4",
                 "--workers", "1", "--pool.probe-episodes", "4", "--pool.cap", "2", *GRPO, "--quiet"]) == 0
    run = out / "runs" / "failure" / "seed0"
    _evaluates(run, tmp_path, capsys)


def test_monitor_runs(tmp_path, capsys):
    out = tmp_path / "monitor"
    assert main(["experiment", "monitor", "--out", str(out), "--seeds", "1", "--conditions", "frozen",
                 "--updates", "2", "--eval-every", "1", "--eval-episodes", "2", "--probe-every", "1",
                 "--probe-episodes", "2", "--workers", "1"]) == 0
    _evaluates(out / "runs" / "frozen" / "seed0", tmp_path, capsys)


def test_an_experiment_run_from_before_run_cards_says_how_to_fill_them_in(tmp_path):
    out = tmp_path / "old"
    run = out / "runs" / "frozen" / "seed0"
    (run / "checkpoints").mkdir(parents=True)
    (out / "config.json").write_text("{}")
    with pytest.raises(PolicySpecError, match=f"--out {out} --resume"):
        load_policy(f"run:{run}", simpop.make(ENV))
