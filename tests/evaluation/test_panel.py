"""Evaluating a policy on a panel: success per member and overall, policy entropy."""

from __future__ import annotations

import math

import pytest

import numpy as np

from simpop.agents.policy import ActPolicy
from simpop.envs import make
from simpop.envs.persuasion.simulators import ActPersuadee
from simpop.evaluation.panel import EnvPool, evaluate, policy_entropy
from simpop.rollout import RolloutEngine
from simpop.seat import Player
from simpop.simulators.population import Panel

ENV = "simpop/PersuasionAct-v0"


def test_panel_evaluation_per_member_and_entropy():
    panel = Panel([ActPersuadee(temperature=0.7, name="cold"), ActPersuadee(temperature=1.5, name="hot")])
    policy = ActPolicy.for_env(make(ENV), seed=0)
    result = evaluate(ENV, policy, panel, episodes=12, seed=5)
    assert set(result.per_member) == {"cold", "hot"} and result.episodes == 24
    assert result.success == pytest.approx(sum(result.per_member.values()) / 2)
    assert 0 < result.entropy <= math.log(14) + 1e-6  # the untrained policy is near uniform
    assert evaluate(ENV, policy, panel, episodes=12, seed=5) == result  # same seed, same dialogues
    single = evaluate(ENV, policy, panel["cold"], episodes=12, seed=5)
    assert single.per_member == {"cold": result.per_member["cold"]}


@pytest.mark.parametrize("stepping", ["arrays", "env by env"])
def test_a_kept_pool_and_outcomes_only_give_what_fresh_envs_give(stepping, monkeypatch):
    """Envs reused from an earlier evaluation (left at the end of other dialogues) give the same dialogues as
    fresh envs, and ``records=False`` the same outcomes without records."""
    if stepping == "env by env":
        monkeypatch.setattr(RolloutEngine, "_vector_wave", lambda self, envs: None)
    panel = Panel([ActPersuadee(temperature=0.7, name="cold"), ActPersuadee(temperature=1.5, name="hot")])
    policy = ActPolicy.for_env(make(ENV), seed=0)
    kwargs = {"max_turns": 6}
    pool = EnvPool(lambda: make(ENV, **kwargs))
    evaluate(ENV, policy, ActPersuadee(decoding="greedy", name="other"), 20, seed=1, env_kwargs=kwargs, pool=pool)
    kept = evaluate(ENV, policy, panel, 12, seed=5, env_kwargs=kwargs, pool=pool)
    fresh = evaluate(ENV, policy, panel, 12, seed=5, env_kwargs=kwargs)
    assert kept == fresh and len(pool.envs) == 20
    assert [r.to_json() for r in kept.records] == [r.to_json() for r in fresh.records]
    assert fresh.outcomes == [r.success for r in fresh.records] and 0 < sum(fresh.outcomes) < 24
    bare = evaluate(ENV, policy, panel, 12, seed=5, env_kwargs=kwargs, pool=pool, records=False)
    assert bare == fresh and bare.records == []


def test_episodes_must_be_positive():
    with pytest.raises(ValueError, match="episodes"):
        evaluate(ENV, ActPolicy.for_env(make(ENV)), ActPersuadee(), episodes=0)


def test_policy_entropy_is_the_policys_own_measure_or_nan():
    policy = ActPolicy.for_env(make(ENV), seed=0)
    trajectories = RolloutEngine(ENV, policy, ActPersuadee()).collect(6, seed=2)
    assert policy_entropy(policy, trajectories) == policy.entropy(trajectories)
    # By hand: the mean entropy of the action distribution at the policy's own decisions.
    obs = [o for t in trajectories for o in t.observations[t.policy_seat]]
    log_p = policy.log_probs(obs).detach().numpy()
    assert policy_entropy(policy, trajectories) == pytest.approx(float(-(np.exp(log_p) * log_p).sum(1).mean()))
    assert math.isnan(policy_entropy(policy, []))


class Scripted(Player):
    """A policy with no entropy method (a scripted agent): always the first act."""

    def act_batch(self, observations, slots):
        return [0] * len(observations)


def test_policies_without_entropy_report_nan():
    result = evaluate(ENV, Scripted(), ActPersuadee(), episodes=4, seed=1)
    assert result.episodes == 4 and 0 <= result.success <= 1 and math.isnan(result.entropy)
    assert math.isnan(policy_entropy(Scripted(), []))
