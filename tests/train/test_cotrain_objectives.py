"""Co-training objectives (``CoTrainConfig.objective``): each moves the simulator the way it should on a small case.

Every case co-trains act-level persuadees against a fixed scripted persuader (only the simulators learn), so
any change in success, persona mix, corpus likelihood or divergence comes from the simulator objective.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from simpop.agents.policy import ActPolicy
from simpop.envs import make
from simpop.envs.persuasion.acts import PERSUADER_ACTS
from simpop.envs.persuasion.model import BASE_TRAITS, PersuadeeParams
from simpop.envs.persuasion.personas import SCALES, modal_persona
from simpop.envs.persuasion.likelihood import UNSCORED, reference_episodes
from simpop.envs.persuasion.trainable import TrainableActPersuadee
from simpop.envs.persuasion.corpus import load_corpus
from simpop.rollout import RolloutEngine
from simpop.simulators.trainable import TrainableLLMSimulator
from simpop.train.config import add_arguments, build
from simpop.train.cotrain import OBJECTIVES, CoTrainConfig, CoTrainer, simulator_advantages
from simpop.train.grpo import Batch, GRPOConfig, GRPOTrainer
from simpop.seat import Player
from tests.envs.persuasion.p4g_fixture import write_p4g_corpus
from tests.simulators.fakes import FakeTrainableBackend

ENV = "simpop/PersuasionAct-v0"


class _Scripted(Player):
    """Appeals for three turns, then proposes."""

    PLAN = ("logical-appeal", "emotion-appeal", "credibility-appeal", "proposition-of-donation")

    def act_batch(self, observations, slots):
        turns = [int(round(float(np.asarray(o)[-2]) * 10)) for o in observations]
        return [PERSUADER_ACTS.index(self.PLAN[min(t, 3)]) for t in turns]


def _cotrainer(sims, config: CoTrainConfig) -> CoTrainer:
    grpo = GRPOConfig(group_size=4, scenarios_per_update=4, seed=0)
    return CoTrainer(GRPOTrainer(ENV, ActPolicy.for_env(make(ENV)), None, grpo), sims, config)


def _train(trainer: CoTrainer, updates: int, seed0: int = 100, dialogues: int = 16) -> list[dict[str, float]]:
    """``updates`` simulator updates on scripted-persuader batches; each update's metrics plus its success."""
    engine = RolloutEngine(ENV, _Scripted(), trainer.simulator)
    logs = []
    for k in range(updates):
        for sim in trainer.simulators:
            sim.clear()
        batch = engine.collect(dialogues, group_size=4, seed=seed0 + k)
        metrics = trainer.update_simulators(Batch(batch, np.zeros(len(batch)), engine.stats))
        logs.append({**metrics, "success": float(np.mean([t.success for t in batch]))})
    return logs


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    return write_p4g_corpus(tmp_path_factory.mktemp("p4g"), n_dialogues=30, n_annotated=30)


@pytest.mark.parametrize("kwargs, message", [
    ({"objective": "nope"}, "objective must be one of"),
    ({"objective": "realism"}, "realism_coef > 0 and reference_data"),
    ({"objective": "adversarial", "realism_coef": 1.0}, "reference_data"),
    ({"objective": "realism", "realism_coef": 0.0, "reference_data": "x"}, "realism_coef > 0"),
    ({"objective": "diverse", "diversity_coef": 0.0}, "diversity_coef > 0"),
    ({"diversity_coef": -0.5}, "diversity_coef must be >= 0"),
    ({"realism_coef": -1.0}, "realism_coef must be >= 0"),
])
def test_objective_config_is_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CoTrainConfig(**kwargs)


def test_objective_is_a_flag():
    parser = argparse.ArgumentParser()
    add_arguments(parser, CoTrainConfig)
    args = parser.parse_args(["--objective", "diverse", "--diversity-coef", "0.5", "--population-size", "2"])
    config = build(CoTrainConfig, args)
    assert (config.objective, config.diversity_coef, config.population_size) == ("diverse", 0.5, 2)
    with pytest.raises(SystemExit):  # argparse refuses an unknown objective (choices)
        parser.parse_args(["--objective", "nope"])
    assert set(OBJECTIVES) == {"target", "persona", "realism", "adversarial", "diverse"}


def test_adversarial_advantages_lower_success():
    a = simulator_advantages([1, 1, 0, 0.0], objective="adversarial")
    assert np.allclose(a, [-0.5, -0.5, 0.5, 0.5])  # successes become less likely, whatever the rate


