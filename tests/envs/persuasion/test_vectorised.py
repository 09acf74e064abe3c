"""The batched persuadee model draws what numpy draws, is row-independent and equals the torch replay; the act-level
loop gives the same replies, draws and trajectories per dialogue as over the whole wave."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from simpop.agents.policy import ActPolicy
from simpop.envs.persuasion.acts import ASKING_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS
from simpop.envs.persuasion.likelihood import REFUSE, ActEpisode, per_dialogue, replay, turns_of
from simpop.envs.persuasion.model import AMOUNT_LEVELS, PersuadeeModel, PersuadeeParams, PersuadeeStates
from simpop.envs.persuasion.personas import PersonaSampler
from simpop.envs.persuasion.simulators import ActPersuadee
from simpop.envs.persuasion.trainable import TrainableActPersuadee
from simpop.rollout import RolloutEngine

ENV = "simpop/PersuasionAct-v0"


def _states(model: PersuadeeModel, n: int, seed: int):
    """``n`` (state, act) pairs reached by random persuader acts on sampled personas."""
    rng = np.random.default_rng(seed)
    out = []
    for persona in PersonaSampler().sample_many(n, rng):
        state = model.initial_state(persona)
        for _ in range(int(rng.integers(0, 8))):
            state = model.update(state, PERSUADER_ACTS[int(rng.integers(len(PERSUADER_ACTS)))])
        act = PERSUADER_ACTS[int(rng.integers(len(PERSUADER_ACTS)))]
        out.append((model.update(state, act), act))
    return out


def _choice(model: PersuadeeModel, state, act: str, rng: np.random.Generator, temperature: float):
    """A reply as numpy's own ``Generator.choice`` draws it over :meth:`PersuadeeModel.distribution` (the most likely
    one when greedy)."""
    outcomes = model.distribution(state, act, temperature)
    if temperature == 0:
        return max(outcomes, key=lambda o: o[1])[0]
    probs = np.array([q for _, q in outcomes])
    return outcomes[int(rng.choice(len(outcomes), p=probs / probs.sum()))][0]


@pytest.mark.parametrize("temperature", [0.0, 0.8, 1.0, 1.2])
def test_respond_batch_draws_what_generator_choice_draws(temperature):
    model = PersuadeeModel(PersuadeeParams(intercept=0.5))
    pairs = _states(model, 300, seed=1)
    states, acts = [s for s, _ in pairs], [a for _, a in pairs]
    one = [np.random.default_rng([7, i]) for i in range(len(pairs))]
    many = [np.random.default_rng([7, i]) for i in range(len(pairs))]
    for _ in range(3):  # several draws per generator: the streams must stay aligned
        expected = [_choice(model, s, a, r, temperature) for s, a, r in zip(states, acts, one)]
        assert model.respond_batch(states, acts, many, temperature) == expected
    assert [r.random() for r in one] == [r.random() for r in many]


def test_respond_batch_draws_exactly_on_a_saturated_decision():
    # An inclination so large that P(refuse) is exactly 0: distribution() drops that outcome, so must the draw.
    model = PersuadeeModel()
    state, act = _states(model, 1, seed=2)[0]
    saturated = type(state)(800.0, state.rapport, state.counts, state.multipliers)
    rngs_a, rngs_b = [np.random.default_rng(3)], [np.random.default_rng(3)]
    asking = "ask-donation-amount"
    assert model.respond_batch([saturated], [asking], rngs_a) == [_choice(model, saturated, asking, rngs_b[0], 1.0)]
    assert rngs_a[0].random() == rngs_b[0].random()


@pytest.mark.parametrize("params", ["base", "vector", "decay-1"])
def test_update_rows_of_many_rows_equals_each_row_alone(params):
    """Long dialogues of random acts (repeats, asks before and after appeals) on many personas, random rows at once:
    each row gets the numbers it gets alone (a batch of one), also with parameters read back from a float vector."""
    base = PersuadeeParams()
    model = PersuadeeModel({"base": base, "vector": PersuadeeParams.from_vector(base.to_vector() * 1.1),
                            "decay-1": PersuadeeParams(repeat_decay=1.0)}[params])
    rng = np.random.default_rng(5)
    personas = PersonaSampler().sample_many(40, rng)
    expected = [model.initial_state(p) for p in personas]
    states = PersuadeeStates.of(expected)
    for _ in range(30):
        rows = np.sort(rng.choice(len(personas), size=int(rng.integers(1, len(personas))), replace=False))
        acts = [PERSUADER_ACTS[int(rng.integers(len(PERSUADER_ACTS)))] for _ in rows]
        model.update_rows(states, rows, acts)
        for row, act in zip(rows, acts):
            expected[row] = model.update(expected[row], act)
    assert [states[i] for i in range(len(personas))] == expected
    assert max(max(s.counts) for s in expected) > 2  # repeats were exercised


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_the_torch_replay_equals_the_batched_model(temperature):
    """The likelihood's torch replay along recorded dialogues gives the batched model's inclinations and the log of
    its reply probabilities, every dialogue's turns stepped together with update_rows."""
    model = PersuadeeModel(PersuadeeParams.from_vector(PersuadeeParams().to_vector() * 1.05))
    rng = np.random.default_rng(8)
    personas = PersonaSampler().sample_many(50, rng)
    dialogues = [[PERSUADER_ACTS[int(a)] for a in rng.integers(len(PERSUADER_ACTS), size=int(rng.integers(1, 12)))]
                 for _ in personas]
    states = PersuadeeStates.of([model.initial_state(p) for p in personas])
    rngs = [np.random.default_rng([9, i]) for i in range(len(personas))]
    episodes = [ActEpisode(p) for p in personas]
    incl, logp = np.full((len(personas), 11), np.nan), np.full((len(personas), 11), np.nan)
    for turn in range(max(len(d) for d in dialogues)):
        rows = np.array([i for i, d in enumerate(dialogues) if turn < len(d)])
        acts = [dialogues[i][turn] for i in rows]
        model.update_rows(states, rows, acts)
        replies = model.respond_batch(states.take(rows), acts, [rngs[i] for i in rows], temperature)
        for group, outcomes, probs in model.probabilities(states.inclination[rows], acts, temperature):
            for k, p in zip(group.tolist(), probs):
                i, reply = int(rows[k]), replies[k]
                incl[i, turn], logp[i, turn] = states.inclination[i], np.log(p[outcomes.index(reply)])
                code = (REFUSE if reply[0] == "disagree-donation" else AMOUNT_LEVELS.index(reply[1])
                        ) if acts[k] in ASKING_ACTS else PERSUADEE_ACTS.index(reply[0])
                episodes[i].turns.append((PERSUADER_ACTS.index(acts[k]), code))
    theta = torch.as_tensor(model.params.to_vector(), dtype=torch.float64)
    replayed, _, _ = replay(theta, episodes, temperature)
    logprob, _ = per_dialogue(theta, None, turns_of(episodes), temperature)
    width = replayed.shape[1]
    valid = ~np.isnan(incl[:, :width])
    assert np.allclose(replayed.numpy()[valid], incl[:, :width][valid], atol=1e-12, rtol=0)
    assert np.allclose(logprob.numpy(), np.nansum(logp, axis=1), atol=1e-9, rtol=0)


