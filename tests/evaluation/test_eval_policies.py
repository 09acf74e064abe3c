"""Policy specs of ``simpop eval``: run folders, module:attr objects, reference agents, text chats, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

import simpop
from simpop.agents.policy import ActPolicy
from simpop.envs.persuasion.reference import ReferencePersuader
from simpop.envs.tau2.reference import GoldTau2Agent
from simpop.evaluation.policies import PolicySpecError, TextPolicy, load_policy, observation_chat, policy_format
from simpop.seat import Player
from simpop import checkpoint

ENV = "simpop/PersuasionAct-v0"


class FirstAct(Player):
    """A scripted policy: always act 0 (no entropy method)."""

    def act_batch(self, observations, slots):
        return [0] * len(observations)


NOT_A_POLICY = 42


def make_run(tmp_path, states, trainer="grpo", hidden_size=16, nested=False):
    """A run folder as ``simpop train`` writes it, with one checkpoint per (step, policy state)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"trainer": trainer, "env": ENV, "simulator": "native", "env_kwargs": {}}))
    (run / "config.yaml").write_text(yaml.safe_dump({"grpo": {"seed": 5, "temperature": 1.0},
                                                     "model": {"hidden_size": hidden_size}}))
    for step, state in states.items():
        checkpoint.save(run, step, {"policy_trainer": {"policy": state}} if nested else {"policy": state}, keep=None)
    return run


def same_weights(a, b):
    return all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_run_folder_newest_or_chosen_step(tmp_path):
    env = simpop.make(ENV)
    old, new = ActPolicy.for_env(env, 16, seed=1), ActPolicy.for_env(env, 16, seed=2)
    run = make_run(tmp_path, {3: old.state_dict(), 7: new.state_dict()})
    assert same_weights(load_policy(f"run:{run}", env, env_id=ENV), new)
    assert same_weights(load_policy(f"run:{run}@3", env), old)
    with pytest.raises(PolicySpecError, match="no checkpoint of step 5; it has steps 3, 7"):
        load_policy(f"run:{run}@5", env)
    with pytest.raises(PolicySpecError, match="step after '@' must be a number"):
        load_policy(f"run:{run}@last", env)


def test_run_folder_cotrain_nesting_and_refusals(tmp_path):
    env = simpop.make(ENV)
    policy = ActPolicy.for_env(env, 16, seed=4)
    run = make_run(tmp_path, {2: policy.state_dict()}, trainer="cotrain", nested=True)
    assert same_weights(load_policy(f"run:{run}", env), policy)
    (run / "run.json").write_text(json.dumps({"trainer": "ppo", "env": ENV}))
    with pytest.raises(PolicySpecError, match="PPO run"):
        load_policy(f"run:{run}", env)
    with pytest.raises(PolicySpecError, match="not a simpop run folder"):
        load_policy(f"run:{tmp_path / 'nothing'}", env)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    other = make_run(wrong, {1: ActPolicy.for_env(env, 32).state_dict()})  # config says 16 hidden units
    with pytest.raises(PolicySpecError, match="does not fit the policy"):
        load_policy(f"run:{other}", env)


def test_module_attr_objects_and_factories():
    env = simpop.make(ENV)
    policy = load_policy("tests.evaluation.test_eval_policies:FirstAct", env)  # a class: a zero-argument factory
    assert isinstance(policy, FirstAct)
    with pytest.raises(PolicySpecError, match="not a simpop.seat.Player"):
        load_policy("tests.evaluation.test_eval_policies:NOT_A_POLICY", env)
    with pytest.raises(PolicySpecError, match="cannot import"):
        load_policy("no_such_module_here:thing", env)


def test_unknown_specs_and_text_models_on_act_envs():
    env = simpop.make(ENV)
    with pytest.raises(PolicySpecError, match=r"unknown policy spec 'gpt-banana'.*openai:BASE_URL#MODEL"):
        load_policy("gpt-banana", env)
    with pytest.raises(PolicySpecError, match="write openai:BASE_URL#MODEL"):
        load_policy("openai:http://127.0.0.1:1/v1", simpop.make("simpop/Persuasion-v0"))
    with pytest.raises(PolicySpecError, match="text model.*discrete acts"):
        load_policy("openai:http://127.0.0.1:1/v1#m", env)