def test_target_moves_an_easy_persuadee_towards_half():
    sim = TrainableActPersuadee(dataclasses.replace(PersuadeeParams(), intercept=2.0), name="sim")
    rates = [m["success"] for m in _train(_cotrainer([sim], CoTrainConfig(sim_lr=0.1, sim_kl_coef=0.0)), 20)]
    assert np.mean(rates[:3]) > 0.8 and np.mean(rates[-4:]) < np.mean(rates[:3]) - 0.15, rates


def _extreme(high: bool):
    """A persona at the top (or bottom) of every trait that raises giving, the reverse for those that lower it."""
    signs = {"power": -1, "hedonism": -1}
    values = {t: SCALES[t][1 if (signs.get(t, 1) > 0) == high else 0] for t in BASE_TRAITS}
    return dataclasses.replace(modal_persona(), **values)


def test_persona_objective_learns_the_persona_mix_not_the_reply_model():
    generous, stingy = _extreme(True), _extreme(False)
    sim = TrainableActPersuadee(name="sim", persona_pool=[generous, stingy])
    theta = sim.theta.detach().clone()
    config = CoTrainConfig(objective="persona", target_success=0.15, sim_lr=0.2, sim_kl_coef=0.0)
    trainer = _cotrainer([sim], config)
    logs = _train(trainer, 15)
    p_stingy = float(torch.softmax(sim.persona_logits.detach(), 0)[1])
    assert p_stingy > 0.7, p_stingy  # the hard persona is played more: success falls towards 0.15
    assert np.mean([m["success"] for m in logs[-4:]]) < np.mean([m["success"] for m in logs[:3]]) - 0.15
    assert torch.equal(sim.theta.detach(), theta)  # the reply model did not move
    assert all(e.persona_index in (0, 1) for e in sim.episodes)


def test_persona_objective_needs_a_pool():
    with pytest.raises(ValueError, match="persona pool"):
        _cotrainer([TrainableActPersuadee(name="sim")], CoTrainConfig(objective="persona"))


def test_reference_episodes_read_the_corpus_acts(corpus_dir):
    episodes = reference_episodes(load_corpus(corpus_dir).annotated)
    assert len(episodes) == 30
    scored = [r for e in episodes for _, r in e.turns if r != UNSCORED]
    assert len(scored) > 0.8 * sum(len(e.turns) for e in episodes)


def _perturbed() -> PersuadeeParams:
    rng = np.random.default_rng(0)
    base = PersuadeeParams()
    return dataclasses.replace(base, response_logits=tuple(np.array(base.response_logits)
                                                           + rng.normal(0, 1.5, len(base.response_logits))))


@pytest.mark.parametrize("objective", ["realism", "adversarial"])
def test_realism_anchor_pulls_replies_towards_the_corpus(corpus_dir, objective):
    """Started from scrambled reply preferences, the anchor raises the corpus replies' likelihood; without
    it (``target``) the same updates leave it where it was. Adversarial also lowers the success."""
    nll = {}
    logs = {}
    for name, config in (("anchored", CoTrainConfig(objective=objective, realism_coef=0.5, sim_lr=0.1,
                                                     sim_kl_coef=0.0, reference_data=str(corpus_dir))),
                         ("target", CoTrainConfig(sim_lr=0.1, sim_kl_coef=0.0))):
        sim = TrainableActPersuadee(_perturbed(), name="sim")
        sim.load_reference(str(corpus_dir))
        start = float(sim.reference_nll().detach())
        logs[name] = _train(_cotrainer([sim], config), 12)
        nll[name] = (start, float(sim.reference_nll().detach()))
    (start, end), (_, end_target) = nll["anchored"], nll["target"]
    assert end < start - 0.15 * abs(start) and end < end_target - 0.1 * abs(start), nll
    assert all(np.isfinite(m["sim_realism_nll"]) for m in logs["anchored"])
    if objective == "adversarial":
        rates = [m["success"] for m in logs["anchored"]]
        assert np.mean(rates[-4:]) < np.mean(rates[:3]) - 0.1, rates


