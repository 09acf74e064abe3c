"""P4G's simulator kinds: ``persuadee`` (act or text, base or held-out models, persona sets),
``verbalized:persuadee`` (renormalised stated distribution) and populations / panels of them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simpop.envs.persuasion.acts import PERSUADER_ACTS, STRATEGIES
from simpop.envs.persuasion.env import PersuasionActEnv, PersuasionEnv
from simpop.envs.persuasion.model import (CORPUS_DONOR_RATE, CORPUS_MEAN_DONATION, PersuadeeParams,
                                          asked_inclinations, expected_outcomes)
from simpop.envs.persuasion.personas import PersonaSampler, modal_persona
from simpop.envs.persuasion.simulators import ActPersuadee, TextPersuadee, model_params
from simpop.seat import SimulatorSpec
from simpop.simulators.population import Panel, Population
from simpop.simulators.registry import build_simulator, load_panel
from simpop.simulators.verbalized import Renormalised, renormalise

JITTERED = ("act_effects", "modulation", "trait_weights")


def _training_personas(env):
    return {env.load_scenario(i).persona for i in env.scenario_ids()}


# ================================================================================ persuadee
@pytest.mark.parametrize("make, cls", [(PersuasionActEnv, ActPersuadee), (PersuasionEnv, TextPersuadee)])
def test_the_env_chooses_the_act_or_text_persuadee(make, cls):
    sim = build_simulator("persuadee?temperature=0.7", env=make())
    assert type(sim) is cls and sim.temperature == 0.7 and sim.decoding == "sample" and sim.personas is None
    assert sim.name == "persuadee?temperature=0.7"
    assert sim.spec == SimulatorSpec.parse("persuadee:base?temperature=0.7")  # the model defaults to base
    assert SimulatorSpec.parse(str(sim.spec)) == sim.spec
    greedy = build_simulator("persuadee?decoding=greedy&personas=modal", env=make())
    assert type(greedy) is cls and greedy.decoding == "greedy" and greedy.temperature == 0.0
    assert greedy.personas == [modal_persona()] and greedy.spec.personas == "modal"
    assert SimulatorSpec.parse(str(greedy.spec)) == greedy.spec
    assert greedy.model.params == sim.model.params == PersuadeeParams()


def test_the_persuadee_kind_needs_an_env_and_valid_names():
    with pytest.raises(ValueError, match="persuadee simulators need the env"):
        build_simulator("persuadee")
    env = PersuasionActEnv()
    for model in ["heldout", "heldout-x", "heldout-", "gpt2", "base-1"]:
        with pytest.raises(ValueError, match=f"unknown persuadee model '{model}'; use base, heldout-<i>"):
            build_simulator(f"persuadee:{model}", env=env)
    for personas in ["nope", "heldout-0-1", "heldout-x-1", "heldout-5", "heldout-5-1-2", "modal-1", "uniform-0-1",
                     "uniform-5"]:
        with pytest.raises(ValueError, match=f"unknown P4G persona set '{personas}'; use modal, heldout, "
                                             "heldout-<n>-<seed>"):
            build_simulator(f"persuadee?personas={personas}", env=env)
    with pytest.raises(ValueError, match="decoding must be one of"):
        build_simulator("persuadee?decoding=beam", env=env)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        build_simulator("persuadee?temperature=0", env=env)
    with pytest.raises(ValueError, match="'temperature' expects float"):
        build_simulator("persuadee?temperature=hot", env=env)


def test_heldout_models_differ_from_base_and_each_other_and_are_calibrated():
    env = PersuasionActEnv()
    base = PersuadeeParams()
    sims = [build_simulator(f"persuadee:heldout-{i}?personas=heldout", env=env) for i in range(3)]
    personas = list(env.persona_set("heldout"))
    for i, sim in enumerate(sims):
        params = sim.model.params
        assert sim.spec.model == f"heldout-{i}" and SimulatorSpec.parse(str(sim.spec)) == sim.spec
        assert params == model_params(f"heldout-{i}", personas)  # deterministic in the name
        assert all(getattr(params, name) != getattr(base, name) for name in (*JITTERED, "intercept"))
        # Only the jittered fields and the recalibrated intercept / amount shift move.
        same = {f.name for f in dataclasses.fields(base)} - {*JITTERED, "intercept", "amount_shift"}
        assert all(getattr(params, name) == getattr(base, name) for name in same)
        # Recalibrated on the personas it plays: a corpus-like persuader still gets the corpus figures.
        rate, mean = expected_outcomes(params, asked_inclinations(params, personas, np.random.default_rng(1)))
        assert rate == pytest.approx(CORPUS_DONOR_RATE, abs=0.03) and mean == pytest.approx(CORPUS_MEAN_DONATION,
                                                                                            abs=0.03)
    assert len({s.model.params for s in sims}) == 3
    # The jitter and its seed are parameters of the model (and of its spec).
    other = build_simulator("persuadee:heldout-0?personas=heldout&model_seed=7&jitter=0.1", env=env)
    assert other.model.params != sims[0].model.params
    assert dict(other.spec.extra) == {"jitter": 0.1, "model_seed": 7, "corpus": ""}
    assert SimulatorSpec.parse(str(other.spec)) == other.spec


def test_shuffled_models_reassign_which_strategy_works_and_are_calibrated():
    env = PersuasionActEnv()
    base = PersuadeeParams()
    personas = list(env.persona_set("uniform-300-9"))
    strategies = [PERSUADER_ACTS.index(a) for a in STRATEGIES]
    others = [i for i in range(len(PERSUADER_ACTS)) if i not in strategies]
    models = [model_params(f"shuffled-{i}", personas, seed=9) for i in range(4)]
    for params in models:
        for name in ("act_effects", "modulation"):
            new, old = getattr(params, name), getattr(base, name)
            # a permutation of the strategies' entries (the same one for both fields), other acts unchanged
            assert sorted(new[i] for i in strategies) == sorted(old[i] for i in strategies)
            assert [new[i] for i in others] == [old[i] for i in others]
        assert params.act_effects != base.act_effects and params.trait_weights == base.trait_weights
        rate, _ = expected_outcomes(params, asked_inclinations(params, personas, np.random.default_rng(1)))
        assert rate == pytest.approx(CORPUS_DONOR_RATE, abs=0.03)
    assert len({m.act_effects for m in models}) == 4 and models[0] == model_params("shuffled-0", personas, seed=9)
    sim = build_simulator("persuadee:shuffled-1?temperature=1.5&personas=uniform-300-9&model_seed=9", env=env)
    assert sim.model.params == models[1] and SimulatorSpec.parse(str(sim.spec)) == sim.spec


def test_uniform_persona_set_spreads_every_attribute_evenly():
    env = PersuasionActEnv()
    uniform, heldout = env.persona_set("uniform-3000-5"), env.persona_set("heldout-3000-5")
    assert not set(uniform) & (_training_personas(env) | {modal_persona()})
    for name, (support, _) in PersonaSampler()._tables.items():
        counts = np.array([sum(getattr(p, name) == v for p in uniform) for v in support]) / len(uniform)
        assert np.allclose(counts, 1 / len(support), atol=0.04), name
    # far more extreme people than the population sampler draws: care at the scale's bottom half
    low_care = lambda personas: np.mean([p.care < 3 for p in personas])  # noqa: E731
    assert low_care(uniform) > 0.3 > 0.05 > low_care(heldout)


def test_persona_sets_exclude_the_training_personas():
    env = PersuasionActEnv()
    training = _training_personas(env)
    assert env.persona_set("modal") == (modal_persona(),)
    assert env.persona_set("heldout") == env.persona_set("heldout-300-4242")
    small = env.persona_set("heldout-60-7")
    assert 0 < len(small) <= 60 and not set(small) & (training | {modal_persona()})
    assert len(set(small)) > 30 and small == env.persona_set("heldout-60-7") != env.persona_set("heldout-60-8")
    # The set is relative to the env's own scenarios: an env trained on some of the same draws loses them.
    overlapping = PersuasionActEnv(n_scenarios=100, scenario_seed=4242)
    assert len(overlapping.persona_set("heldout")) == len(env.persona_set("heldout")) - 100
    assert not set(overlapping.persona_set("heldout")) & _training_personas(overlapping)
    with pytest.raises(ValueError, match="no persona outside the training scenarios"):
        PersuasionActEnv(n_scenarios=300, scenario_seed=4242).persona_set("heldout")
    # A persona set replaces the scenario's persona, drawn with the slot's generator.
    sim = build_simulator("persuadee?personas=heldout-60-7", env=env)
    assert sim.personas == list(small) and sim.spec.personas == "heldout-60-7"
    scenario = env.load_scenario(env.scenario_ids()[0])
    sim.reset_batch([scenario] * 12, [np.random.default_rng(i) for i in range(12)])
    again = build_simulator("persuadee?personas=heldout-60-7", env=env)
    again.reset_batch([scenario] * 12, [np.random.default_rng(i) for i in range(12)])
    states = [sim.state(i) for i in range(12)]
    assert states == [again.state(i) for i in range(12)] and len({s.inclination for s in states}) > 1
    assert all(s != sim.model.initial_state(scenario.persona) for s in states)


def test_scenario_personas_are_played_by_default():
    env = PersuasionActEnv()
    sim = build_simulator("persuadee", env=env)
    scenario = env.load_scenario(env.scenario_ids()[3])
    sim.reset(scenario, np.random.default_rng(0))
    assert sim.spec.personas == "scenario" and sim.state() == sim.model.initial_state(scenario.persona)


# ================================================================================ verbalized:persuadee
def _after_first_turn(env, seed, sims, act="source-related-inquiry"):
    """Reset ``env`` and each simulator (slot 0, generator seeded ``seed``), play ``act``; the persuadee's obs."""
    env.reset(seed=seed)
    for sim in sims:
        sim.reset(env.scenario, np.random.default_rng(seed))
    obs, *_ = env.step({"persuader": PERSUADER_ACTS.index(act)})
    return obs["persuadee"]


