"""Participant modes: ``persona`` (the person plays the scenario's card) and ``self`` (people as themselves).

In ``self`` mode the card explains the task without a persona and the person decides with their own stake.
Only P4G has one: the charity, and a bonus the researcher states (``bonus``, at most the env's $2 scale)
of which the person may pledge any part. The dialogue, the decision reading and the closing survey stay the
env's own, so the pledge is scored exactly as in training (``info["donation"]``, success = a pledge above $0);
the survey shows only the options the bonus covers. τ² and CooperBench keep their scenario cards: their tasks
are the scenario. A pledge above the person's bonus is refused in the chat (:func:`over_bonus`): the person
restates it, so every recorded pledge is one they can pay. The optional questionnaire asks the persona attributes
simpop models (:data:`QUESTIONS`) before the first chat; the answers go to the ledger and the report sets them
beside the shipped persona distributions. They reach the policy only where the study says so
(``questionnaire_to_policy``): then :func:`briefing` is added to the policy seat's instructions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simpop.envs.persuasion.env import PersuasionEnv
from simpop.envs.persuasion.outcome import (MAX_DONATION, SURVEY_AMOUNTS, SURVEY_OPTIONS, parse_donation,
                                            read_survey_answer)
from simpop.envs.persuasion.personas import CATEGORIES, SCALES, PersonaSampler
from simpop.seat import Survey

MODES = ("persona", "self")

#: The questionnaire's items: attribute -> (question, options); ``age`` is a number on its P4G scale.
QUESTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "age": ("Your age in years", ()),
    "sex": ("Your sex", CATEGORIES["sex"]),
    "race": ("Your race or ethnicity", CATEGORIES["race"]),
    "edu": ("Your highest education", CATEGORIES["edu"]),
    "marital": ("Your marital status", CATEGORIES["marital"]),
    "employment": ("Your employment", CATEGORIES["employment"]),
    "religion": ("Your religion", CATEGORIES["religion"]),
    "ideology": ("Your political views", CATEGORIES["ideology"]),
}


def check_mode(env: Any, mode: str, bonus: float, questionnaire: list[str]) -> None:
    """Refuse a mode (or questionnaire) the env cannot run (ValueError with the reason)."""
    if questionnaire and not isinstance(env, PersuasionEnv):
        raise ValueError(f"the questionnaire asks P4G's persona attributes; {type(env).__name__} has none")
    if mode not in MODES:
        raise ValueError(f"participant mode {mode!r}: use one of {', '.join(MODES)}")
    if mode == "self":
        if not isinstance(env, PersuasionEnv):
            raise ValueError(f"--participant-mode self needs an env whose task a person can do as themselves "
                             f"(simpop/Persuasion-v1); {type(env).__name__}'s task is its scenario card: use persona")
        if not 0 < bonus <= MAX_DONATION:
            raise ValueError(f"--bonus must be above $0 and at most ${MAX_DONATION:g} (P4G scores pledges from $0 "
                             f"to ${MAX_DONATION:g}), got {bonus:g}")


def self_card(bonus: float) -> str:
    """The P4G card in self mode: the charity and the person's own bonus, no persona."""
    return (f"This chat is part of a research study. You will chat with a partner about Save the Children, an "
            f"international charity that supports children's health, education and safety in developing "
            f"countries and war zones.\n\nOn top of your payment you receive a bonus of ${bonus:.2f}. You may "
            f"pledge any part of it, from $0 to ${bonus:.2f}, to Save the Children: the research team deducts "
            f"your pledge from your bonus and donates it. Whether you pledge, and how much, is entirely up to "
            f"you.\n\nBe yourself and reply as you normally would. When you have decided, say so in the chat "
            f"(for example \"I'll give $0.50\" or \"no thanks\"); if you have not decided when the chat ends, you "
            f"will be asked.")


def self_survey(survey: Survey, bonus: float) -> Survey:
    """P4G's closing survey as a person in self mode sees it: about their bonus, the options it covers."""
    amounts = dict(zip(SURVEY_OPTIONS, SURVEY_AMOUNTS))
    return Survey(f"The chat is over. How much of your ${bonus:.2f} bonus do you pledge to Save the Children?",
                  tuple(o for o in survey.options if amounts.get(o, 0.0) <= bonus + 1e-9))


def over_bonus(text: str, bonus: float, survey: bool) -> str | None:
    """Why a self-mode message must be restated: it pledges more than the person's bonus (None if it does not).

    The message is read as the env reads it: in the chat with :func:`parse_donation` (a stated decision), at the
    closing survey with :func:`read_survey_answer`.
    """
    amount = read_survey_answer(text).amount if survey else parse_donation(text)
    if amount is None or amount <= bonus + 1e-9:
        return None
    return (f"Your bonus is ${bonus:.2f}, so you can pledge from $0 to ${bonus:.2f}, not ${amount:.2f}. "
            f"Please write your decision again.")


def briefing(answers: dict[str, Any] | None) -> str | None:
    """What the policy is told of its chat partner when the study shows it the questionnaire (the answered items;
    None when nothing was answered)."""
    given = {name: value for name, value in (answers or {}).items() if value is not None}
    if not given:
        return None
    lines = [f"- {name}: {value:g}" if isinstance(value, float) else f"- {name}: {value}"
             for name, value in given.items()]
    return ("About your chat partner: before this chat they answered a short questionnaire about themselves "
            "(items they left blank are not listed):\n" + "\n".join(lines))


def check_answers(answers: dict[str, Any], asked: list[str]) -> dict[str, Any]:
    """The questionnaire's answers, checked (ValueError names the first bad one); unanswered items are None."""
    out: dict[str, Any] = {}
    unknown = sorted(set(answers) - set(asked))
    if unknown:
        raise ValueError(f"unknown questionnaire item(s): {', '.join(unknown[:5])}")
    for name in asked:
        value = answers.get(name)
        if value is None:
            out[name] = None
        elif name == "age":
            low, high = SCALES["age"]
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise ValueError(f"age must be a number from {low:g} to {high:g}")
            out[name] = float(value)
        elif value not in QUESTIONS[name][1]:
            raise ValueError(f"{name}: choose one of the options")
        else:
            out[name] = value
    return out


def check_questionnaire(items: list[str]) -> list[str]:
    """The questionnaire's item names, checked (ValueError on an unknown one)."""
    unknown = [i for i in items if i not in QUESTIONS]
    if unknown:
        raise ValueError(f"unknown questionnaire item(s) {unknown}; choose from {', '.join(QUESTIONS)}")
    return list(dict.fromkeys(items))


def persona_reference(item: str) -> dict[str, Any]:
    """One questionnaire item's distribution in the personas simpop ships: ``training`` (the default
    scenarios' sampler) and ``p4g_people`` (the shipped fit of the real P4G persuadees); age as mean and sd,
    categories as probabilities."""
    from simpop.envs.persuasion.release import human_sampler

    out: dict[str, Any] = {}
    for name, sampler in (("training", PersonaSampler()), ("p4g_people", human_sampler())):
        marginal = sampler.marginals[item]
        support, probs = marginal.support(item), marginal.probabilities(item)
        if item == "age":
            mean = float(np.dot(support, probs))
            out[name] = {"mean": mean, "sd": float(np.sqrt(np.dot(probs, (np.asarray(support) - mean) ** 2)))}
        else:
            out[name] = {option: float(p) for option, p in zip(support, probs)}
    return out