def test_update_rows_rejects_bad_rows():
    model = PersuadeeModel()
    states = PersuadeeStates.of([model.initial_state(p) for p in PersonaSampler().sample_many(3, np.random.default_rng(0))])
    with pytest.raises(ValueError, match="distinct rows"):
        model.update_rows(states, np.array([1, 1]), ["greeting", "greeting"])
    with pytest.raises(ValueError, match="one act per row"):
        model.update_rows(states, np.array([0, 1]), ["greeting"])


def test_respond_batch_rejects_mismatched_lengths():
    model = PersuadeeModel()
    state, act = _states(model, 1, seed=0)[0]
    with pytest.raises(ValueError, match="one act and one generator"):
        model.respond_batch([state], [act, act], [np.random.default_rng(0)])


class _PerDialoguePersuadee(TrainableActPersuadee):
    """The act-level persuadee as it was before vectorising: one ``respond`` per dialogue."""

    def _reply_batch(self, slots, acts):
        outcomes = []
        for slot, act in zip(slots, acts):
            state = self.model.update(self.state(slot), act)
            outcomes.append(self.model.respond(state, act, self._slots[slot].rng, self.temperature))
            self._states[slot] = state
            reply, amount = outcomes[-1]
            super()._record(slot, act, reply, amount)
        return outcomes


def _old_policy_act(policy: ActPolicy):
    """The policy's sampling as it was before vectorising: one searchsorted per row."""

    def act_batch(observations, slots):
        with torch.no_grad():
            probs = torch.softmax(policy(policy.observations_tensor(observations)).double(), dim=-1).numpy()
        u = policy.rngs[slots[0]].random(len(observations))  # every slot holds the wave's generator
        cdf = np.cumsum(probs, axis=1)
        return [int(min(np.searchsorted(row, x, side="right"), policy.n_actions - 1)) for row, x in zip(cdf, u)]

    return act_batch


