"""The P4G closing survey: asked at the turn cap, read strictly then leniently, answered by native persuadees."""

from __future__ import annotations

import logging

import gymnasium
import numpy as np
import pytest

import simpop
from simpop.envs.dialogue import parse_observation
from simpop.envs.persuasion.acts import PERSUADER_ACTS, render_persuader
from simpop.envs.persuasion.codec import decode_persuadee_action
from simpop.envs.persuasion.env import PersuasionActEnv, PersuasionEnv
from simpop.envs.persuasion.model import AMOUNT_LEVELS, PersuadeeModel
from simpop.envs.persuasion.outcome import SURVEY, SURVEY_AMOUNTS, SURVEY_OPTIONS, read_survey_answer
from simpop.envs.persuasion.personas import modal_persona
from simpop.envs.persuasion.simulators import ActPersuadee, TextPersuadee
from simpop.envs.registration import spec
from simpop.seat import SurveyAnswerer, survey_of

ER, EE = "persuader", "persuadee"
UNDECIDED = ((ER, "Hi!"), (EE, "Hello."), (ER, "Imagine a hungry child."), (EE, "I see."))


def to_survey(env: PersuasionEnv, seed: int = 3):
    """Play :data:`UNDECIDED` (max_turns=2) to the survey turn; return the last step."""
    env.reset(seed=seed)
    return [env.step({seat: msg}) for seat, msg in UNDECIDED][-1]


# ------------------------------------------------------------------ the env
def test_turn_cap_asks_the_survey_and_its_answer_is_the_outcome():
    env = PersuasionEnv(max_turns=2, render_mode="ansi")
    assert env.max_steps == 5 and env.dialogue_steps == 4
    obs, rewards, terms, truncs, infos = to_survey(env)
    assert not terms[ER] and not truncs[ER] and rewards == {ER: 0.0, EE: 0.0}
    assert env.to_act == EE and infos[ER]["to_act"] == EE and infos[EE]["phase"] == "survey"
    assert infos[ER]["donation"] is None and infos[ER]["outcome_source"] is None
    survey = survey_of(obs[EE])
    assert survey == SURVEY and survey.options == SURVEY_OPTIONS == (
        "I donate nothing", "I donate $0.05", "I donate $0.10", "I donate $0.25", "I donate $0.50", "I donate $1.00",
        "I donate $1.50", "I donate $2.00")
    assert all(option in survey.question for option in SURVEY_OPTIONS) and "$2" in survey.question
    view = parse_observation(obs[EE])
    assert view["to_act"] == EE and len(view["messages"]) == 4 and view["error"] is None
    assert survey_of(obs[ER]) is None and "survey" not in parse_observation(obs[ER])  # the persuader never sees it
    assert env.observation_space(EE).contains(obs[EE])

    obs, rewards, terms, truncs, infos = env.step({EE: "I donate $0.50"})
    assert terms[ER] and terms[EE] and not truncs[ER] and env.done and env.steps == env.max_steps
    assert rewards == {ER: 1.0, EE: 0.0}
    info = infos[ER]
    assert info["donation"] == 0.5 and info["donated"] is True and info["outcome_source"] == "survey"
    assert info["survey_answer"] == "I donate $0.50" and info["survey_parse"] == "strict"
    assert info["survey_reply"] == "I donate $0.50" and info["survey_reason"] is None and not info["survey_fallback"]
    assert infos[EE]["outcome_source"] == "survey"
    assert len(env.transcript) == 4  # the survey is not part of the chat
    assert env.render().endswith("[persuadee, closing survey] I donate $0.50")
    assert env.survey_counts == {"surveys": 1, "strict": 1, "lenient": 0, "fallback": 0}


def test_a_zero_answer_scores_zero_and_the_next_episode_starts_clean():
    env = PersuasionEnv(max_turns=2)
    to_survey(env)
    _, rewards, terms, _, infos = env.step({EE: "I donate nothing"})
    assert terms[ER] and rewards[ER] == 0.0 and infos[ER]["donation"] == 0.0 and infos[ER]["donated"] is False
    obs, infos = env.reset(seed=4)
    assert env.phase == "dialogue" and env.survey_answer is None and infos[ER]["outcome_source"] is None
    assert survey_of(obs[EE]) is None and env.to_act == ER