@pytest.mark.parametrize("params, floor, tau", [("", 0.01, 1.0), ("?floor=0.05&tau=0.5", 0.05, 0.5),
                                                ("?floor=0.0&tau=2.0&temperature=0.6", 0.0, 2.0)])
def test_verbalized_persuadee_is_exactly_the_renormalised_stated_distribution(params, floor, tau):
    env = PersuasionActEnv()
    sim = build_simulator(f"verbalized:persuadee{params}", env=env)
    plain = build_simulator(f"persuadee{params.replace(f'floor={floor!r}', '').replace(f'tau={tau!r}', '')}", env=env)
    assert isinstance(sim, Renormalised) and type(sim.inner) is ActPersuadee
    assert (sim.floor, sim.tau) == (floor, tau) and sim.inner.temperature == plain.temperature
    assert SimulatorSpec.parse(str(sim.spec)) == sim.spec and sim.spec.inner() == plain.spec
    obs = _after_first_turn(env, 0, [sim, plain])
    stated = plain.distribution(obs)
    got = sim.distribution(obs)
    assert [a for a, _ in got] == [a for a, _ in stated]
    assert [p for _, p in got] == renormalise([p for _, p in stated], floor, tau)  # exactly, not approximately
    if floor:
        assert min(p for _, p in got) > 0 and len(got) == len(stated)