@pytest.mark.parametrize("simulator", ["trainable", "greedy"])
def test_collect_gives_identical_trajectories_to_the_per_dialogue_code(simulator):
    def build(old: bool):
        if simulator == "trainable":
            return (_PerDialoguePersuadee if old else TrainableActPersuadee)(name="t")
        sim = ActPersuadee(decoding="greedy")
        if old:
            sim._reply_batch = lambda slots, acts: [  # type: ignore[method-assign]
                _old_reply(sim, slot, act) for slot, act in zip(slots, acts)]
        return sim

    trajectories, records = [], []
    for old in (True, False):
        sim = build(old)
        engine = RolloutEngine(ENV, ActPolicy(1, 2), sim, env_kwargs={"max_turns": 10})
        env = engine.env_pool(1)[0]
        policy = ActPolicy.for_env(env, seed=3)
        if old:
            policy.act_batch = _old_policy_act(policy)  # type: ignore[method-assign]
        engine.policy = policy
        trajectories.append(engine.collect(6, group_size=8, seed=11))
        records.append([e.turns for e in getattr(sim, "episodes", [])])
    old, new = trajectories
    assert len(old) == len(new) == 48
    for a, b in zip(old, new):
        assert a.actions == b.actions and a.rewards == b.rewards
        assert (a.success, a.terminated, a.truncated) == (b.success, b.terminated, b.truncated)
        assert a.simulator == b.simulator
    assert records[0] == records[1]


def _old_reply(sim: ActPersuadee, slot: int, act: str):
    state = sim.model.update(sim.state(slot), act)
    outcome = sim.model.respond(state, act, sim._slots[slot].rng, sim.temperature)
    sim._states[slot] = state
    return outcome


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.3])
def test_distribution_batch_gives_distributions_numbers_exactly(temperature):
    """Grouped by outcomes, the batch lists each row's :meth:`distribution` bit for bit; a saturated row (an
    outcome of probability exactly 0, which distribution leaves out) is in no group."""
    model = PersuadeeModel(PersuadeeParams(intercept=0.3))
    pairs = _states(model, 400, seed=4)
    pairs[7] = (dataclasses.replace(pairs[7][0], inclination=800.0), "ask-donation-amount")  # P(refuse) == 0
    incl = np.array([s.inclination for s, _ in pairs])
    groups = model.distribution_batch(incl, [a for _, a in pairs], temperature)
    seen = []
    for rows, outcomes, probs in groups:
        for row, p in zip(rows.tolist(), probs):
            state, act = pairs[row]
            assert list(zip(outcomes, p.tolist())) == model.distribution(state, act, temperature)
            seen.append(row)
    assert sorted(seen) == [i for i in range(len(pairs)) if i != 7]
    assert len(groups) == 3  # both decision verbs and the other acts were drawn
    assert model.distribution_batch(incl, [a for _, a in pairs], 0.0) == []


class _OneByOne(ActPersuadee):
    """The persuadee without its batched distribution: verbalized sampling asks it slot by slot."""

    distribution_batch = None  # type: ignore[assignment]


@pytest.mark.parametrize("floor,tau", [(0.01, 1.0), (0.0, 0.3), (0.05, 2.0)])
def test_renormalised_over_the_batch_draws_what_slot_by_slot_draws(floor, tau):
    from simpop.simulators.verbalized import Renormalised

    trajectories = []
    for inner in (_OneByOne(temperature=1.0), ActPersuadee(temperature=1.0)):
        engine = RolloutEngine(ENV, ActPolicy(1, 2), Renormalised(inner, floor=floor, tau=tau),
                               env_kwargs={"max_turns": 10})
        engine.policy = ActPolicy.for_env(engine.env_pool(1)[0], seed=5)
        trajectories.append(engine.collect(8, group_size=8, seed=13))
    old, new = trajectories
    for a, b in zip(old, new, strict=True):
        assert (a.actions, a.rewards, a.success, a.terminated) == (b.actions, b.rewards, b.success, b.terminated)
    assert sum(t.terminated for t in new) > 8  # many decisions were drawn, not only other replies


def test_renormalised_batch_falls_back_slot_by_slot_where_a_probability_is_zero():
    """A slot whose distribution lost an outcome to saturation is drawn one by one, in the same batch as the
    others, with the same draws as an all-slot-by-slot simulator."""
    from simpop.simulators.verbalized import Renormalised

    sims = [Renormalised(inner) for inner in (_OneByOne(temperature=1.0), ActPersuadee(temperature=1.0))]
    personas = PersonaSampler().sample_many(4, np.random.default_rng(0))
    scenarios = [type("S", (), {"persona": p, "id": str(i)})() for i, p in enumerate(personas)]
    observations = []
    for act in ("greeting", "ask-donation-amount", "credibility-appeal", "proposition-of-donation"):
        obs = np.zeros(2 * len(PERSUADER_ACTS) + 3, np.float32)
        obs[PERSUADER_ACTS.index(act)] = 1.0
        observations.append(obs)
    replies = []
    for sim in sims:
        sim.reset_batch(scenarios, [np.random.default_rng([1, i]) for i in range(4)])
        sim.inner._states.inclination[1] = 800.0  # slot 1 is asked and certain to give: P(refuse) == 0
        replies.append([sim.act_batch(observations, [0, 1, 2, 3]), [sim.slot_rng(i).random() for i in range(4)]])
        replies[-1].append([sim.inner.state(i) for i in range(4)])
    assert replies[0] == replies[1]
