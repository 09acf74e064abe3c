"""Persona attributes, the documented sampler marginals, the modal persona and descriptions."""

from __future__ import annotations

import numpy as np
import pytest

from simpop.envs.persuasion.personas import (CATEGORIES, CATEGORICAL, DEFAULT_MARGINALS, NUMERIC, PERSONA_FIELDS,
                                             SCALES, EmpiricalPersonaSampler, Marginal, Persona, PersonaSampler,
                                             modal_persona)


@pytest.fixture(scope="module")
def sample():
    return PersonaSampler().sample_many(4000, np.random.default_rng(0))


def test_persona_has_the_32_p4g_attributes():
    assert len(PERSONA_FIELDS) == 32 and len(set(PERSONA_FIELDS)) == 32
    assert set(NUMERIC) | set(CATEGORICAL) == set(PERSONA_FIELDS)


def test_samples_stay_on_their_scales_and_categories(sample):
    for p in sample[:500]:
        for name in NUMERIC:
            lo, hi = SCALES[name]
            assert lo <= getattr(p, name) <= hi
        for name in CATEGORICAL:
            assert getattr(p, name) in CATEGORIES[name]


@pytest.mark.parametrize("name", [n for n in NUMERIC if n != "income"])
def test_numeric_marginals_match_the_documented_mean_and_sd(sample, name):
    m = DEFAULT_MARGINALS[name]
    values = np.array([getattr(p, name) for p in sample])
    lo, _ = SCALES[name]
    exact_mean = float(m.probabilities(name) @ np.array(m.support(name)))
    assert abs(values.mean() - exact_mean) < 4 * m.sd / np.sqrt(len(values))
    # Clipping to the scale pulls the mean inwards and shrinks the spread, a little.
    assert abs(exact_mean - m.mean) < 0.25 * m.sd
    assert 0.75 * m.sd < values.std() < 1.1 * m.sd
    steps = (values - lo) / m.step
    assert np.allclose(steps, np.round(steps), atol=1e-6)


@pytest.mark.parametrize("name", [*CATEGORICAL, "income"])
def test_categorical_marginals_match_their_weights(sample, name):
    m = DEFAULT_MARGINALS[name]
    support = m.support(name)
    counts = np.array([sum(getattr(p, name) == v for p in sample) for v in support]) / len(sample)
    assert np.allclose(counts, m.probabilities(name), atol=0.03)


def test_modal_persona_takes_each_attributes_mode():
    modal = modal_persona()
    sampler = PersonaSampler()
    for name in PERSONA_FIELDS:
        m = sampler.marginals[name]
        assert getattr(modal, name) == m.support(name)[int(np.argmax(m.probabilities(name)))]
    assert modal.sex == "Female" and modal.race == "White" and modal.ideology == "Liberal"
    assert modal.agreeable == pytest.approx(3.8) or modal.agreeable == pytest.approx(4.0)


def test_sampling_is_seeded():
    a = PersonaSampler().sample_many(5, np.random.default_rng(3))
    b = PersonaSampler().sample_many(5, np.random.default_rng(3))
    assert a == b and len(set(a)) == 5


def test_custom_marginals_must_cover_every_attribute():
    with pytest.raises(ValueError, match="lack attributes"):
        PersonaSampler({"age": Marginal(30, 5)})


def test_from_mapping_checks_scales():
    values = modal_persona().to_dict()
    assert Persona.from_mapping(values) == modal_persona()
    assert Persona.from_mapping({**values, "care": "5"}).care == 5.0
    with pytest.raises(ValueError, match="care"):
        Persona.from_mapping({**values, "care": 9})
    with pytest.raises(KeyError):
        Persona.from_mapping({k: v for k, v in values.items() if k != "open"})


def test_centred_maps_scales_to_unit_interval():
    p = Persona.from_mapping({**modal_persona().to_dict(), "care": 6.0, "rational": 1.0, "income": 6.5})
    assert p.centred("care") == 1.0 and p.centred("rational") == -1.0 and p.centred("income") == 0.0


def test_describe_renders_the_persona_as_text():
    p = Persona.from_mapping({**modal_persona().to_dict(), "age": 41, "sex": "Male", "care": 6.0, "power": 1.0,
                              "religion": "Catholic", "ideology": "Conservative"})
    text = p.describe()
    assert "41-year-old" in text and "man" in text and "Catholic" in text and "conservative" in text
    assert "very high care for others" in text and "very low power" in text


def test_empirical_sampler_resamples_and_has_a_mode():
    people = PersonaSampler().sample_many(3, np.random.default_rng(1))
    sampler = EmpiricalPersonaSampler([people[0], people[0], people[1]])
    assert {sampler.sample(np.random.default_rng(s)) for s in range(20)} <= set(people[:2])
    assert sampler.modal_persona().age == people[0].age
    with pytest.raises(ValueError):
        EmpiricalPersonaSampler([])