def test_diverse_objective_pushes_members_apart():
    """Two members that start nearly equal end further apart with the diversity term than without it."""
    divergence = {}
    for objective, coef in (("diverse", 2.0), ("target", 0.0)):
        sims = [TrainableActPersuadee(dataclasses.replace(PersuadeeParams(), intercept=i * 0.1), name=f"m{i}")
                for i in range(2)]
        config = CoTrainConfig(objective=objective, diversity_coef=coef, population_size=2, sim_lr=0.05,
                               sim_kl_coef=0.0)
        _train(_cotrainer(sims, config), 10)
        with torch.no_grad():
            episodes = sims[0].episodes
            divergence[objective] = float(sims[0].divergence(sims[1], episodes))
    assert divergence["diverse"] > 2 * divergence["target"], divergence


def test_diverse_objective_needs_a_population():
    with pytest.raises(ValueError, match="population_size >= 2"):
        _cotrainer([TrainableActPersuadee(name="sim")], CoTrainConfig(objective="diverse", diversity_coef=1.0))


def test_state_dict_keeps_the_persona_sampler():
    sim = TrainableActPersuadee(name="sim", persona_pool=[_extreme(True), _extreme(False)])
    with torch.no_grad():
        sim.persona_logits.add_(torch.tensor([0.0, 1.0], dtype=torch.float64))
    other = TrainableActPersuadee(name="sim", persona_pool=[_extreme(True), _extreme(False)])
    other.load_state_dict(sim.state_dict())
    assert torch.equal(other.persona_logits, sim.persona_logits)
    assert torch.equal(sim.snapshot().persona_logits, sim.persona_logits)


def _shifted(sim: TrainableActPersuadee, shift: float, name: str) -> TrainableActPersuadee:
    """A frozen snapshot of ``sim`` with every reply preference moved by ``shift`` (0: the same behaviour)."""
    snap = sim.snapshot()
    with torch.no_grad():
        snap.theta.add_(shift * torch.linspace(-1.0, 1.0, len(snap.theta), dtype=torch.float64))
    snap.name = name
    return snap


def test_redundant_pruning_drops_a_near_duplicate_not_the_oldest():
    sims = [TrainableActPersuadee(name=f"m{i}") for i in range(2)]
    config = CoTrainConfig(population_size=2, pool_size=3, pool_sample_prob=0.25, snapshot_every=1,
                           pool_prune="redundant")
    trainer = _cotrainer(sims, config)
    _train(trainer, 1)  # the simulators' records of one batch: the states the distances are measured on
    far, near, twin = _shifted(sims[0], 0.5, "far"), _shifted(sims[0], 0.0, "near"), _shifted(sims[0], 0.01, "twin")
    assert trainer._most_redundant([far, near], twin) == 1  # the oldest (far) is the most distinct: it stays
    assert trainer._most_redundant([near, far], twin) == 0
    # Through the pool (either rule): the resume record names exactly the snapshots the pool holds, in its order,
    # and a resumed trainer rebuilds them.
    kept = {}
    for prune in ("redundant", "oldest"):
        trainer = _cotrainer([TrainableActPersuadee(name=f"m{i}") for i in range(2)],
                             dataclasses.replace(config, pool_prune=prune))
        for step in range(1, 3):
            _train(trainer, 1, seed0=step)
            for index, sim in enumerate(trainer.simulators):
                trainer._add_snapshot(index, step, sim.state_dict())
        names = [m.name for m in trainer.pool.members]
        assert len(names) == 3 and names == [f"m{i}@{s}" for i, s, _ in trainer._snapshots]
        resumed = _cotrainer([TrainableActPersuadee(name=f"m{i}") for i in range(2)],
                             dataclasses.replace(config, pool_prune=prune))
        resumed.load_state_dict(trainer.state_dict())
        assert [m.name for m in resumed.pool.members] == names
        kept[prune] = names
    assert kept["oldest"] == ["m1@1", "m0@2", "m1@2"]


def test_redundant_pruning_needs_divergent_simulators():
    backend = FakeTrainableBackend()
    sims = [TrainableLLMSimulator(backend, f"a{i}", name=f"llm{i}") for i in range(2)]
    config = CoTrainConfig(population_size=2, pool_size=3, pool_sample_prob=0.25, pool_prune="redundant")
    with pytest.raises(TypeError, match="pool_prune 'redundant' needs simulators that are Divergent"):
        CoTrainer(GRPOTrainer("simpop/Persuasion-v1", ActPolicy.for_env(make(ENV)), None,
                              GRPOConfig(group_size=2, scenarios_per_update=2)), sims, config)