def test_verbalized_persuadee_draws_with_the_slot_generator():
    env = PersuasionActEnv()
    spec = "verbalized:persuadee?floor=0.05&tau=0.7"
    reference = build_simulator("persuadee", env=env)
    draws = []
    for seed in range(40):
        sim, again = build_simulator(spec, env=env), build_simulator(spec, env=env)
        obs = _after_first_turn(env, seed, [sim, again, reference])
        options = reference.distribution(obs)
        p = renormalise([q for _, q in options], 0.05, 0.7)
        expected = options[int(np.random.default_rng(seed).choice(len(p), p=p))][0]
        action = sim.act(obs)
        assert action == expected == again.act(obs)  # same seed, same action: drawn from the slot's generator
        assert sim.inner.state().counts[PERSUADER_ACTS.index("source-related-inquiry")] == 1  # committed
        draws.append(action)
    assert len(set(draws)) > 3


def test_verbalized_persuadee_batches_like_single_slots():
    envs = [PersuasionActEnv() for _ in range(4)]
    spec = "verbalized:persuadee?tau=1.5"
    sim = build_simulator(spec, env=envs[0])
    for env in envs:
        env.reset(seed=3)
    sim.reset_batch([e.scenario for e in envs], [np.random.default_rng([9, i]) for i in range(4)])
    observations = [env.step({"persuader": PERSUADER_ACTS.index("greeting")})[0]["persuadee"] for env in envs]
    batched = sim.act_batch(observations, [0, 1, 2, 3])
    singles = []
    for i, env in enumerate(envs):
        single = build_simulator(spec, env=env)
        single.reset(env.scenario, np.random.default_rng([9, i]))
        singles.append(single.act(observations[i]))
    assert batched == singles


