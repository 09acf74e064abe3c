"""The one run loop (simpop.train.loop.run): metrics, checkpoints, evaluation schedule, exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import simpop
from simpop.agents.policy import ModelConfig, build_policy
from simpop.envs.persuasion.simulators import native_act
from simpop.evaluation.metrics import WALL_CLOCK_KEYS
from simpop.rollout import RolloutEngine
from simpop import checkpoint
from simpop.train import loop
from simpop.train.grpo import GRPOConfig, GRPOTrainer

ENV = "simpop/PersuasionAct-v0"


class Counter:
    """A Trainer whose only state is a counter and one weight; step k reports ``{"value": w}``."""

    policy = None
    training_simulator = None

    def __init__(self) -> None:
        self.update_count = 0
        self.weight = 0.0

    def step(self) -> dict[str, float]:
        self.update_count += 1
        self.weight += 0.5
        return {"value": self.weight}

    def state_dict(self) -> dict:
        return {"update_count": self.update_count, "weight": self.weight}

    def load_state_dict(self, state: dict) -> None:
        self.update_count, self.weight = state["update_count"], state["weight"]


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _saved_steps(run_dir) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in checkpoint.checkpoint_dir(run_dir).glob("step_*.pt"))


def test_counter_is_a_trainer():
    assert isinstance(Counter(), loop.Trainer)


def test_evaluation_at_zero_every_eval_every_and_at_the_end_with_checkpoints(tmp_path):
    trainer, calls, reported = Counter(), [], []

    def evaluate(step: int) -> dict:
        calls.append((step, trainer.update_count))  # evaluated after the step's update
        return {"score": 10.0 * step}

    config = loop.LoopConfig(save_every=100, keep_checkpoints=10, eval_every=3, report_to="none")
    history = loop.run(trainer, 7, tmp_path, config=config, evaluate=evaluate,
                       report=lambda step, record: reported.append((step, record["kind"])))
    assert history == [{"value": 0.5 * k} for k in range(1, 8)]
    assert calls == [(0, 0), (3, 3), (6, 6), (7, 7)]
    records = _records(tmp_path)
    assert [(r["step"], r["kind"]) for r in records] == [
        (0, "eval"), (1, "train"), (2, "train"), (3, "train"), (3, "eval"), (4, "train"), (5, "train"),
        (6, "train"), (6, "eval"), (7, "train"), (7, "eval")]
    assert reported == [(r["step"], r["kind"]) for r in records]  # the reporter sees every record
    assert [r["score"] for r in records if r["kind"] == "eval"] == [0.0, 30.0, 60.0, 70.0]
    assert records[1] == {"step": 1, "kind": "train", "value": 0.5}
    # save_every is far away: the checkpoints are exactly the evaluation steps (and the last one)
    assert _saved_steps(tmp_path) == [0, 3, 6, 7]
    for step in (0, 3, 6, 7):
        saved_step, state = checkpoint.load(checkpoint.checkpoint_dir(tmp_path) / f"step_{step:07d}.pt",
                                            restore_rng=False)
        assert saved_step == step and state == {"update_count": step, "weight": 0.5 * step}
    assert not (tmp_path / "tb").exists()  # report_to="none"


def test_without_evaluation_checkpoints_every_save_every_and_after_the_last(tmp_path):
    loop.run(Counter(), 5, tmp_path, config=loop.LoopConfig(save_every=2, keep_checkpoints=10))
    assert _saved_steps(tmp_path) == [2, 4, 5]
    assert [(r["step"], r["kind"]) for r in _records(tmp_path)] == [(k, "train") for k in range(1, 6)]
    loop.run(Counter(), 5, tmp_path / "few", config=loop.LoopConfig(save_every=1, keep_checkpoints=2))
    assert _saved_steps(tmp_path / "few") == [4, 5]


def test_no_run_dir_keeps_nothing_on_disk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = Counter()
    history = loop.run(trainer, 3, evaluate=lambda step: {"score": 1.0})
    assert len(history) == 3 and trainer.update_count == 3
    assert list(tmp_path.iterdir()) == []
    assert loop.run(Counter(), 0) == []


def test_resume_does_not_repeat_the_step_zero_evaluation_and_stops_when_done(tmp_path):
    config = loop.LoopConfig(eval_every=2, report_to="none")
    evaluated = []

    def evaluate(step: int) -> dict:
        evaluated.append(step)
        return {"score": float(step)}

    loop.run(Counter(), 3, tmp_path, config=config, evaluate=evaluate)
    assert evaluated == [0, 2, 3]
    resumed = Counter()
    history = loop.run(resumed, 5, tmp_path, config=config, resume=True, evaluate=evaluate)
    assert resumed.update_count == 5 and history == [{"value": 2.0}, {"value": 2.5}]  # weight restored
    assert evaluated == [0, 2, 3, 4, 5]
    assert [(r["step"], r["kind"]) for r in _records(tmp_path)] == [
        (0, "eval"), (1, "train"), (2, "train"), (2, "eval"), (3, "train"), (3, "eval"), (4, "train"), (4, "eval"),
        (5, "train"), (5, "eval")]
    # already at the requested number of updates: nothing to do, the log is kept
    assert loop.run(Counter(), 5, tmp_path, config=config, resume=True, evaluate=evaluate) == []
    assert evaluated == [0, 2, 3, 4, 5] and len(_records(tmp_path)) == 10


def test_resume_without_a_checkpoint_starts_afresh(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "kind": "train", "value": 99}\n')
    trainer = Counter()
    assert len(loop.run(trainer, 2, tmp_path, resume=True)) == 2
    assert [r["value"] for r in _records(tmp_path)] == [0.5, 1.0]  # the stray log was replaced


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="resume=True needs the run_dir"):
        loop.run(Counter(), 3, resume=True)
    with pytest.raises(ValueError, match="updates must be >= 0, got -1"):
        loop.run(Counter(), -1)
    for key in ("save_every", "keep_checkpoints", "eval_every"):
        with pytest.raises(ValueError, match=f"{key} must be >= 1"):
            loop.LoopConfig(**{key: 0})


# ---------------------------------------------------------------------- exact resume of a killed GRPO run
SMALL = GRPOConfig(group_size=4, scenarios_per_update=3, epochs=2, kl_coef=0.02, seed=5)
CONFIG = loop.LoopConfig(save_every=2, eval_every=3, keep_checkpoints=10)


def _grpo(seed: int = SMALL.seed) -> GRPOTrainer:
    env = simpop.make(ENV)
    config = GRPOConfig(**{**SMALL.__dict__, "seed": seed})
    return GRPOTrainer(ENV, build_policy(env, ModelConfig(hidden_size=16), seed=config.seed), native_act(env), config)


def _evaluation(trainer: GRPOTrainer):
    """Success on a fixed set of dialogues (uses the global numpy RNG too, which checkpoints restore)."""
    def evaluate(step: int) -> dict:
        engine = RolloutEngine(ENV, trainer.policy, native_act(simpop.make(ENV)))
        trajectories = engine.collect(8, group_size=1, seed=77)
        return {"eval_success": float(np.mean([t.success for t in trajectories])), "noise": float(np.random.rand())}
    return evaluate


def _killed_at(trainer: GRPOTrainer, call: int) -> GRPOTrainer:
    """The trainer dies (like a killed process) when ``step`` is called for the ``call``-th time."""
    step, calls = trainer.step, []

    def dying_step():
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt("killed")
        return step()

    trainer.step = dying_step  # type: ignore[method-assign]
    return trainer


def _comparable(run_dir) -> list[str]:
    """metrics.jsonl lines with the wall-clock fields removed, as exact JSON text."""
    return [json.dumps({k: v for k, v in r.items() if k not in WALL_CLOCK_KEYS}, sort_keys=True)
            for r in _records(run_dir)]


def test_resumed_killed_grpo_run_writes_the_uninterrupted_metrics_bit_for_bit(tmp_path):
    np.random.seed(123)
    straight = _grpo()
    loop.run(straight, 7, tmp_path / "straight", config=CONFIG, evaluate=_evaluation(straight))

    np.random.seed(123)
    dying = _killed_at(_grpo(), call=6)  # dies in update 6: the last checkpoint is step 4 (save_every=2)
    with pytest.raises(KeyboardInterrupt):
        loop.run(dying, 7, tmp_path / "killed", config=CONFIG, evaluate=_evaluation(dying))
    assert [r["step"] for r in _records(tmp_path / "killed")][-1] == 5  # step 5 was logged, not checkpointed
    assert checkpoint.latest(tmp_path / "killed").name == "step_0000004.pt"
    with (tmp_path / "killed" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "kind": "tra')  # and it died writing the next line

    np.random.seed(999)  # whatever the new process's global RNG: the checkpoint restores it
    resumed = _grpo()
    history = loop.run(resumed, 7, tmp_path / "killed", config=CONFIG, resume=True, evaluate=_evaluation(resumed))
    assert len(history) == 3 and resumed.update_count == 7

    expected, got = _comparable(tmp_path / "straight"), _comparable(tmp_path / "killed")
    assert [(json.loads(x)["step"], json.loads(x)["kind"]) for x in expected] == [
        (0, "eval"), (1, "train"), (2, "train"), (3, "train"), (3, "eval"), (4, "train"), (5, "train"),
        (6, "train"), (6, "eval"), (7, "train"), (7, "eval")]
    assert got == expected
    for a, b in zip(straight.policy.state_dict().values(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b)
    assert _saved_steps(tmp_path / "straight") == [0, 2, 3, 4, 6, 7]

    other = _grpo(seed=6)  # the comparison can fail: another seed writes other numbers
    loop.run(other, 1, tmp_path / "other", config=CONFIG)
    assert _comparable(tmp_path / "other")[0] != expected[1]
