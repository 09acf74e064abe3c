"""Trainable act-level persuadee (:mod:`simpop.envs.persuasion.trainable`): records, the torch replay against the
numpy model, snapshots, and its ``trainable:persuadee`` spec."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from simpop.agents.policy import ActPolicy
from simpop.envs import make
from simpop.envs.persuasion.acts import ASKING_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS
from simpop.envs.persuasion.model import AMOUNT_LEVELS
from simpop.envs.persuasion.likelihood import REFUSE, replay
from simpop.envs.persuasion.trainable import TrainableActPersuadee
from simpop.rollout import RolloutEngine
from simpop.seat import SimulatorSpec, Trainable
from simpop.simulators.population import CheckpointPool
from simpop.simulators.registry import build_simulator

ENV = "simpop/PersuasionAct-v0"


def _collect(sim, n=16, seed=0):
    policy = ActPolicy.for_env(make(ENV), seed=seed)
    return RolloutEngine(ENV, policy, sim).collect(n, group_size=1, seed=seed)


def test_records_one_episode_per_dialogue_with_every_reply():
    sim = TrainableActPersuadee(name="t")
    trajectories = _collect(sim)
    assert len(sim.episodes) == len(trajectories)
    for episode, t in zip(sim.episodes, trajectories):
        assert len(episode.turns) == len(t.actions[t.user_seat])
        assert [PERSUADER_ACTS[a] for a, _ in episode.turns] == [PERSUADER_ACTS[a] for a in
                                                                 t.actions[t.policy_seat][:len(episode.turns)]]
    sim.clear()
    assert sim.episodes == []


@pytest.mark.parametrize("spec", [None, "trainable:persuadee?personas=heldout-60-1",
                                  "trainable:persuadee:heldout-1?temperature=0.8&personas=modal"])
def test_replay_matches_the_numpy_model(spec):
    sim = TrainableActPersuadee(name="t") if spec is None else build_simulator(spec, env=make(ENV))
    _collect(sim, n=24, seed=3)
    incl, decision, response = replay(sim.theta.detach(), sim.episodes, sim.temperature)
    with torch.no_grad():
        scores = sim.score(sim.episodes)
    model = sim.model
    for row, episode in enumerate(sim.episodes):
        state, total = model.initial_state(episode.persona), 0.0
        for col, (a, reply) in enumerate(episode.turns):
            act = PERSUADER_ACTS[a]
            state = model.update(state, act)
            assert abs(state.inclination - float(incl[row, col])) < 1e-9
            probs = dict(model.distribution(state, act, sim.temperature))
            if act in ASKING_ACTS:
                verb = "provide-donation-amount" if act == "ask-donation-amount" else "agree-donation"
                key = ("disagree-donation", 0.0) if reply == REFUSE else (verb, AMOUNT_LEVELS[reply])
            else:
                key = (PERSUADEE_ACTS[reply], None)
            total += np.log(probs[key])
        assert abs(total - float(scores.logprob[row])) < 1e-8
    assert torch.allclose(scores.kl, torch.zeros_like(scores.kl))  # at the base parameters


def test_gradient_reaches_the_decision_parameters_and_kl_grows_off_base():
    sim = TrainableActPersuadee(name="t")
    _collect(sim, n=32, seed=1)
    scores = sim.score(sim.episodes)
    scores.logprob.sum().backward()
    grad = sim.theta.grad
    assert torch.isfinite(grad).all() and grad[0] != 0  # the intercept decides every donation
    with torch.no_grad():
        sim.theta[0] += 1.0
    sim.after_step()
    assert sim.params.intercept == float(sim.theta[0].detach())
    assert float(sim.score(sim.episodes).kl.sum()) > 0


def test_after_step_projects_into_bounds():
    sim = TrainableActPersuadee(name="t")
    index = list(type(sim.base).sizes()).index("repeat_decay")
    offset = sum(list(type(sim.base).sizes().values())[:index])
    with torch.no_grad():
        sim.theta[offset] = 3.0
    sim.after_step()
    assert sim.params.repeat_decay == 1.0


def test_snapshot_is_frozen_and_independent():
    sim = TrainableActPersuadee(name="t")
    snap = sim.snapshot()
    assert snap.frozen and not snap.theta.requires_grad and snap is not sim
    with torch.no_grad():
        sim.theta[0] -= 2.0
    sim.after_step()
    assert snap.params.intercept != sim.params.intercept
    pool = CheckpointPool(max_size=2)
    frozen = pool.add_snapshot(sim, 7)
    assert frozen.name == "t@7" and frozen.params.intercept == sim.params.intercept
    _collect(frozen, n=4)
    assert frozen.episodes == []  # snapshots keep no records (they are never trained)


def test_records_the_persona_each_dialogue_plays():
    """With a persona set, the recorded persona is the one drawn for the slot, not the scenario's."""
    env = make(ENV)
    sim = build_simulator("trainable:persuadee?personas=heldout-60-1", env=env)
    scenario = env.load_scenario(env.scenario_ids()[0])
    sim.reset_batch([scenario] * 8, [np.random.default_rng(i) for i in range(8)])
    played = [e.persona for e in sim.episodes]
    assert all(p in sim.personas and p != scenario.persona for p in played) and len(set(played)) > 1
    for slot, persona in enumerate(played):
        assert sim.state(slot) == sim.model.initial_state(persona)


def test_trainable_persuadee_spec_builds_and_round_trips():
    env = make(ENV)
    sim = build_simulator("trainable:persuadee", env=env)
    assert type(sim) is TrainableActPersuadee and isinstance(sim, Trainable) and sim.name == "trainable:persuadee"
    assert sim.decoding == "sample" and sim.temperature == 1.0 and sim.personas is None
    assert sim.spec == SimulatorSpec.parse("trainable:persuadee:base")
    assert SimulatorSpec.parse(str(sim.spec)) == sim.spec
    assert build_simulator(str(sim.spec), env=env).spec == sim.spec
    held = build_simulator("trainable:persuadee:heldout-2?temperature=0.5&personas=modal", env=env)
    assert held.temperature == 0.5 and held.spec.model == "persuadee:heldout-2" and held.spec.personas == "modal"
    assert held.base != sim.base  # the held-out model's parameters start (and anchor) the trainable one
    assert SimulatorSpec.parse(str(held.spec)) == held.spec
    assert build_simulator("trainable:persuadee").spec == sim.spec  # the env is needed only for persona sets
    with pytest.raises(ValueError, match="samples"):
        build_simulator("trainable:persuadee?decoding=greedy", env=env)
    with pytest.raises(ValueError, match="act-level persuadee"):
        build_simulator("trainable:persuadee", env=make("simpop/Persuasion-v0"))