def test_reference_agents_per_benchmark():
    assert isinstance(load_policy("reference", simpop.make(ENV)), ReferencePersuader)
    assert load_policy("reference", simpop.make("simpop/Persuasion-v0")).text

    class Elsewhere:
        pass

    with pytest.raises(PolicySpecError, match="no reference agent for Elsewhere.*τ²: GoldAgent"):
        load_policy("reference", Elsewhere())


def test_text_reference_persuader_renders_its_acts(tmp_path):
    from simpop.envs.persuasion.acts import classify_persuader
    from simpop.evaluation.eval_records import EPISODES, read_records
    from simpop.evaluation.eval_run import evaluate_panel
    from simpop.simulators.registry import load_panel

    env = simpop.make("simpop/Persuasion-v0", max_turns=4)
    panel = load_panel({"members": {"native": "native"}}, env)
    evaluate_panel("simpop/Persuasion-v0", load_policy("reference", env), panel, episodes=4, seed=0, out=tmp_path,
                   concurrency=2, env_kwargs={"max_turns": 4})
    for record in read_records(tmp_path / EPISODES):
        said = [t["text"] for t in record.transcript if t["seat"] == "persuader"]
        assert classify_persuader(said[0]) == "greeting" and record.invalid_actions == 0


def test_observation_chat_from_text_observations():
    observation = json.dumps({"instructions": "Be helpful.", "error": "empty message", "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "{\"name\": \"find\"}"},
        {"role": "tool", "name": "find", "content": "found 3"}, {"role": "user", "content": "And?"}]})
    assert observation_chat(observation) == [
        {"role": "system", "content": "Be helpful."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "{\"name\": \"find\"}"},
        {"role": "user", "content": "[tool result: find]\nfound 3\nAnd?\n(Your last message was not accepted: "
                                    "empty message Please answer again.)"}]
    assert observation_chat(json.dumps({"messages": []}))[0]["role"] == "user"  # never an empty chat


def test_text_policy_seeds_calls_from_the_rollout_generator():
    from tests.agents.fakes import EchoBackend

    backend = EchoBackend()
    policy = TextPolicy(backend)
    obs = json.dumps({"instructions": "x", "messages": [{"role": "user", "content": "hello"}]})
    policy.reset_batch(["s", "s"], [np.random.default_rng(3)] * 2)
    assert policy.act_batch([obs, obs], [0, 1]) == ["echo: hello"] * 2
    policy.reset_batch(["s"], [np.random.default_rng(3)])
    policy.act_batch([obs], [0])
    assert backend.calls[0][1] == backend.calls[1][1] and backend.calls[0][0] == 2
    assert not hasattr(policy, "entropy")  # untracked: the runner reports no entropy


def test_tau2_gold_and_cooperbench_gold_references(tmp_path):
    from simpop.evaluation.eval_records import EPISODES, read_records
    from simpop.evaluation.eval_run import evaluate_panel
    from simpop.simulators.registry import load_panel

    env = simpop.make("simpop/Tau2-mock-v0")
    policy = load_policy("reference", env)
    assert isinstance(policy, GoldTau2Agent)
    summary = evaluate_panel("simpop/Tau2-mock-v0", policy, load_panel({"members": {"scripted": "native"}}, env),
                             num_trials=2, seed=0, out=tmp_path / "tau2", concurrency=5)
    records = read_records(tmp_path / "tau2" / EPISODES)
    assert len(records) == 2 * len(env.scenario_ids()) and summary["success"] > 0.5 and summary["errors"] == 0
    assert all(r.extra["tau2"]["simulation"]["messages"] and r.extra["tau2"]["domain"] == "mock" for r in records)
    # pass^k as τ² defines it, by hand: per task C(c, k) / C(2, k), averaged over tasks.
    from math import comb

    wins = {}
    for r in records:
        wins[r.scenario] = wins.get(r.scenario, 0) + r.success
    for k in (1, 2):
        expected = sum(comb(c, k) / comb(2, k) for c in wins.values()) / len(wins)
        assert summary["tau2"]["pass_hat_k"][str(k)] == pytest.approx(expected)
    assert summary["tau2"]["pass_hat_k_per_member"]["scripted"] == summary["tau2"]["pass_hat_k"]
    # One results file per member that τ²'s own loader reads, with every trial and the same rewards.
    from tau2.data_model.simulation import Results

    results = Results.load(tmp_path / "tau2" / summary["tau2"]["results_files"]["scripted"])
    assert results.info.num_trials == 2 and len(results.simulations) == len(records)
    assert sorted((s.task_id, s.trial, s.reward_info.reward) for s in results.simulations) == sorted(
        (r.scenario, r.trial, r.reward) for r in records)
    cooper = simpop.make("simpop/CooperBench-mini-v0")
    gold = load_policy("reference", cooper)
    from simpop.envs.cooperbench.simulators import ScriptedTeammate

    assert isinstance(gold, ScriptedTeammate)
    summary = evaluate_panel("simpop/CooperBench-mini-v0", gold, load_panel({"members": {"t": "native"}}, cooper),
                             episodes=2, seed=0, out=tmp_path / "cb", concurrency=2)
    assert summary["errors"] == 0 and summary["invalid_actions"] == 0 and summary["episodes"] == 2


