"""A study that shows the participants' questionnaire answers to the policies: only when its settings say so, only
to policies that read them, and fixed from the first participant on."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from simpop.agents.base import SamplingParams
from simpop.study import storage
from simpop.study.app import create_app
from simpop.study.chat import Arm, reads_instructions
from simpop.study.study import Study
from tests.study.conftest import ENV, TOKEN, make_study
from tests.study.test_study import play

RECORDING = {"A": "tests.study.policies:recording_text_policy"}
ITEMS = ["age", "sex", "ideology"]
ANSWERS = {"age": 34, "sex": "Female", "ideology": None}
BRIEFING = "before this chat they answered a short questionnaire about themselves"


def answered_chat(study, answers):
    """A new participant who answered ``answers``, in their first chat, played to the end."""
    _, key = study.register(None)
    study.answer(key, answers)
    return play(study.join(key), ["Hello.", "Tell me more.", "Hmm."])


@pytest.mark.parametrize("shown", [True, False])
def test_the_answers_reach_a_text_policys_prompt_only_when_the_study_says_so(tmp_path, shown):
    study = make_study(tmp_path / "s", RECORDING, questionnaire=ITEMS, questionnaire_to_policy=shown)
    page = TestClient(create_app(study, TOKEN)).post("/api/study", json={"token": TOKEN}).json()
    assert page["questionnaire_to_policy"] is shown  # the questionnaire page tells the person
    backend = study.arms["A"].policy.backend
    chat = answered_chat(study, ANSWERS)
    told = [c[0]["content"] for c in backend.chats]  # the system message of every call the model got
    assert len(told) == 3 and all(t.startswith(chat.env.scenario.policy_instructions(3)) for t in told)
    if shown:
        assert all(t.endswith(f"{BRIEFING} (items they left blank are not listed):\n- age: 34\n- sex: Female")
                   for t in told)
    else:
        assert not any(BRIEFING in t or "Female" in t for t in told)
    assert not any("Female" in m["content"] for c in backend.chats for m in c[1:])  # never in the dialogue itself
    blank = len(backend.chats)
    answered_chat(study, {})  # answered nothing: nothing to tell
    assert not any(BRIEFING in c[0]["content"] for c in backend.chats[blank:])
    study.rate(chat, {"naturalness": 3, "would_talk_again": True})
    study.close()
    briefed = {r.member: r.extra["study"]["briefed"] for r in storage.read_chats(tmp_path / "s")}
    assert briefed[chat.participant] is shown and sum(briefed.values()) == int(shown)
    assert json.loads((tmp_path / "s" / "study.json").read_text())["questionnaire_to_policy"] is shown


def test_a_token_policy_reads_the_answers_in_its_system_prompt(tmp_path, tiny_model):
    from simpop.agents.policy import ServedPolicy
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.envs.registration import make

    backend = TransformersBackend(str(tiny_model), dtype="float32", device="cpu")
    prompts: list[list[int]] = []
    generate_ids = backend.generate_ids

    def recorded(rows, params):
        prompts.extend(rows)
        return generate_ids(rows, params)

    backend.generate_ids = recorded
    policy = ServedPolicy(backend, SamplingParams(max_new_tokens=4, temperature=1.0))
    settings = {"env": ENV, "env_kwargs": {"max_turns": 2}, "policies": {"A": "served"}, "scenarios": ["p4g-0000"],
                "seed": 0, "chats_per_participant": 1, "questionnaire": ITEMS, "questionnaire_to_policy": True}
    study = Study(tmp_path / "s", settings, {"A": Arm("A", "served", policy)}, lambda: make(ENV, max_turns=2))
    _, key = study.register(None)
    study.answer(key, ANSWERS)
    chat = study.join(key)
    assert chat.wait_turn(30) and prompts  # the policy spoke first
    chat.close()
    study.close()
    assert "- age: 34\n- sex: Female" in backend.tokenizer.decode(prompts[0])


def test_a_policy_that_cannot_read_the_answers_is_refused_at_start(tmp_path):
    from simpop.agents.policy import ServedPolicy

    for policies, blind in (({"A": "reference"}, "A=reference"),
                            ({**RECORDING, "B": "tests.study.policies:Asker"}, "B=tests.study.policies:Asker")):
        with pytest.raises(ValueError, match=f"policy {blind} cannot be shown the answers"):
            make_study(tmp_path / "s", policies, questionnaire=ITEMS, questionnaire_to_policy=True)
    with pytest.raises(ValueError, match="ask some with --questionnaire"):
        make_study(tmp_path / "s", RECORDING, questionnaire_to_policy=True)
    assert not (tmp_path / "s").exists()
    fixed = ServedPolicy(backend=None, sampling=SamplingParams(), fixed_system_prompt="You persuade people.")
    assert not reads_instructions(fixed, None) and reads_instructions(ServedPolicy(None, SamplingParams()), None)


def test_the_setting_cannot_change_after_the_first_participant(tmp_path):
    make_study(tmp_path / "s", RECORDING, questionnaire=ITEMS).close()
    study = make_study(tmp_path / "s", RECORDING, questionnaire=ITEMS, questionnaire_to_policy=True)  # nobody yet
    study.register(None)
    study.close()
    with pytest.raises(ValueError, match="questionnaire_to_policy: True -> False.*fixed once the first participant"):
        make_study(tmp_path / "s", RECORDING, questionnaire=ITEMS)
    make_study(tmp_path / "s", RECORDING, questionnaire=ITEMS, questionnaire_to_policy=True).close()
    # A study folder from before the setting existed continues with it off (its default).
    path = tmp_path / "old" / "study.json"
    make_study(tmp_path / "old", RECORDING, questionnaire=ITEMS).register(None)
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "questionnaire_to_policy"}))
    make_study(tmp_path / "old", RECORDING, questionnaire=ITEMS).close()
