"""Behaviour of the text and act P4G envs: turn order, misuse, bad actions, outcome, observations."""

from __future__ import annotations

import numpy as np
import pytest

from simpop.envs.dialogue import parse_observation
from simpop.envs.persuasion.acts import PERSUADEE_ACTS, PERSUADER_ACTS
from simpop.envs.persuasion.codec import (PERSUADEE_OBS_DIM, PERSUADER_OBS_DIM, decode_persuadee_action,
                                          encode_persuadee_action, last_persuader_act)
from simpop.envs.persuasion.env import PersuasionActEnv, PersuasionEnv
from simpop.envs.persuasion.model import AMOUNT_LEVELS

ER, EE = "persuader", "persuadee"


def act_index(name: str) -> int:
    return PERSUADER_ACTS.index(name)


# ------------------------------------------------------------------ shared contract
@pytest.mark.parametrize("make, er_action, ee_action", [
    (PersuasionEnv, "Hello!", "Hi."), (PersuasionActEnv, 12, encode_persuadee_action("greeting"))])
def test_off_turn_action_is_ignored_and_flagged(make, er_action, ee_action):
    env = make()
    env.reset(seed=0)
    _, _, _, _, infos = env.step({ER: er_action, EE: ee_action})
    assert infos[EE]["off_turn_action_ignored"] is True and "off_turn_action_ignored" not in infos[ER]
    assert len(env.transcript) == 1 and env.transcript[0].seat == ER and env.to_act == EE
    _, _, _, _, infos = env.step({EE: ee_action, ER: None})
    assert "off_turn_action_ignored" not in infos[ER] and len(env.transcript) == 2


@pytest.mark.parametrize("make, er_action, refusal", [
    (PersuasionEnv, "Would you like to donate?", "No thanks, I'll pass."),
    (PersuasionActEnv, 10, encode_persuadee_action("disagree-donation"))])
def test_misuse_raises(make, er_action, refusal):
    env = make()
    with pytest.raises(RuntimeError, match="reset"):
        env.step({ER: er_action})
    env.reset(seed=0)
    with pytest.raises(ValueError, match="persuader"):
        env.step({EE: refusal})
    with pytest.raises(KeyError, match="unknown seats"):
        env.step({ER: er_action, "judge": 1})
    env.step({ER: er_action})
    _, _, terms, _, _ = env.step({EE: refusal})
    assert terms[ER] and env.done
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step({ER: er_action})


def test_constructor_validates():
    with pytest.raises(ValueError, match="max_turns"):
        PersuasionEnv(max_turns=0)
    with pytest.raises(ValueError, match="max_message_chars"):
        PersuasionEnv(max_message_chars=0)
    with pytest.raises(ValueError, match="n_scenarios"):
        PersuasionActEnv(n_scenarios=0)


# ------------------------------------------------------------------ text env
@pytest.mark.parametrize("bad, why", [(42, "must be a str"), ("", "empty message"), ("   \n", "empty message"),
                                      ("x" * 31, "31 characters; the limit is 30"), (None, "must be a str")])
def test_text_bad_actions_give_an_error_observation(bad, why):
    env = PersuasionEnv(max_message_chars=30, max_turns=3)
    env.reset(seed=1)
    obs, rewards, terms, truncs, infos = env.step({ER: bad})
    assert why in infos[ER]["invalid_action"] and why in parse_observation(obs[ER])["error"]
    assert parse_observation(obs[EE])["error"] is None
    assert env.to_act == ER and env.transcript == [] and env.steps == 1
    assert rewards[ER] == 0.0 and not terms[ER] and not truncs[ER]
    obs, _, _, _, infos = env.step({ER: "Hi!"})
    assert "invalid_action" not in infos[ER] and parse_observation(obs[ER])["error"] is None


@pytest.mark.parametrize("reply, donation, reward", [
    ("Okay, I'll donate $1.", 1.0, 1.0), ("Sure [DONATE $0.25]", 0.25, 1.0), ("No thanks, I'll pass.", 0.0, 0.0),
    ("[DONATE $0]", 0.0, 0.0), ("I'll give all of it!", 2.0, 1.0)])
