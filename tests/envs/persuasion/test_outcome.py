"""parse_donation: the documented rule, table-driven, and properties under random text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpop.envs.persuasion.outcome import parse_donation
from tests.hypothesis_budget import examples

CASES = [
    # tags decide, the last one wins, amounts clamp
    ("[DONATE $0.75]", 0.75),
    ("Sure! [donate $1]", 1.0),
    ("[DONATE 0.5]", 0.5),
    ("[DONATE: $.25]", 0.25),
    ("[DONATE $2] no wait [DONATE $0]", 0.0),
    ("I'll give $1 [DONATE $0.5]", 0.5),
    ("[DONATE $5]", 2.0),
    ("[DONATE $abc] I'll give 10 cents", 0.1),
    # pledges with amounts
    ("I'll give 50 cents", 0.5),
    ("I'll donate $1", 1.0),
    ("I will donate one dollar.", 1.0),
    ("Okay, I'll give a dollar fifty.", 1.5),
    ("I'll donate a dollar and a half", 1.5),
    ("I'll donate one dollar and twenty cents", 1.2),
    ("I'll donate twenty-five cents", 0.25),
    ("I'd like to contribute $0.30 to Save the Children.", 0.3),
    ("I would like to donate $0.20. Would that help?", 0.2),
    ("I can spare a penny.", 0.01),
    ("Count me in for a quarter", 0.25),
    ("I'll do $1", 1.0),
    ("Let me give 2 dollars", 2.0),
    ("I'll donate .50", 0.5),
    ("I'll donate 1", 1.0),
    ("I'll donate 50", 0.5),
    ("I'll donate half a dollar", 0.5),
    ("I'll donate half", 1.0),
    ("I'll donate all of it", 2.0),
    ("I'll give the full $2", 2.0),
    ("I'll donate everything", 2.0),
    ("I'll donate $5", 2.0),
    ("I'll give 2 dollars a day", 2.0),
    ("I can't wait to donate $1!", 1.0),
    ("I\u2019ll donate $1", 1.0),
    # refusals are decisions of 0
    ("I won't donate", 0.0),
    ("no thanks, I'll pass", 0.0),
    ("No thank you.", 0.0),
    ("I'm not donating.", 0.0),
    ("Not today, sorry.", 0.0),
    ("I'd rather keep my money.", 0.0),
    ("I don't want to give anything.", 0.0),
    ("I'll donate nothing", 0.0),
    ("I'll donate $0.", 0.0),
    # the last decision wins
    ("I can't give $2 but I'll give 10 cents", 0.1),
    ("I'll give $1. Actually no, I won't donate.", 0.0),
    ("No thanks. Well, okay, I'll donate 25 cents.", 0.25),
    # no decision
    ("Sure, I'll donate", None),
    ("I donated $5 last year.", None),
    ("Would a dollar help?", None),
    ("Can I donate $1 later?", None),
    ("Hello, how are you?", None),
    ("That sounds like a great cause.", None),
    ("I do think charity matters, I have $2", None),
    ("$2 is my whole payment.", None),
    ("", None),
]


@pytest.mark.parametrize("text, expected", CASES)
def test_documented_rule(text, expected):
    got = parse_donation(text)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_non_strings_state_nothing():
    assert parse_donation(None) is None  # type: ignore[arg-type]
    assert parse_donation(3) is None  # type: ignore[arg-type]


_WORDS = st.sampled_from(["I'll", "donate", "give", "$1", "$0.50", "cents", "dollar", "a", "no", "thanks", "won't",
                          "half", "all", "of", "it", "[DONATE", "$2]", "fifty", ".", "?", "but", "not", "pass",
                          "1.5", "nothing", "the", "full", "can't", "I", "'d", "like", "to", ","])


@settings(max_examples=examples(300), deadline=None)
@given(st.text())
def test_any_text_is_none_or_within_bounds(text):
    got = parse_donation(text)
    assert got is None or 0.0 <= got <= 2.0


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_WORDS, max_size=25).map(" ".join))
def test_donation_vocabulary_is_none_or_within_bounds(text):
    got = parse_donation(text)
    assert got is None or 0.0 <= got <= 2.0


@settings(max_examples=examples(200), deadline=None)
@given(st.floats(min_value=-100, max_value=100, allow_nan=False).map(lambda x: round(x, 2)), st.text(max_size=40))
def test_a_tag_always_decides(amount, noise):
    text = f"{noise} [DONATE ${abs(amount)}]"
    assert parse_donation(text) == pytest.approx(min(abs(amount), 2.0))
