"""GRPO variants (Dr. GRPO, DAPO, REINFORCE++) train at the act level; DAPO's dynamic sampling."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import simpop
from simpop.agents.policy import ModelConfig, build_policy
from simpop.simulators.registry import build_simulator
from simpop.train import loop, objectives
from simpop.train.grpo import Batch, GRPOConfig, GRPOTrainer

ENV = "simpop/PersuasionAct-v0"
GREEDY_MODAL = "persuadee?decoding=greedy&personas=modal"  # a frozen, mode-collapsed persuadee


def _trainer(algorithm: str, simulator: str = "native", **config) -> GRPOTrainer:
    env = simpop.make(ENV)
    cfg = GRPOConfig(**{"algorithm": algorithm, "group_size": 4, "scenarios_per_update": 4, "seed": 3, **config})
    return GRPOTrainer(ENV, build_policy(env, ModelConfig(hidden_size=32), seed=cfg.seed),
                       build_simulator(simulator, env), cfg)


def _recording(trainer: GRPOTrainer) -> list[Batch]:
    """Keep every batch the trainer updates on."""
    batches, update = [], trainer.update

    def recording_update(batch: Batch) -> dict[str, float]:
        batches.append(batch)
        return update(batch)

    trainer.update = recording_update  # type: ignore[method-assign]
    return batches


@pytest.mark.parametrize("algorithm", ["dr_grpo", "dapo", "reinforce_pp"])
def test_variant_trains_logs_and_changes_parameters(algorithm, tmp_path):
    trainer = _trainer(algorithm)
    assert trainer.objective == objectives.algorithm(algorithm)
    batches = _recording(trainer)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    history = loop.run(trainer, 3, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["kind"]) for r in records] == [(1, "train"), (2, "train"), (3, "train")]
    keys = {"reward_mean", "success", "zero_var_frac", "loss", "kl", "clip_frac", "grad_norm", "policy_entropy"}
    assert all(keys <= set(r) and np.isfinite([r[k] for k in keys]).all() for r in records)
    assert any(m["grad_norm"] > 0 for m in history)
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.policy.parameters()))
    # each update's advantages are the variant's own hook on the batch's returns
    for batch in batches:
        expected = objectives.algorithm(algorithm).advantages(batch.rewards, batch.groups)
        assert np.array_equal(batch.advantages, expected)
    if algorithm == "dapo":
        assert all({"refill_rounds", "refill_shortfall", "collected_zero_var_frac"} <= set(r) for r in records)
    else:
        assert not any("refill_rounds" in r for r in records)


def test_variants_share_rollouts_but_not_losses():
    """Without dynamic sampling, the same seed collects the same first batch; the hooks change the loss."""
    first = {name: _trainer(name).step() for name in ("grpo", "dr_grpo", "reinforce_pp")}
    assert len({m["reward_mean"] for m in first.values()}) == 1
    assert first["grpo"]["zero_var_frac"] < 1  # the batch has signal
    assert len({m["loss"] for m in first.values()}) == 3


def _informative(batch: Batch) -> bool:
    return all(np.ptp(batch.rewards[batch.groups == g]) > 0 for g in np.unique(batch.groups))


def test_dapo_dynamic_sampling_trains_only_on_informative_groups():
    """Against a greedy, modal persuadee many groups have equal rewards: DAPO refills them."""
    trainer = _trainer("dapo", GREEDY_MODAL, max_refill_rounds=8)
    batches = _recording(trainer)
    history = loop.run(trainer, 4)
    assert any(m["refill_rounds"] > 0 for m in history)  # some groups were replaced ...
    assert any(m["collected_zero_var_frac"] > 0 for m in history)  # ... because they had no signal
    for metrics, batch in zip(history, batches):
        assert metrics["refill_shortfall"] == 0 and metrics["zero_var_frac"] == 0.0
        assert _informative(batch) and len(batch.trajectories) == 16 and len(np.unique(batch.groups)) == 4
        assert batch.collected is not None and len(batch.collected) == 16 * (1 + metrics["refill_rounds"])
        assert [batch.collected[i].seed for i in batch.kept] == [t.seed for t in batch.trajectories]
        assert batch.stats.dialogues == len(batch.collected)  # rollout stats cover every round

    # Without refills the zero-variance groups are dropped and the update trains on fewer groups.
    trainer = _trainer("dapo", GREEDY_MODAL, max_refill_rounds=0)
    batches = _recording(trainer)
    history = loop.run(trainer, 4)
    assert all(m["refill_rounds"] == 0 for m in history)
    assert any(m["refill_shortfall"] > 0 for m in history)
    for metrics, batch in zip(history, batches):
        assert _informative(batch) and metrics["zero_var_frac"] == 0.0
        assert len(np.unique(batch.groups)) == 4 - metrics["refill_shortfall"]
        assert metrics["collected_zero_var_frac"] == metrics["refill_shortfall"] / 4

    # Plain GRPO on the same simulator keeps its zero-variance groups.
    grpo = loop.run(_trainer("grpo", GREEDY_MODAL), 4)
    assert any(m["zero_var_frac"] > 0 for m in grpo)


def test_dapo_with_no_informative_group_keeps_the_first_round_and_does_not_move():
    trainer = _trainer("dapo", GREEDY_MODAL, max_refill_rounds=2)
    with torch.no_grad():  # a deterministic policy against a greedy persuadee: every dialogue the same
        trainer.policy.net[-1].bias.copy_(torch.arange(trainer.policy.n_actions, dtype=torch.float32) * -100.0)
    batches = _recording(trainer)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics = trainer.step()
    assert (metrics["refill_rounds"], metrics["refill_shortfall"], metrics["collected_zero_var_frac"]) == (2, 4, 1.0)
    assert metrics["zero_var_frac"] == 1.0 and metrics["loss"] == 0.0
    [batch] = batches
    assert len(batch.trajectories) == 16 and batch.kept == list(range(16)) and len(batch.collected) == 48
    assert all(torch.equal(b, p) for b, p in zip(before, trainer.policy.parameters()))