def test_text_decision_terminates(reply, donation, reward):
    env = PersuasionEnv()
    env.reset(seed=2)
    env.step({ER: "Hello, how are you?"})
    _, rewards, terms, truncs, infos = env.step({EE: "Fine, thanks."})
    assert not terms[EE] and infos[ER]["donation"] is None and infos[ER]["donated"] is False
    env.step({ER: "Would you like to donate to Save the Children?"})
    _, rewards, terms, truncs, infos = env.step({EE: reply})
    assert terms[ER] and terms[EE] and not truncs[ER]
    assert rewards == {ER: reward, EE: 0.0}
    assert infos[ER]["donation"] == donation and infos[ER]["donated"] is (donation > 0)
    assert env.transcript[-1].data["donation"] == donation
    assert infos[ER]["outcome_source"] == "decided_in_dialogue" and infos[ER]["survey_answer"] is None
    assert infos[ER]["survey_fallback"] is False and env.survey_counts["surveys"] == 0


def test_text_without_survey_truncates_after_max_turns():
    env = PersuasionEnv(max_turns=2, survey=False)
    env.reset(seed=3)
    steps = [env.step({seat: msg}) for seat, msg in
             ((ER, "Hi!"), (EE, "Hello."), (ER, "Imagine a hungry child."), (EE, "I see."))]
    _, rewards, terms, truncs, infos = steps[-1]
    assert not any(s[3][ER] for s in steps[:-1])
    assert truncs[ER] and not terms[ER] and rewards[ER] == 0.0
    assert infos[ER]["donation"] is None and infos[ER]["donated"] is False and env.max_steps == 4
    assert infos[ER]["outcome_source"] is None and env.survey_counts["surveys"] == 0


def test_text_observations_and_transcript():
    env = PersuasionEnv(render_mode="ansi")
    obs, infos = env.reset(seed=4)
    er, ee = parse_observation(obs[ER]), parse_observation(obs[EE])
    assert er["to_act"] == ER and er["messages"] == [] and "Save the Children" in er["instructions"]
    assert env.scenario.persona.describe() not in obs[ER] and env.scenario.persona.describe() in ee["instructions"]
    assert infos[ER]["donation"] is None and infos[ER]["scenario_id"] == env.scenario.id
    obs, *_ = env.step({ER: "They were founded in 1919 and are very transparent."})
    assert parse_observation(obs[EE])["messages"] == [
        {"role": "user", "content": "They were founded in 1919 and are very transparent."}]
    assert env.transcript[0].act == "credibility-appeal"
    assert env.observation_space(ER).contains(obs[ER]) and env.observation_space(EE).contains(obs[EE])
    assert env.render() == "[persuader] They were founded in 1919 and are very transparent."


# ------------------------------------------------------------------ act env
def test_persuadee_action_encoding_round_trips():
    for act in PERSUADEE_ACTS:
        for amount in AMOUNT_LEVELS:
            decoded = decode_persuadee_action(encode_persuadee_action(act, amount))
            if act in ("agree-donation", "provide-donation-amount", "confirm-donation"):
                assert decoded == (act, amount)
            else:
                assert decoded[0] == act and decoded[1] == (0.0 if "disagree" in act else None)
    with pytest.raises(ValueError, match="amount"):
        encode_persuadee_action("agree-donation", 0.33)


@pytest.mark.parametrize("good", [3, np.int64(3), np.int8(0), np.array(13)])
def test_act_int_like_actions_are_taken(good):
    env = PersuasionActEnv()
    env.reset(seed=0)
    _, _, _, _, infos = env.step({ER: good})
    assert "invalid_action" not in infos[ER] and env.transcript[-1].act == PERSUADER_ACTS[int(good)]


