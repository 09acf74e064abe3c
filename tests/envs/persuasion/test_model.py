"""The native persuadee model: parameters, persona-dependent effects, decoding and calibration."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from simpop.envs.persuasion.acts import DECISION_ACTS, PERSUADER_ACTS
from simpop.envs.persuasion.model import (AMOUNT_LEVELS, CORPUS_DONOR_RATE, CORPUS_MEAN_DONATION, PersuadeeModel,
                                          PersuadeeParams, asked_inclinations, calibrate, expected_outcomes,
                                          reference_persuader)
from simpop.envs.persuasion.personas import Persona, PersonaSampler, modal_persona


def persona(**traits) -> Persona:
    return Persona.from_mapping({**modal_persona().to_dict(), **traits})


def gain(model: PersuadeeModel, who: Persona, *acts: str) -> float:
    """Inclination change from hearing ``acts`` in order."""
    state = start = model.initial_state(who)
    for act in acts:
        state = model.update(state, act)
    return state.inclination - start.inclination


# ------------------------------------------------------------------ parameters
def test_vector_view_round_trips():
    params = PersuadeeParams()
    vector = params.to_vector()
    assert vector.shape == (sum(PersuadeeParams.sizes().values()),)
    assert PersuadeeParams.from_vector(vector) == params
    shifted = PersuadeeParams.from_vector(vector + 0.01 * (np.arange(len(vector)) % 3 == 0))
    assert shifted != params and np.allclose(shifted.to_vector(), vector + 0.01 * (np.arange(len(vector)) % 3 == 0))
    lo, hi = PersuadeeParams.bounds()
    assert lo.shape == hi.shape == vector.shape and np.all(lo <= vector) and np.all(vector <= hi)
    assert np.isfinite(lo).sum() == 3


def test_params_are_validated():
    with pytest.raises(ValueError, match="act_effects needs 14"):
        PersuadeeParams(act_effects=(0.1,))
    with pytest.raises(ValueError, match="repeat_decay"):
        PersuadeeParams(repeat_decay=1.5)
    with pytest.raises(ValueError, match="finite"):
        PersuadeeParams(intercept=float("nan"))
    with pytest.raises(ValueError, match="shape"):
        PersuadeeParams.from_vector(np.zeros(3))
    sizes = PersuadeeParams.sizes()
    offset = sum(sizes[n] for n in list(sizes)[:list(sizes).index("repeat_decay")])
    bad = PersuadeeParams().to_vector()
    bad[offset] = -1.0
    with pytest.raises(ValueError, match="repeat_decay"):
        PersuadeeParams.from_vector(bad)
    lo, hi = PersuadeeParams.bounds()
    assert PersuadeeParams.from_vector(np.clip(bad, lo, hi)).repeat_decay == 0.0


# ------------------------------------------------------------------ persona-dependent effects
@pytest.mark.parametrize("act, high, low", [
    ("emotion-appeal", dict(care=6.0, agreeable=5.0, intuitive=5.0), dict(care=1.0, agreeable=1.0, intuitive=1.0)),
    ("logical-appeal", dict(rational=5.0, conscientious=5.0), dict(rational=1.0, conscientious=1.0)),
    ("credibility-appeal", dict(authority=6.0), dict(authority=1.0)),
    ("self-modeling", dict(conform=6.0), dict(conform=1.0)),
    ("personal-related-inquiry", dict(extrovert=5.0), dict(extrovert=1.0)),
])
def test_effects_depend_on_the_persona(act, high, low):
    model = PersuadeeModel()
    assert gain(model, persona(**high), "greeting", act) > gain(model, persona(**low), "greeting", act) > -0.5


def test_baseline_rises_with_care_and_falls_with_power():
    model = PersuadeeModel()
    carer, powerful = persona(care=6.0, benevolence=6.0), persona(power=6.0, hedonism=6.0)
    assert model.initial_state(carer).inclination > model.initial_state(modal_persona()).inclination
    assert model.initial_state(powerful).inclination < model.initial_state(modal_persona()).inclination


def test_repetition_has_diminishing_then_negative_returns():
    model, who = PersuadeeModel(), modal_persona()
    first = gain(model, who, "emotion-appeal")
    second = gain(model, who, "emotion-appeal", "emotion-appeal") - first
    third = gain(model, who, "emotion-appeal", "emotion-appeal", "emotion-appeal") - first - second
    assert first > second > third and third < 0


def test_premature_proposition_hurts_and_inquiries_build_rapport():
    model, who = PersuadeeModel(), modal_persona()
    premature = gain(model, who, "proposition-of-donation")
    assert premature == pytest.approx(-PersuadeeParams().premature_penalty)
    assert gain(model, who, "logical-appeal", "proposition-of-donation") > 0
    with_rapport = gain(model, who, "personal-related-inquiry", "emotion-appeal") - gain(
        model, who, "personal-related-inquiry")
    assert with_rapport > gain(model, who, "emotion-appeal")
    assert model.update(model.initial_state(who), "task-related-inquiry").rapport > 0


# ------------------------------------------------------------------ decoding
def test_distribution_over_replies():
    model = PersuadeeModel()
    state = model.update(model.initial_state(modal_persona()), "emotion-appeal")
    replies = model.distribution(state, "emotion-appeal")
    assert sum(p for _, p in replies) == pytest.approx(1.0)
    assert all(amount is None and act not in DECISION_ACTS for (act, amount), _ in replies)
    asked = model.update(state, "proposition-of-donation")
    decision = model.distribution(asked, "proposition-of-donation")
    assert sum(p for _, p in decision) == pytest.approx(1.0)
    assert {act for (act, _), _ in decision} == {"agree-donation", "disagree-donation"}
    assert {amount for (act, amount), _ in decision if act == "agree-donation"} == set(AMOUNT_LEVELS)
    p_agree = sum(p for (act, _), p in decision if act == "agree-donation")
    assert p_agree == pytest.approx(1 / (1 + np.exp(-asked.inclination)))
    amount_asked = model.distribution(asked, "ask-donation-amount")
    assert {act for (act, _), _ in amount_asked} == {"provide-donation-amount", "disagree-donation"}


def test_greedy_takes_every_argmax_and_draws_nothing():
    model = PersuadeeModel()
    state = model.update(model.initial_state(modal_persona()), "greeting")
    greedy = model.distribution(state, "greeting", temperature=0)
    assert greedy == [(("greeting", None), 1.0)]
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    asked = model.update(state, "logical-appeal")
    asked = model.update(asked, "proposition-of-donation")
    reply = model.respond(asked, "proposition-of-donation", rng, temperature=0)
    assert rng.bit_generator.state == before
    expected = "agree-donation" if asked.inclination > 0 else "disagree-donation"
    assert reply[0] == expected


def test_temperature_flattens_the_distribution():
    model = PersuadeeModel()
    state = model.update(model.initial_state(modal_persona()), "logical-appeal")

    def entropy(t):
        p = np.array([q for _, q in model.distribution(state, "logical-appeal", temperature=t)])
        return float(-(p * np.log(p)).sum())

    assert entropy(0.5) < entropy(1.0) < entropy(2.0)
    with pytest.raises(ValueError, match="temperature"):
        model.distribution(state, "logical-appeal", temperature=-1)


def test_sampled_replies_follow_the_distribution():
    model = PersuadeeModel()
    state = model.update(model.initial_state(modal_persona()), "source-related-inquiry")
    rng = np.random.default_rng(1)
    draws = [model.respond(state, "source-related-inquiry", rng)[0] for _ in range(3000)]
    for (act, _), p in model.distribution(state, "source-related-inquiry"):
        assert draws.count(act) / len(draws) == pytest.approx(p, abs=0.03)


# ------------------------------------------------------------------ calibration
def test_reference_persuader_looks_like_the_corpus():
    rng = np.random.default_rng(0)
    for _ in range(50):
        acts = reference_persuader(rng, 10)
        assert len(acts) == 10 and acts[0] == "greeting" and set(acts) <= set(PERSUADER_ACTS)
        ask = acts.index("proposition-of-donation")
        assert 5 <= ask <= 9 and all(a == "closing" for a in acts[ask + 1:])


def test_defaults_are_the_calibrated_values():
    fresh = calibrate(PersuadeeParams())
    assert fresh.intercept == pytest.approx(PersuadeeParams().intercept, abs=0.02)
    assert fresh.amount_shift == pytest.approx(PersuadeeParams().amount_shift, abs=0.05)


def test_calibration_hits_its_targets_on_held_out_personas():
    rng = np.random.default_rng(123)
    personas = PersonaSampler().sample_many(3000, rng)
    rate, mean = expected_outcomes(PersuadeeParams(), asked_inclinations(PersuadeeParams(), personas, rng))
    assert rate == pytest.approx(CORPUS_DONOR_RATE, abs=0.02)
    assert mean == pytest.approx(CORPUS_MEAN_DONATION, abs=0.02)
    assert mean / rate == pytest.approx(0.65, abs=0.03)


def test_calibrate_to_other_targets():
    params = calibrate(PersuadeeParams(), target_rate=0.3, target_mean=0.15, n=800)
    rng = np.random.default_rng(0)
    personas = PersonaSampler().sample_many(800, rng)
    rate, mean = expected_outcomes(params, asked_inclinations(params, personas, rng))
    assert rate == pytest.approx(0.3, abs=0.03) and mean == pytest.approx(0.15, abs=0.03)
    with pytest.raises(ValueError, match="out of reach"):
        calibrate(target_rate=0.5, target_mean=1.5)


def test_greedy_decision_is_the_sign_of_the_inclination():
    model = PersuadeeModel(replace(PersuadeeParams(), intercept=5.0))
    state = model.update(model.initial_state(modal_persona()), "ask-donation-amount")
    assert model.donate_probability(state, 0) == 1.0
    assert model.donate_probability(state) == pytest.approx(1 / (1 + np.exp(-state.inclination)))
