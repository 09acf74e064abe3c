"""The act-level wave stepped as arrays (ActWave) gives exactly the trajectories, and leaves exactly the envs,
that stepping each env does."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from simpop.envs.persuasion.act_wave import ActWave
from simpop.envs.registration import make
from simpop.experiments.collapse import CollapseConfig, build_panel, build_trainer
from simpop.rollout import Job, RolloutEngine
from simpop.seat import Player, Simulator

ENV = "simpop/PersuasionAct-v0"


def per_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every engine step each env (the path before ActWave)."""
    monkeypatch.setattr(RolloutEngine, "_vector_wave", lambda self, envs: None)


def assert_same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for f in dataclasses.fields(x):
            u, v = getattr(x, f.name), getattr(y, f.name)
            if f.name == "observations":
                assert u.keys() == v.keys()
                for seat in u:
                    assert len(u[seat]) == len(v[seat])
                    for o, p in zip(u[seat], v[seat]):
                        assert o.dtype == p.dtype == np.float32 and np.array_equal(o, p)
            elif f.name == "infos":
                assert [list(i.items()) for i in u] == [list(i.items()) for i in v]  # key order too
            else:
                assert u == v, f.name
                if f.name == "actions":  # the actions as given (numpy ints stay numpy ints)
                    assert {s: [type(a) for a in u[s]] for s in u} == {s: [type(a) for a in v[s]] for s in v}


def transcripts(engine: RolloutEngine, n: int) -> list:
    out = []
    for env in engine.env_pool(n):
        out.append(([(t.seat, t.text, t.act, t.data) for t in env.transcript], env.steps, env.donation,
                    env.outcome_source, env.to_act, env.agents, env.last_error,
                    [env._observe(seat).tolist() for seat in env.possible_agents]))  # act counts, last acts
    return out


@pytest.mark.parametrize("condition", ["frozen", "verbalized", "cotrain", "population"])
@pytest.mark.parametrize("seed", [0, 7, 123])
def test_training_updates_are_bit_identical(monkeypatch: pytest.MonkeyPatch, condition: str, seed: int) -> None:
    config = CollapseConfig(level="act", conditions=(condition,))

    def run(vector: bool):
        with monkeypatch.context() as m:
            if not vector:
                per_env(m)
            batches, engines = [], []
            run = RolloutEngine.run

            def spy(self, jobs, rng):  # every collection's trajectories
                engines.append(self)
                batches.append(run(self, jobs, rng))
                return batches[-1]

            m.setattr(RolloutEngine, "run", spy)
            torch.manual_seed(seed)
            trainer = build_trainer(condition, config, seed, make(config.env_id, **config.env_kwargs()), {})
            metrics = [trainer.step() for _ in range(3)]
            return batches, metrics, transcripts(engines[-1], config.grpo.batch_size)

    (b0, m0, t0), (b1, m1, t1) = run(False), run(True)
    for x, y in zip(b0, b1):
        assert_same(x, y)

    def strip(ms):
        return [{k: v for k, v in m.items() if not k.endswith("_s")} for m in ms]

    assert strip(m0) == strip(m1)
    assert t0 == t1


