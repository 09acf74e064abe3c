"""Act inventories, the persuader-text classifier and the realisers."""

from __future__ import annotations

import numpy as np
import pytest

from simpop.envs.persuasion.acts import (DECISION_ACTS, DONATING_ACTS, PERSUADEE_ACTS, PERSUADEE_TEMPLATES,
                                         PERSUADER_ACTS, PERSUADER_TEMPLATES, REFUSING_ACTS, STRATEGIES,
                                         classify_persuader, format_amount, render_persuadee, render_persuader)
from simpop.envs.persuasion.model import AMOUNT_LEVELS
from simpop.envs.persuasion.outcome import parse_donation


def test_inventories():
    assert len(STRATEGIES) == 10 and len(PERSUADER_ACTS) == 14 and len(set(PERSUADER_ACTS)) == 14
    assert len(PERSUADEE_ACTS) == 23 and len(set(PERSUADEE_ACTS)) == 23
    assert {"agree-donation", "disagree-donation", "provide-donation-amount"} <= set(PERSUADEE_ACTS)
    assert set(PERSUADER_TEMPLATES) == set(PERSUADER_ACTS) and set(PERSUADEE_TEMPLATES) == set(PERSUADEE_ACTS)
    assert all(len(t) >= 3 for t in [*PERSUADER_TEMPLATES.values(), *PERSUADEE_TEMPLATES.values()])


@pytest.mark.parametrize("act", PERSUADER_ACTS)
def test_every_persuader_phrasing_classifies_as_its_act(act):
    for text in PERSUADER_TEMPLATES[act]:
        assert classify_persuader(text) == act, text


@pytest.mark.parametrize("text, act", [
    ("Could you donate a dollar to help?", "proposition-of-donation"),
    ("how much are you willing to give?", "ask-donation-amount"),
    ("Hey! Good to see you", "greeting"),
    ("Kids in Syria are dying from hunger.", "emotion-appeal"),
    ("They have a long track record and are audited every year.", "credibility-appeal"),
    ("Save the Children runs schools in 120 countries.", "logical-appeal"),
    ("What is your favourite food?", "personal-related-inquiry"),
    ("asdf qwer", "greeting"),
    ("", "greeting"),
])
def test_classifier_on_free_text(text, act):
    assert classify_persuader(text) == act


def test_non_decision_phrasings_state_no_donation_and_refusals_state_zero():
    for act, templates in PERSUADEE_TEMPLATES.items():
        if act in DONATING_ACTS:
            continue
        for text in templates:
            assert parse_donation(text) == (0.0 if act in REFUSING_ACTS else None), (act, text)


@pytest.mark.parametrize("amount", AMOUNT_LEVELS + (0.3, 1.25))
def test_donating_phrasings_state_their_amount(amount):
    rng = np.random.default_rng(0)
    for act in DONATING_ACTS:
        for _ in range(12):
            text = render_persuadee(act, amount, rng)
            assert parse_donation(text) == pytest.approx(amount), text


def test_realisers_are_seeded_and_canonical_without_rng():
    a = [render_persuader(x, np.random.default_rng(4)) for x in PERSUADER_ACTS]
    b = [render_persuader(x, np.random.default_rng(4)) for x in PERSUADER_ACTS]
    assert a == b
    assert render_persuader("greeting", None) == PERSUADER_TEMPLATES["greeting"][0]
    assert render_persuadee("agree-donation", 0.5, None) == "Okay, you convinced me. I'll donate $0.50."
    assert format_amount(2.0, None) == "$2"
    phrasings = {render_persuadee("thank", None, np.random.default_rng(s)) for s in range(30)}
    assert phrasings == set(PERSUADEE_TEMPLATES["thank"])


def test_donating_act_without_amount_is_rejected():
    with pytest.raises(ValueError, match="amount"):
        render_persuadee("agree-donation", None, None)
    with pytest.raises(ValueError, match="amount"):
        render_persuadee("provide-donation-amount", 0.0, None)
    assert set(DECISION_ACTS) == set(DONATING_ACTS) | set(REFUSING_ACTS)