def test_verbalized_needs_a_stated_distribution():
    with pytest.raises(TypeError, match="does not state its distribution"):
        build_simulator("verbalized:persuadee", env=PersuasionEnv())  # the text persuadee states none
    with pytest.raises(ValueError, match="floor must be in"):
        build_simulator("verbalized:persuadee?floor=1.0", env=PersuasionActEnv())


# ================================================================================ populations and panels
def test_populations_of_persuadee_specs():
    env = PersuasionActEnv()
    pop = build_simulator(["persuadee?temperature=0.8", "persuadee?decoding=greedy&personas=modal",
                           "verbalized:persuadee"], env=env)
    assert isinstance(pop, Population) and [type(m) for m in pop.members] == [ActPersuadee, ActPersuadee, Renormalised]
    weighted = build_simulator({"members": {"warm": "persuadee?temperature=0.8", "cold": "persuadee?decoding=greedy"},
                                "weights": [1, 3], "rule": "weighted", "name": "mix"}, env=env)
    assert weighted.name == "mix" and [m.name for m in weighted.members] == ["warm", "cold"]
    assert weighted.probabilities() == pytest.approx([0.25, 0.75])
    obs = _after_first_turn(env, 0, [])
    weighted.reset_batch([env.scenario] * 8, [np.random.default_rng(i) for i in range(8)])
    assert len(weighted.act_batch([obs] * 8, list(range(8)))) == 8


def test_panel_yaml_of_heldout_persuadees(tmp_path):
    path = tmp_path / "panel.yaml"
    path.write_text("name: p4g-heldout\nmembers:\n"
                    "  heldout-0: persuadee:heldout-0?temperature=0.8&personas=heldout\n"
                    "  heldout-1: persuadee:heldout-1?temperature=0.9&personas=heldout\n")
    for make, cls in [(PersuasionActEnv, ActPersuadee), (PersuasionEnv, TextPersuadee)]:
        env = make()
        panel = load_panel(path, env)
        assert isinstance(panel, Panel) and panel.name == "p4g-heldout" and len(panel) == 2
        assert all(type(m) is cls for _, m in panel) and panel["heldout-1"].temperature == 0.9
        assert panel["heldout-0"].model.params != panel["heldout-1"].model.params
        training = [build_simulator("persuadee?decoding=greedy&personas=modal", env=env), build_simulator(
            "persuadee", env=env)]
        panel.check_disjoint(training, strict=True)  # other models, decodings and personas than training


BOTH_LEVELS = ["persuadee", "persuadee:heldout-1?decoding=greedy&personas=heldout-40-3", "native"]
ACT_ONLY = ["verbalized:persuadee?tau=0.5", "verbalized:persuadee:heldout-0?personas=modal", "trainable:persuadee",
            "trainable:persuadee:heldout-2?temperature=0.5&personas=heldout", "native:simpop/PersuasionAct-v0"]


@pytest.mark.parametrize("make, spec", [(PersuasionActEnv, s) for s in BOTH_LEVELS + ACT_ONLY]
                         + [(PersuasionEnv, s) for s in BOTH_LEVELS + ["native:simpop/Persuasion-v1",
                                                                       "native:simpop/Persuasion-v0"]])
def test_every_p4g_kind_has_a_spec_that_round_trips_and_rebuilds(make, spec):
    env = make()
    sim = build_simulator(spec, env=env)
    assert SimulatorSpec.parse(str(sim.spec)) == sim.spec
    rebuilt = build_simulator(str(sim.spec), env=env)  # the canonical string builds the same simulator
    assert type(rebuilt) is type(sim) and rebuilt.spec == sim.spec