@pytest.mark.parametrize("bad", [14, -1, "3", 2.5, True, np.int64(14), np.bool_(True), np.float32(3.0), np.array(14)])
def test_act_bad_actions_are_flagged(bad):
    env = PersuasionActEnv()
    env.reset(seed=0)
    _, _, terms, _, infos = env.step({ER: bad})
    assert "in [0, 14)" in infos[ER]["invalid_action"] and env.to_act == ER and not terms[ER]
    assert env.last_error[ER] == infos[ER]["invalid_action"]


@pytest.mark.parametrize("ee_act, amount, reward", [("agree-donation", 0.5, 1.0), ("provide-donation-amount", 2.0, 1.0),
                                                     ("disagree-donation", 0.0, 0.0),
                                                     ("disagree-donation-more", 0.0, 0.0)])
def test_act_decisions_terminate(ee_act, amount, reward):
    env = PersuasionActEnv()
    env.reset(seed=5)
    env.step({ER: act_index("emotion-appeal")})
    _, _, terms, _, _ = env.step({EE: encode_persuadee_action("positive-reaction-to-donation")})
    assert not terms[ER]
    env.step({ER: act_index("proposition-of-donation")})
    _, rewards, terms, truncs, infos = env.step({EE: encode_persuadee_action(ee_act, amount)})
    assert terms[ER] and not truncs[ER] and rewards[ER] == reward and infos[ER]["donation"] == amount
    assert infos[ER]["outcome_source"] == "decided_in_dialogue" and "survey_answer" not in infos[ER]
    assert env.transcript[-1].act == ee_act and env.transcript[-2].act == "proposition-of-donation"


def test_act_truncates_after_max_turns():
    env = PersuasionActEnv(max_turns=3)
    env.reset(seed=0)
    for _turn in range(3):
        env.step({ER: act_index("logical-appeal")})
        _, rewards, terms, truncs, infos = env.step({EE: encode_persuadee_action("acknowledgement")})
    assert truncs[ER] and not terms[ER] and rewards[ER] == 0.0
    assert infos[ER]["outcome_source"] is None and infos[ER]["donation"] is None and env.max_steps == 6


def test_act_observations_encode_the_dialogue():
    env = PersuasionActEnv(max_turns=4)
    obs, _ = env.reset(seed=0)
    er = obs[ER]
    assert er.shape == (PERSUADER_OBS_DIM,) and er.dtype == np.float32
    assert er[len(PERSUADEE_ACTS)] == 1.0 and er[-1] == 1.0 and er[-2] == 0.0
    assert last_persuader_act(obs[EE]) is None and obs[EE].shape == (PERSUADEE_OBS_DIM,)
    obs, *_ = env.step({ER: act_index("credibility-appeal")})
    assert last_persuader_act(obs[EE]) == "credibility-appeal" and obs[EE][-1] == 1.0 and obs[ER][-1] == 0.0
    obs, *_ = env.step({EE: encode_persuadee_action("ask-org-info")})
    er = obs[ER]
    assert er[PERSUADEE_ACTS.index("ask-org-info")] == 1.0 and er[:len(PERSUADEE_ACTS) + 1].sum() == 1.0
    counts = er[len(PERSUADEE_ACTS) + 1:len(PERSUADEE_ACTS) + 1 + len(PERSUADER_ACTS)]
    assert counts[act_index("credibility-appeal")] == pytest.approx(0.25) and counts.sum() == pytest.approx(0.25)
    assert er[-2] == pytest.approx(0.25) and er[-1] == 1.0
    assert all(env.observation_space(a).contains(obs[a]) for a in obs)
    assert env.transcript[0].text and env.transcript[1].text.endswith("?")


def test_act_transcript_text_is_seeded():
    def transcript(seed):
        env = PersuasionActEnv()
        env.reset(seed=seed)
        for a in (0, 1, 2):
            env.step({ER: a})
            env.step({EE: encode_persuadee_action("acknowledgement")})
        return [t.text for t in env.transcript]

    assert transcript(1) == transcript(1)
    assert len({tuple(transcript(s)) for s in range(8)}) > 1