@pytest.mark.parametrize("seed", [1, 2])
def test_panel_evaluation_is_bit_identical(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    from simpop.evaluation.panel import evaluate

    config = CollapseConfig(level="act", conditions=("frozen",))
    env = make(ENV)
    trainer = build_trainer("frozen", config, seed, env, {})
    panel = build_panel(config, env, {})
    with monkeypatch.context() as m:
        per_env(m)
        before = evaluate(ENV, trainer.policy, panel, 16, seed, {})
    after = evaluate(ENV, trainer.policy, panel, 16, seed, {})
    assert before.records == after.records and before.success == after.success


class Scripted(Player):
    """A policy that answers with bad actions now and then (bools, out of range, numpy ints, floats)."""

    def __init__(self) -> None:
        self.calls = 0

    def act_batch(self, observations, slots):
        self.calls += 1
        bad = [True, 99, np.int64(3), 2.5, -1, np.array(4)]
        return [bad[(i + self.calls) % len(bad)] if self.rngs[s].random() < 0.3 else int(self.rngs[s].integers(14))
                for i, s in enumerate(slots)]


class Erratic:
    """A persuadee that sometimes replies with an out-of-range action."""

    name = "erratic"

    def reset_batch(self, scenarios, rngs):
        self.rngs = list(rngs)

    def act_batch(self, observations, slots):
        return [int(self.rngs[s].integers(-3, 23 * 7 + 3)) for s in slots]

    def feedback(self, slots, rewards):
        pass

    def member(self, slot):
        return self


def test_rejected_actions_are_recorded_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [Job(sid, g, 1000 + g) for g, sid in enumerate(make(ENV).scenario_ids()[:24])]
    runs = []
    for vector in (False, True):
        with monkeypatch.context() as m:
            if not vector:
                per_env(m)
            engine = RolloutEngine(ENV, Scripted(), Erratic(), env_kwargs={"max_turns": 4})
            runs.append((engine.run(jobs, np.random.default_rng(5)), transcripts(engine, len(jobs)),
                         engine.stats.user_rejected))
    assert_same(runs[0][0], runs[1][0])
    assert runs[0][1:] == runs[1][1:]
    assert runs[1][2] > 0 and any("invalid_action" in i for t in runs[1][0] for i in t.infos)
    assert any(t.truncated for t in runs[1][0]) and any(t.terminated for t in runs[1][0])


def test_wave_rejects_bad_input() -> None:
    envs = [make(ENV), make(ENV, max_turns=3)]
    with pytest.raises(ValueError, match="max_turns"):
        ActWave(envs)
    wave = ActWave([make(ENV)])
    with pytest.raises(KeyError, match="unknown scenario_id"):
        wave.reset([0], ["no-such-scenario"])
    with pytest.raises(ValueError, match="one seed"):
        wave.reset([0, 1], ["x"])


def test_a_wave_that_raises_leaves_the_envs_as_stepping_would(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that raises mid-wave: the envs hold the dialogues so far (evaluation keeps partial transcripts)."""
    from simpop.envs.persuasion.simulators import ActPersuadee

    class RaisesOnTurnThree(Scripted):
        def act_batch(self, observations, slots):
            if self.calls == 2:
                raise ValueError("boom")
            return super().act_batch(observations, slots)

    jobs = [Job(sid, g, 50 + g) for g, sid in enumerate(make(ENV).scenario_ids()[:8])]
    states = []
    for vector in (False, True):
        with monkeypatch.context() as m:
            if not vector:
                per_env(m)
            engine = RolloutEngine(ENV, RaisesOnTurnThree(), ActPersuadee())
            with pytest.raises(ValueError, match="boom"):
                engine.run(jobs, np.random.default_rng(1))
            states.append(transcripts(engine, len(jobs)))
    assert states[0] == states[1]
    assert any(t[0] for t in states[1]) and any(t[5] for t in states[1])  # partial transcripts, live dialogues


class SeatSampler(Simulator):
    """A seat simulator in the policy seat: each slot samples with its own generator, reading its observation."""

    name = "seat-sampler"

    def reset_batch(self, scenarios, rngs):
        self.rngs = list(rngs)

    def act_batch(self, observations, slots):
        return [int((self.rngs[s].integers(14) + int(np.asarray(o).sum() * 7)) % 14)
                for o, s in zip(observations, slots)]



def test_a_seat_simulator_in_the_policy_seat_plays_the_wave(monkeypatch: pytest.MonkeyPatch) -> None:
    """Self-play's seat simulators (slots and generators of their own) play the array wave as they play the envs."""
    from simpop.envs.persuasion.simulators import ActPersuadee

    jobs = [Job(sid, g, 40 + g) for g, sid in enumerate(make(ENV).scenario_ids()[:6])]

    def run(vector: bool):
        with monkeypatch.context() as m:
            if not vector:
                per_env(m)
            engine = RolloutEngine(ENV, SeatSampler(), ActPersuadee(temperature=1.0))
            assert (engine._vector_wave(engine.env_pool(len(jobs))) is not None) is vector
            return engine.run(jobs, np.random.default_rng(9)), transcripts(engine, len(jobs))

    (wave, envs_wave), (stepped, envs_stepped) = run(True), run(False)
    assert_same(wave, stepped)
    assert envs_wave == envs_stepped