def test_a_real_training_run_evaluates(tmp_path):
    from simpop.cli import main

    run = tmp_path / "run"
    assert main(["train", "grpo", "--env", ENV, "--updates", "2", "--out", str(run), "--threads", "1",
                 "--no-progress", "--env-arg", "max_turns=4"]) == 0
    policy = load_policy(f"run:{run}", simpop.make(ENV), env_id=ENV)
    state = checkpoint.load(checkpoint.latest(run), restore_rng=False)[1]["policy"]
    assert all(torch.equal(policy.state_dict()[k], state[k]) for k in state)
    out = tmp_path / "eval"
    assert main(["eval", "--env", ENV, "--policy", f"run:{run}", "--panel", "p4g-act-v1", "--episodes", "4",
                 "--env-arg", "max_turns=4", "--out", str(out), "--no-progress", "--threads", "1"]) == 0
    assert json.loads((out / "summary.json").read_text())["episodes"] == 12


def test_a_local_text_model_is_deterministic_and_resumes_exactly(tmp_path):
    from simpop.agents.base import SamplingParams
    from simpop.evaluation.eval_records import EPISODES, read_records
    from simpop.evaluation.eval_run import evaluate_panel
    from simpop.simulators.registry import load_panel

    kwargs = {"max_turns": 1}
    env = simpop.make("simpop/Persuasion-v0", **kwargs)
    policy = load_policy("smollm2", env, sampling=SamplingParams(max_new_tokens=4, temperature=1.0))
    panel = load_panel({"members": {"a": "persuadee?temperature=0.8"}}, env)

    def run(out, resume=False):
        return evaluate_panel("simpop/Persuasion-v0", policy, panel, episodes=2, seed=0, out=out, concurrency=2,
                              env_kwargs=kwargs, resume=resume, policy_spec="smollm2")

    whole = run(tmp_path / "a")
    lines = (tmp_path / "a" / EPISODES).read_text().splitlines(keepends=True)
    assert len(lines) == 2 and all(json.loads(line)["transcript"][0]["text"] for line in lines)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / EPISODES).write_text(lines[0])  # a kill after the first record of the chunk
    (tmp_path / "b" / "eval.json").write_bytes((tmp_path / "a" / "eval.json").read_bytes())
    assert run(tmp_path / "b", resume=True) == whole
    assert sorted(r.to_json() for r in read_records(tmp_path / "b" / EPISODES)) == sorted(line.strip() for line in lines)


def test_text_policies_use_cooperbenchs_format_for_the_policy_seat(tmp_path):
    from simpop.evaluation.eval_records import EPISODES, read_records
    from simpop.evaluation.eval_run import evaluate_panel
    from simpop.simulators.registry import load_panel
    from tests.agents.fakes import EchoBackend

    kwargs = {"max_steps": 6}
    env = simpop.make("simpop/CooperBench-mini-v0", **kwargs)
    policy = TextPolicy(EchoBackend(), text_format=policy_format(env))
    evaluate_panel("simpop/CooperBench-mini-v0", policy, load_panel({"members": {"t": "native"}}, env), episodes=1,
                   seed=0, out=tmp_path, concurrency=1, env_kwargs=kwargs)
    (record,) = read_records(tmp_path / EPISODES)
    mine = [json.loads(t["text"]) for t in record.transcript if t["seat"] == "agent1"]
    # The echo is no action, so the format sent it as a message (counted); its chat was agent1's state.
    assert mine and all(a["type"] == "message" and a["text"].startswith("echo: ") for a in mine)
    assert "State: " in mine[0]["text"] and policy.stats["unparsed_actions"] == len(mine) == record.policy_turns
