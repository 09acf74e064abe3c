"""Evaluating a policy on a panel: success per member and overall, policy entropy."""

from __future__ import annotations

import math

import pytest

from simpop.envs import make
from simpop.envs.persuasion.simulators import ActPersuadee
from simpop.evaluation.panel import evaluate
from simpop.simulators.population import Panel
from simpop.train.grpo import ActPolicy

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


def test_episodes_must_be_positive():
    with pytest.raises(ValueError, match="episodes"):
        evaluate(ENV, ActPolicy.for_env(make(ENV)), ActPersuadee(), episodes=0)
