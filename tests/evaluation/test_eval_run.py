"""The ``simpop eval`` runner: files, Wilson CIs per member, resume after a kill, failures, compare."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import simpop
from simpop.agents.policy import ActPolicy
from simpop.envs.persuasion.acts import PERSUADER_ACTS
from simpop.envs.persuasion.simulators import ActPersuadee
from simpop.evaluation.eval_compare import compare_evaluations, compare_table
from simpop.evaluation.eval_records import EPISODES, read_records
from simpop.evaluation.eval_run import evaluate_panel, plan_episodes
from simpop.evaluation.metrics import wilson_ci
from simpop.evaluation.panel import evaluate
from simpop.envs.persuasion.reference import ReferencePersuader
from simpop.evaluation.policies import load_policy
from simpop.simulators.population import Panel
from simpop.simulators.registry import load_panel
from simpop.seat import Player

ENV = "simpop/PersuasionAct-v0"
KWARGS = {"max_turns": 6}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny MLPs on a shared CPU: one torch thread is many times faster."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def act_panel():
    env = simpop.make(ENV, **KWARGS)
    members = {"native": "native", "heldout-1": "persuadee:heldout-1?temperature=1.2"}
    return load_panel({"name": "two", "members": members}, env)


def act_policy():
    return ActPolicy.for_env(simpop.make(ENV, **KWARGS), 16, seed=3)


def run(out, policy=None, panel=None, **options):
    options = {"episodes": 10, "seed": 7, "concurrency": 3, "env_kwargs": KWARGS, "policy_spec": "act-policy",
               **options}
    return evaluate_panel(ENV, policy or act_policy(), panel or act_panel(), out=out, **options)


def test_act_level_eval_end_to_end(tmp_path):
    summary = run(tmp_path)
    for name in ("episodes.jsonl", "summary.json", "report.md", "success.png", "eval.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "success.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    records = read_records(tmp_path / EPISODES)
    assert len(records) == 20 and summary["episodes"] == 20 and summary["complete"]
    assert {r.member for r in records} == {"native", "heldout-1"}
    for member in ("native", "heldout-1"):
        s, rs = summary["members"][member], [r for r in records if r.member == member]
        wins = sum(r.success for r in rs)
        assert (s["episodes"], s["successes"]) == (10, wins)
        assert (s["success"], s["ci_low"], s["ci_high"]) == pytest.approx(wilson_ci(wins, 10))
        assert 0.0 <= s["ci_low"] <= s["success"] <= s["ci_high"] <= 1.0
        assert s["spec"] and s["errors"] == 0
    assert 0.0 <= summary["ci_low"] <= summary["success"] <= summary["ci_high"] <= 1.0
    # Every member played the same scenarios with the same env seeds (common random numbers).
    plans = {m: [(r.scenario, r.seed) for r in records if r.member == m] for m in ("native", "heldout-1")}
    assert plans["native"] == plans["heldout-1"]
    # Transcripts alternate seats and end where the dialogue ended; entropy is the policy's own, weighted.
    first = records[0]
    assert first.transcript[0]["seat"] == "persuader" and first.transcript[0]["text"]
    assert first.turns == len(first.transcript) and first.policy_turns >= 1
    assert first.entropy_weight == first.policy_turns
    assert 0 < summary["entropy"] <= math.log(len(PERSUADER_ACTS))
    weighted = sum(r.entropy * r.entropy_weight for r in records) / sum(r.entropy_weight for r in records)
    assert summary["entropy"] == pytest.approx(weighted)
    tasks = summary["tasks"]
    assert sum(t["episodes"] for t in tasks.values()) == 20
    report = (tmp_path / "report.md").read_text()
    assert "| native |" in report and "| heldout-1 |" in report and "persuadee:heldout-1" in report


def test_same_seed_same_records_and_panel_evaluate_matches_counts(tmp_path):
    a = run(tmp_path / "a")
    b = run(tmp_path / "b")
    assert a == b
    assert [r.to_json() for r in read_records(tmp_path / "a" / EPISODES)] == \
        [r.to_json() for r in read_records(tmp_path / "b" / EPISODES)]
    assert run(tmp_path / "c", seed=8)["tasks"] != a["tasks"]
    # The panel evaluation that training uses now carries records and Wilson intervals too.
    result = evaluate(ENV, act_policy(), act_panel(), episodes=6, seed=2, env_kwargs=KWARGS)
    assert len(result.records) == 12 and {r.member for r in result.records} == {"native", "heldout-1"}
    assert all(r.transcript for r in result.records)
    wins = sum(r.success for r in result.records if r.member == "native")
    assert result.per_member_ci["native"] == pytest.approx(wilson_ci(wins, 6)[1:])
    assert 0 <= result.ci[0] <= result.success <= result.ci[1] <= 1


class InterruptAfter(Player):
    """Delegates to a policy, then raises KeyboardInterrupt (a kill) on call ``calls + 1``."""

    def __init__(self, policy, calls):
        self.policy, self.calls, self.n = policy, calls, 0

    def reset_batch(self, scenarios, rngs):
        self.policy.reset_batch(scenarios, rngs)

    def act_batch(self, observations, slots):
        self.n += 1
        if self.n > self.calls:
            raise KeyboardInterrupt
        return self.policy.act_batch(observations, slots)

    def entropy(self, trajectories):
        return self.policy.entropy(trajectories)


def test_kill_and_resume_gives_the_uninterrupted_result(tmp_path):
    whole = run(tmp_path / "whole")
    expected = [r.to_json() for r in read_records(tmp_path / "whole" / EPISODES)]
    killed = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        run(killed, policy=InterruptAfter(act_policy(), 25))
    kept = read_records(killed / EPISODES)
    assert 0 < len(kept) < 20 and len(kept) % 3 in (0, 1)  # whole chunks of 3 (a member's last chunk has 1)
    assert not (killed / "summary.json").exists()
    with pytest.raises(ValueError, match="already holds an evaluation"):
        run(killed)  # finished work is never overwritten
    resumed = run(killed, resume=True)
    assert resumed == whole
    assert sorted(r.to_json() for r in read_records(killed / EPISODES)) == sorted(expected)


def test_resume_after_a_torn_write(tmp_path):
    whole = run(tmp_path)
    lines = (tmp_path / EPISODES).read_text().splitlines(keepends=True)
    # Keep 7 records and half of the 8th (a write cut short mid-chunk).
    (tmp_path / EPISODES).write_text("".join(lines[:7]) + lines[7][: len(lines[7]) // 2])
    (tmp_path / "summary.json").unlink()
    resumed = run(tmp_path, resume=True)
    assert resumed == whole
    assert sorted(r.to_json() for r in read_records(tmp_path / EPISODES)) == sorted(
        line.strip() for line in lines)
    # Resuming a finished evaluation runs nothing and changes nothing.
    assert run(tmp_path, resume=True) == whole
    with pytest.raises(ValueError, match="different settings"):
        run(tmp_path, resume=True, seed=8)


class RaisesOnTurnFour(Player):
    """An act policy that raises at its fourth turn of a dialogue (longer dialogues fail); entropy unknown."""

    def __init__(self):
        self.policy = act_policy()

    def reset_batch(self, scenarios, rngs):
        self.policy.reset_batch(scenarios, rngs)

    def act_batch(self, observations, slots):
        # The persuader observation's second-to-last entry is its turns so far / max_turns.
        if any(round(float(o[-2]) * KWARGS["max_turns"]) == 3 for o in observations):
            raise ValueError("boom: no fourth turn")
        return self.policy.act_batch(observations, slots)


class Garbage(Player):
    """Returns actions the env rejects."""

    def act_batch(self, observations, slots):
        return ["not an act"] * len(observations)


def test_a_policy_that_raises_is_counted_not_fatal(tmp_path, caplog):
    summary = run(tmp_path, policy=RaisesOnTurnFour(), episodes=12)
    records = read_records(tmp_path / EPISODES)
    failed = [r for r in records if r.error is not None]
    assert len(records) == 24 and 0 < len(failed) < 24
    assert summary["errors"] == len(failed) == sum(s["errors"] for s in summary["members"].values())
    assert all("ValueError: boom: no fourth turn" in r.error and not r.success and r.reward == 0 for r in failed)
    assert any(r.transcript for r in failed)  # the dialogue up to the failure is kept
    assert all(r.policy_turns == 3 for r in failed)  # it failed at its fourth turn
    assert all(r.policy_turns < 4 for r in records)
    assert "episode failed: ValueError: boom" in caplog.text
    assert summary["entropy"] is None  # a policy without entropy()
    garbage = run(tmp_path / "garbage", policy=Garbage(), episodes=3)
    assert garbage["errors"] == 0 and garbage["success"] == 0.0
    assert garbage["invalid_actions"] == sum(r.policy_turns for r in read_records(tmp_path / "garbage" / EPISODES))


def test_num_trials_plays_every_task_k_times(tmp_path):
    env_kwargs = {"max_turns": 3, "n_scenarios": 4}
    env = simpop.make(ENV, **env_kwargs)
    panel = Panel([ActPersuadee(name="a"), ActPersuadee(temperature=1.5, name="b")])
    summary = evaluate_panel(ENV, ActPolicy.for_env(env, 8), panel, num_trials=3, seed=0, out=tmp_path,
                             concurrency=5, env_kwargs=env_kwargs)
    records = read_records(tmp_path / EPISODES)
    assert summary["episodes"] == len(records) == 2 * 4 * 3 and summary["tau2"] is None
    assert {(r.member, r.scenario) for r in records} == {(m, s) for m in "ab" for s in env.scenario_ids()}
    assert sorted(r.trial for r in records if r.member == "a" and r.scenario == env.scenario_ids()[0]) == [0, 1, 2]
    assert all(t["episodes"] == 6 for t in summary["tasks"].values())
    plan = plan_episodes(env.scenario_ids(), num_trials=2, seed=0)
    assert len({p.seed for p in plan}) == len(plan) == 8
    with pytest.raises(ValueError, match="exactly one"):
        plan_episodes(env.scenario_ids(), episodes=2, num_trials=2)


def test_reference_persuader_plays_reference_sequences(tmp_path):
    policy = load_policy("reference", simpop.make(ENV, **KWARGS))
    assert isinstance(policy, ReferencePersuader) and not policy.text
    summary = run(tmp_path, policy=policy, policy_spec="reference")
    for record in read_records(tmp_path / EPISODES):
        said = [t["text"] for t in record.transcript if t["seat"] == "persuader"]
        assert said and record.policy_turns == len(said) and record.invalid_actions == 0
    assert summary["success"] > 0  # it asks for the donation, unlike most untrained policies


def test_compare_pairs_member_task_cells(tmp_path):
    run(tmp_path / "a", episodes=12)
    run(tmp_path / "b", policy=load_policy("reference", simpop.make(ENV, **KWARGS)), episodes=12,
        policy_spec="reference")
    result = compare_evaluations(tmp_path / "a", tmp_path / "b", resamples=2000, seed=0)
    cells = {}
    for side in ("a", "b"):
        for r in read_records(tmp_path / side / EPISODES):
            cells.setdefault((r.member, r.scenario), {}).setdefault(side, []).append(float(r.success))
    diffs = [np.mean(v["b"]) - np.mean(v["a"]) for v in cells.values()]
    overall = result["overall"]
    assert overall["pairs"] == len(cells) and overall["diff"] == pytest.approx(np.mean(diffs))
    assert overall["ci_low"] <= overall["diff"] <= overall["ci_high"]
    assert set(result["members"]) == {"native", "heldout-1"}
    assert compare_evaluations(tmp_path / "a", tmp_path / "b", resamples=2000, seed=0) == result  # seeded
    same = compare_evaluations(tmp_path / "a", tmp_path / "a", resamples=100)
    assert same["overall"]["diff"] == same["overall"]["ci_low"] == same["overall"]["ci_high"] == 0
    table = compare_table(result)
    assert "| **all** |" in table and "| native |" in table
    with pytest.raises(FileNotFoundError, match="not a simpop eval folder"):
        compare_evaluations(tmp_path / "a", tmp_path / "nothing")


class Down(ActPersuadee):
    """A simulator whose model is down."""

    def act_batch(self, observations, slots):
        raise RuntimeError("simulator backend unreachable")


def test_a_simulator_that_raises_is_counted_per_member(tmp_path):
    panel = Panel([ActPersuadee(name="up"), Down(name="down")])
    summary = run(tmp_path, panel=panel, episodes=4)
    assert summary["members"]["down"]["errors"] == 4 and summary["members"]["down"]["success"] == 0.0
    assert summary["members"]["up"]["errors"] == 0 and summary["errors"] == 4 and summary["episodes"] == 8
    down = [r for r in read_records(tmp_path / EPISODES) if r.member == "down"]
    assert all(r.error == "RuntimeError: simulator backend unreachable" for r in down)
    assert all(r.transcript and r.transcript[0]["seat"] == "persuader" for r in down)  # the policy spoke first