@pytest.mark.parametrize("answer, amount, parse", [
    ("$2.00", 2.0, "strict"), ("  $1.50. ", 1.5, "strict"), ('"$0.10"', 0.1, "strict"), ("**$0.05**", 0.05, "strict"),
    ("1", 1.0, "strict"), ("0.25", 0.25, "strict"), ("$.5", 0.5, "strict"), ("50 cents", 0.5, "strict"),
    ("2 dollars", 2.0, "strict"), ("$0", 0.0, "strict"), ("$0.00", 0.0, "strict"), ("i donate NOTHING", 0.0, "strict"),
    ("I donate $1.50", 1.5, "strict"), ("'I donate $0.25.'", 0.25, "strict"), ("I donate $0.30", 0.25, "lenient"),
    ("I'll give a dollar.", 1.0, "lenient"), ("No thanks, I'll pass.", 0.0, "lenient"), ("nothing", 0.0, "lenient"),
    ("[DONATE $0.2]", 0.25, "lenient"), ("$0.30 is what I can do", 0.25, "lenient"), ("$0.01", 0.05, "lenient"),
    ("Sure! $1.00, for the kids.", 1.0, "lenient"), ("I will donate all of it", 2.0, "lenient"),
])
def test_answers_are_read_strictly_then_leniently(answer, amount, parse):
    env = PersuasionEnv(max_turns=2)
    to_survey(env)
    _, rewards, terms, _, infos = env.step({EE: answer})
    assert terms[ER] and infos[ER]["donation"] == amount and infos[ER]["survey_parse"] == parse
    assert infos[ER]["survey_answer"] == SURVEY_OPTIONS[SURVEY_AMOUNTS.index(amount)]
    assert rewards[ER] == float(amount > 0)
    assert infos[ER]["survey_fallback"] is False and env.survey_counts[parse] == 1
    assert amount in SURVEY_AMOUNTS


@pytest.mark.parametrize("answer, why", [
    ("", "empty"), ("   \n", "empty"), ("$5", "off-scale"), ("-1", "off-scale"), ("7 dollars", "off-scale"),
    ("I'd say $3.50", "off-scale"), ("maybe later", "nothing readable"), ("$0.50 or $1.00?", "different amounts"),
    (None, "not text"), (3, "not text"), (["$1.00"], "not text"), ("x" * 5000, "nothing readable"),
])
def test_unreadable_answers_fall_back_to_zero_counted_and_logged(answer, why, caplog):
    env = PersuasionEnv(max_turns=2, max_message_chars=100)
    to_survey(env)
    with caplog.at_level(logging.DEBUG, logger="simpop.envs.persuasion.env"):
        _, rewards, terms, truncs, infos = env.step({EE: answer})
    info = infos[ER]
    assert terms[ER] and not truncs[ER] and rewards[ER] == 0.0 and "invalid_action" not in infos[EE]
    assert info["donation"] == 0.0 and info["outcome_source"] == "survey" and info["survey_fallback"] is True
    assert info["survey_parse"] == "fallback" and info["survey_answer"] == "I donate nothing"
    reason = {"nothing readable": "no option", "different amounts": "2 different amounts"}.get(why, why)
    assert reason in info["survey_reason"] and len(info["survey_reply"]) <= 500
    assert env.survey_counts == {"surveys": 1, "strict": 0, "lenient": 0, "fallback": 1}
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "recorded as $0" in caplog.text


def test_fallbacks_are_counted_across_episodes_and_warned_about_once(caplog):
    env = PersuasionEnv(max_turns=2)
    with caplog.at_level(logging.DEBUG, logger="simpop.envs.persuasion.env"):
        for seed, answer in enumerate(["??", "$1.00", "", "I'll give 10 cents"]):
            to_survey(env, seed)
            env.step({EE: answer})
    assert env.survey_counts == {"surveys": 4, "strict": 1, "lenient": 1, "fallback": 2}
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.DEBUG]
    assert "fallback 2 of 3 surveys" in caplog.records[1].getMessage()


