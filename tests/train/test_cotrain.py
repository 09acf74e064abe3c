"""Co-training: config validation, the simulator objective, updates on shared rollouts, pools, resume."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from simpop.envs import make
from simpop.envs.persuasion.acts import PERSUADER_ACTS
from simpop.envs.persuasion.model import PersuadeeParams
from simpop.agents.policy import ActPolicy
from simpop.envs.persuasion.trainable import TrainableActPersuadee
from simpop.rollout import RolloutEngine
from simpop.simulators.population import CheckpointPool, Population
from simpop.simulators.registry import build_simulator
from simpop.train.cotrain import (CoTrainConfig, CoTrainer, simulator_advantages, simulator_objective,
                                  training_population)
from simpop.train.grpo import Batch, GRPOConfig, GRPOTrainer
from simpop.seat import Player

ENV = "simpop/PersuasionAct-v0"
GRPO = GRPOConfig(group_size=4, scenarios_per_update=4, seed=0)


def _policy(seed: int = 0) -> ActPolicy:
    return ActPolicy.for_env(make(ENV), seed=seed)


def _cotrainer(sims, config: CoTrainConfig, grpo: GRPOConfig = GRPO) -> CoTrainer:
    return CoTrainer(GRPOTrainer(ENV, _policy(), None, grpo), sims, config)


@pytest.mark.parametrize("kwargs, message", [
    ({"target_success": 1.0}, "target_success"),
    ({"sim_lr": 0.0}, "sim_lr"),
    ({"sim_kl_coef": -1.0}, "sim_kl_coef"),
    ({"population_size": 0}, "population_size"),
    ({"pool_sample_prob": 0.3}, "needs a pool"),
    ({"pool_size": 3}, "pool_sample_prob > 0"),
    ({"pool_size": 3, "pool_sample_prob": 1.0}, r"\[0, 1\)"),
])
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CoTrainConfig(**kwargs)


def test_simulator_advantages_are_the_objective_gradient():
    s = np.array([1, 1, 1, 0.0])  # p = 0.75 > 0.5: successes must become less likely
    a = simulator_advantages(s, 0.5)
    assert np.allclose(a, 2 * (0.5 - 0.75) * (s - 0.75)) and (a[:3] < 0).all() and a[3] > 0
    # Mirrored batches: in both, the rare outcome is the one to make more likely.
    assert np.allclose(simulator_advantages([0, 0, 1, 0.0]), simulator_advantages([1, 1, 0, 1.0]))
    assert simulator_advantages([0, 0, 1, 0.0])[2] > 0
    assert np.allclose(simulator_advantages([1, 0, 1, 0.0]), 0)  # on target: no outcome gradient
    assert simulator_objective([1, 0, 1, 0]) == 0.0 and simulator_objective([1, 1]) == -0.25
    with pytest.raises(ValueError):
        simulator_advantages([])


def test_one_update_changes_simulator_parameters_and_logs_loss():
    sim = TrainableActPersuadee(name="sim")
    before = sim.theta.detach().clone()
    trainer = _cotrainer([sim], CoTrainConfig())
    assert trainer.training_simulator is sim and trainer.policy_trainer.training_simulator is sim
    assert trainer.policy is trainer.policy_trainer.policy
    metrics = trainer.step()
    assert {"sim_loss", "sim_kl", "sim_success", "sim_objective", "reward_mean", "zero_var_frac"} <= set(metrics)
    assert np.isfinite(metrics["sim_loss"])
    assert not torch.equal(before, sim.theta.detach())
    assert sim.params == type(sim.params).from_vector(sim.theta.detach().numpy())  # the acting model follows


class _Scripted(Player):
    """Appeals for three turns, then proposes (a fixed persuader: only the simulator learns)."""

    PLAN = ("logical-appeal", "emotion-appeal", "credibility-appeal", "proposition-of-donation")

    def act_batch(self, observations, slots):
        turns = [int(round(float(np.asarray(o)[-2]) * 10)) for o in observations]  # turn fraction -> turn index
        return [PERSUADER_ACTS.index(self.PLAN[min(t, 3)]) for t in turns]


def _success_after(sim, trainer, updates, seed0):
    engine = RolloutEngine(ENV, _Scripted(), trainer.simulator)
    rates = []
    for k in range(updates):
        sim.clear()
        batch = engine.collect(16, group_size=4, seed=seed0 + k)
        rates.append(np.mean([t.success for t in batch]))
        trainer.update_simulators(Batch(batch, np.zeros(len(batch)), engine.stats))
    return rates


@pytest.mark.parametrize("intercept", [2.0, -4.0])
def test_simulator_objective_moves_batch_success_toward_half(intercept):
    """An easy (intercept +2) or hard (-4) persuadee is steered towards 50% against a fixed persuader."""
    sim = TrainableActPersuadee(dataclasses.replace(PersuadeeParams(), intercept=intercept), name="sim")
    trainer = _cotrainer([sim], CoTrainConfig(sim_lr=0.1, sim_kl_coef=0.0))
    rates = _success_after(sim, trainer, 30, seed0=100)
    start, end = np.mean(rates[:3]), np.mean(rates[-5:])
    assert abs(start - 0.5) > 0.3
    assert abs(end - 0.5) < abs(start - 0.5) - 0.2, (start, end)


def test_population_cotraining_samples_its_checkpoint_pool():
    sims = [TrainableActPersuadee(name=f"sim{i}") for i in range(2)]
    config = CoTrainConfig(population_size=2, pool_size=3, pool_sample_prob=0.5, snapshot_every=1)
    trainer = _cotrainer(sims, config, dataclasses.replace(GRPO, scenarios_per_update=8))
    assert isinstance(trainer.simulator, Population) and isinstance(trainer.pool, CheckpointPool)
    assert [m.name for m in trainer.pool.members] == ["sim0@0", "sim1@0"]  # the base simulators
    metrics = [trainer.step() for _ in range(2)]
    assert [m.name for m in trainer.pool.members] == ["sim1@1", "sim0@2", "sim1@2"]
    assert all(m["pool_share"] > 0 for m in metrics) and metrics[-1]["pool_size"] == 3
    frozen = trainer.pool.members[-1]
    assert frozen.frozen and torch.equal(frozen.theta, sims[1].theta.detach())


def test_resume_continues_exactly():
    def make_trainer():
        sims = [TrainableActPersuadee(name=f"sim{i}") for i in range(2)]
        config = CoTrainConfig(population_size=2, pool_size=2, pool_sample_prob=0.3, snapshot_every=1)
        return _cotrainer(sims, config)

    first = make_trainer()
    for _ in range(2):
        first.step()
    state = copy.deepcopy(first.state_dict())  # as a checkpoint file would hold it (state dicts alias live tensors)
    expected = first.step()
    second = make_trainer()
    second.load_state_dict(state)
    got = second.step()
    keys = ["reward_mean", "loss", "sim_loss", "sim_kl", "zero_var_frac", "pool_share"]
    assert [got[k] for k in keys] == [expected[k] for k in keys]


def test_training_population_shapes():
    sim = TrainableActPersuadee(name="a")
    assert training_population([sim], CoTrainConfig()) == (sim, None)
    with pytest.raises(ValueError, match="population_size"):
        training_population([sim], CoTrainConfig(population_size=2))
    with pytest.raises(ValueError, match="distinct names"):
        _cotrainer([sim, TrainableActPersuadee(name="a")], CoTrainConfig(population_size=2))
    with pytest.raises(ValueError, match="frozen snapshot"):
        _cotrainer([sim.snapshot()], CoTrainConfig())
    with pytest.raises(ValueError, match="has no simulator"):  # a policy trainer left without one
        GRPOTrainer(ENV, _policy(), None, GRPO).collect()


def test_trainable_persuadee_spec_builds_the_cotrainable_simulator():
    sim = build_simulator("trainable:persuadee", make(ENV), name="s0")
    assert isinstance(sim, TrainableActPersuadee) and sim.name == "s0" and not sim.frozen
    assert sim.params == TrainableActPersuadee().params
    with pytest.raises(ValueError, match="drop decoding=greedy"):
        build_simulator("trainable:persuadee?decoding=greedy", make(ENV))
    with pytest.raises(ValueError, match="trainable:MODEL"):  # the act-level persuadee does not fit the text env
        build_simulator("trainable:persuadee", make("simpop/Persuasion-v0"))


def test_dynamic_sampling_cotrains_on_the_kept_dialogues_only():
    """DAPO drops equal-reward groups; each simulator learns from the dialogues of the kept ones only."""
    sims = [TrainableActPersuadee(name=f"sim{i}") for i in range(2)]
    grpo = dataclasses.replace(GRPO, algorithm="dapo", max_refill_rounds=8)
    trainer = _cotrainer(sims, CoTrainConfig(population_size=2), grpo)
    scored = {s.name: [] for s in sims}
    for sim in sims:
        score = sim.score
        sim.score = lambda episodes, score=score, name=sim.name: scored[name].append(list(episodes)) or score(episodes)
    refilled = False
    for _ in range(4):
        for s in scored.values():
            s.clear()
        batch = trainer.policy_trainer.collect()
        refilled |= len(batch.collected) > len(batch.trajectories)
        metrics = trainer.update_simulators(batch)
        assert np.isfinite(metrics["sim_loss"])
        for sim in sims:
            mine = [t for t in batch.trajectories if t.simulator == sim.name]
            [episodes] = scored[sim.name]
            assert len(episodes) == len(mine) and len(sim.episodes) == sum(
                t.simulator == sim.name for t in batch.collected)
            # the j-th scored dialogue is the j-th kept trajectory: the persuader acts it replied to match
            assert [[act for act, _ in e.turns] for e in episodes] == [t.actions[t.policy_seat] for t in mine]
        for sim in sims:
            sim.clear()
    assert refilled
    metrics = trainer.step()  # the whole co-training update (it clears the records itself)
    assert {"refill_rounds", "refill_shortfall", "sim_loss", "sim_success"} <= set(metrics)