def test_a_decision_in_the_dialogue_ends_it_before_the_survey():
    env = PersuasionEnv(max_turns=2)
    env.reset(seed=5)
    env.step({ER: "Hi!"})
    _, rewards, terms, _, infos = env.step({EE: "Sure, I'll donate $1."})
    assert terms[ER] and rewards[ER] == 1.0 and infos[ER]["outcome_source"] == "decided_in_dialogue"
    assert env.steps == 2 and env.survey_counts["surveys"] == 0 and env.phase == "dialogue"
    # A decision on the last dialogue step also wins over the survey.
    env.reset(seed=6)
    for seat, msg in UNDECIDED[:-1]:
        env.step({seat: msg})
    _, rewards, terms, _, infos = env.step({EE: "No thanks, I'll pass."})
    assert terms[ER] and infos[ER]["donation"] == 0.0 and infos[ER]["outcome_source"] == "decided_in_dialogue"
    assert env.survey_counts["surveys"] == 0 and env.steps == 4


def test_rejected_actions_count_towards_the_cap_and_do_not_reach_the_survey():
    env = PersuasionEnv(max_turns=1, max_message_chars=20)
    env.reset(seed=0)
    env.step({ER: ""})  # rejected: the persuader acts again
    obs, _, terms, truncs, infos = env.step({ER: "Hi!"})  # step 2 = the cap: the persuadee gets the survey
    assert env.to_act == EE and infos[EE]["phase"] == "survey" and not terms[ER] and not truncs[ER]
    assert survey_of(obs[EE]) == SURVEY and parse_observation(obs[ER])["error"] is None
    env.reset(seed=0)
    env.step({ER: "Hi!"})
    obs, _, _, _, infos = env.step({EE: "x" * 21})  # the persuadee's overlong reply is rejected at the cap
    assert "invalid_action" in infos[EE] and env.phase == "survey"
    assert parse_observation(obs[EE])["error"] is None  # the survey does not show the rejected message's error


def test_the_survey_turn_follows_the_parallel_api():
    env = PersuasionEnv(max_turns=2)
    to_survey(env)
    _, _, terms, _, infos = env.step({ER: "One more thing!", EE: "$1.00"})  # only the persuadee acts
    assert infos[ER]["off_turn_action_ignored"] is True and terms[ER] and infos[ER]["donation"] == 1.0
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step({EE: "$1.00"})
    to_survey(env)
    with pytest.raises(ValueError, match="persuadee"):
        env.step({ER: "Wait!"})


def test_ids_v1_asks_the_survey_v0_truncates():
    assert spec("simpop/Persuasion-v1").kwargs == {} and spec("simpop/Persuasion-v0").kwargs == {"survey": False}
    v1, v0 = simpop.make("simpop/Persuasion-v1", max_turns=2), simpop.make("simpop/Persuasion-v0", max_turns=2)
    assert v1.survey and not v0.survey and (v1.max_steps, v0.max_steps) == (5, 4)
    _, _, _, truncs, infos = to_survey(v0)
    assert truncs[ER] and v0.done and infos[ER]["outcome_source"] is None
    assert PersuasionActEnv().survey is False  # the act level keeps its semantics (package docstring)


# ------------------------------------------------------------------ native persuadees
def _persuadee_at_survey(sim: TextPersuadee, env: PersuasionEnv, seed: int, scenario: str = "p4g-0007"):
    env.reset(seed=seed, options={"scenario_id": scenario})
    sim.reset(env.scenario, env.user_rng())
    obs = None
    for message in ("Hello! How are you today?", "Kids in war zones need food and schooling; it breaks my heart."):
        obs, *_ = env.step({ER: message})
        obs, *_ = env.step({EE: sim.act(obs[EE])})
    assert env.phase == "survey", "the native persuadee decides only when asked"
    return obs[EE]


def test_text_persuadee_answers_from_its_decision_distribution():
    env = PersuasionEnv(max_turns=2)
    sim = TextPersuadee()
    assert isinstance(sim, SurveyAnswerer)
    obs = _persuadee_at_survey(sim, env, 0)
    state = sim.state(0)
    (probs,) = sim.survey_distribution([obs], [0], [SURVEY])
    model = PersuadeeModel()
    donate = model.donate_probability(state)
    expected = [1 - donate] + list(donate * model.amount_probabilities(state.inclination))
    assert probs == pytest.approx(expected) and sum(probs) == pytest.approx(1.0)
    assert sim.state(0) == state  # stating the distribution changes nothing
    draws = []
    for seed in range(2000):
        sim.reset(env.scenario, np.random.default_rng(seed))
        sim._states[0] = state
        draws.append(SURVEY_OPTIONS.index(sim.act(obs)))
    freq = np.bincount(draws, minlength=len(SURVEY_OPTIONS)) / len(draws)
    assert freq == pytest.approx(probs, abs=0.03)
    assert 0 < freq[0] < 1  # some refuse, some give: the survey carries signal


def test_greedy_text_persuadee_answers_the_argmax_whatever_the_seed():
    env = PersuasionEnv(max_turns=2)
    answers = set()
    for seed in range(6):
        sim = TextPersuadee(decoding="greedy", persona_override=modal_persona())
        obs = _persuadee_at_survey(sim, env, seed, scenario=f"p4g-{seed:04d}")
        (probs,) = sim.survey_distribution([obs], [0], [SURVEY])
        assert sorted(probs) == [0.0] * (len(SURVEY_OPTIONS) - 1) + [1.0]
        answers.add(sim.act(obs))
        assert SURVEY_OPTIONS[int(np.argmax(probs))] in answers
    assert len(answers) == 1


def test_the_text_survey_matches_the_act_levels_decision_when_asked():
    """Both levels share one decision rule: the survey is what the persuadee would decide if asked now."""
    text_env, act_env = PersuasionEnv(max_turns=2), PersuasionActEnv(max_turns=3)
    text, act = TextPersuadee(), ActPersuadee()
    obs = _persuadee_at_survey(text, text_env, 0)
    (probs,) = text.survey_distribution([obs], [0], [SURVEY])
    act_env.reset(seed=0, options={"scenario_id": "p4g-0007"})
    act.reset(act_env.scenario, act_env.user_rng())
    for name in ("greeting", "emotion-appeal"):
        o, *_ = act_env.step({ER: PERSUADER_ACTS.index(name)})
        act_env.step({EE: act.act(o[EE])})
    assert act.state(0).inclination == pytest.approx(text.state(0).inclination)
    o, *_ = act_env.step({ER: PERSUADER_ACTS.index("ask-donation-amount")})  # after an appeal: no penalty
    asked = {SURVEY_AMOUNTS.index(decode_persuadee_action(a)[1]): p for a, p in act.distribution(o[EE])}
    assert probs == pytest.approx([asked.get(i, 0.0) for i in range(len(SURVEY_OPTIONS))])


def test_native_persuadee_in_a_batch_mixing_survey_and_dialogue_turns():
    envs = [PersuasionEnv(max_turns=1) for _ in range(3)]
    sim = TextPersuadee()
    observations = [env.reset(seed=s)[0] for s, env in enumerate(envs)]
    sim.reset_batch([e.scenario for e in envs], [np.random.default_rng(s) for s in range(3)])
    observations = [env.step({ER: "Hi there!"})[0][EE] for env in envs]
    survey_obs = envs[1].step({EE: sim.act_batch([observations[1]], [1])[0]})[0][EE]
    assert survey_of(survey_obs) == SURVEY
    replies = sim.act_batch([observations[0], survey_obs, observations[2]], [0, 1, 2])
    assert replies[1] in SURVEY_OPTIONS and replies[0] not in SURVEY_OPTIONS and replies[2] not in SURVEY_OPTIONS


def test_single_agent_view_plays_the_survey_with_the_native_simulator():
    view = gymnasium.make("simpop/Persuasion-v1", max_turns=3).unwrapped
    outcomes = []
    for seed in range(30):
        view.reset(seed=seed)
        rng = np.random.default_rng(seed)
        for act in ("greeting", "emotion-appeal", "logical-appeal"):  # never asks
            _, reward, terminated, truncated, info = view.step(render_persuader(act, rng))
        assert terminated and not truncated and info["outcome_source"] == "survey"
        assert info["survey_parse"] == "strict" and reward == float(info["donation"] > 0)
        outcomes.append(info["donated"])
    assert 0 < sum(outcomes) < len(outcomes)


def test_amount_levels_are_the_survey_options():
    assert SURVEY_AMOUNTS == (0.0, *AMOUNT_LEVELS)
    assert [read_survey_answer(o).amount for o in SURVEY_OPTIONS] == list(SURVEY_AMOUNTS)
    assert all(read_survey_answer(o).option == o for o in SURVEY_OPTIONS)
