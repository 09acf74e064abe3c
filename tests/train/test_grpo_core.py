"""GRPO building blocks on hand-built inputs: advantages, zero-variance groups, masked loss, ActPolicy.

(The bit-for-bit equality of :mod:`simpop.train.objectives` with the trainer's original formulas is in
``test_objectives.py``; these are the by-hand cases.)
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from simpop.agents.policy import ActPolicy
from simpop.train.objectives import LossTotals, advantages, policy_loss, zero_variance_fraction


def test_group_advantages_by_hand():
    rewards = [1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 2.0, 2.0, 0.0]
    groups = [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    adv = advantages(rewards, groups)
    # group 0: mean 0.5, std 0.5 -> +-1; group 1: all equal -> 0; group 2: mean 4/3, std sqrt(8/9)
    assert adv[:4] == pytest.approx([1, -1, 1, -1], abs=1e-5)
    assert list(adv[4:7]) == [0.0, 0.0, 0.0]
    s = math.sqrt(8 / 9)
    assert adv[7:] == pytest.approx([(2 - 4 / 3) / s, (2 - 4 / 3) / s, -4 / 3 / s], abs=1e-5)
    assert advantages(rewards, groups, scale="none")[:4] == pytest.approx([0.5, -0.5, 0.5, -0.5])
    # groups need not be contiguous or integers
    assert advantages([1.0, 5.0, 0.0, 5.0], ["a", "b", "a", "b"]) == pytest.approx([1, 0, -1, 0], abs=1e-5)
    with pytest.raises(ValueError, match="equal-length"):
        advantages([1.0, 2.0], [0])


def test_zero_variance_fraction_by_hand():
    assert zero_variance_fraction([1, 1, 0, 1, 0.3, 0.3], [0, 0, 1, 1, 2, 2]) == pytest.approx(2 / 3)
    assert zero_variance_fraction([0, 0, 0, 0], [0, 0, 1, 1]) == 1.0
    assert zero_variance_fraction([0, 1], [0, 0]) == 0.0
    assert math.isnan(zero_variance_fraction([], []))


def _loss_and_grad(logp_values, old, adv, weight, kl=None, kl_coef=0.0):
    logp = torch.tensor(logp_values, requires_grad=True)
    kl_t = None if kl is None else (torch.tensor(kl) + 0 * logp)
    weight_t = torch.tensor(weight)
    loss, parts = policy_loss(logp, torch.tensor(old), torch.tensor(adv), weight_t, eps_low=0.2, eps_high=0.2,
                              kl=kl_t, kl_coef=kl_coef, totals=LossTotals.of([weight_t]))
    loss.backward()
    return loss.item(), logp.grad.clone(), parts


def test_masked_units_change_neither_loss_nor_gradient():
    weight = [1.0, 0.0, 1.0, 0.0]
    base = _loss_and_grad([-1.0, -2.0, -0.5, -3.0], [-1.1, -2.0, -0.4, -3.0], [1.0, 1.0, 1.0, 1.0], weight,
                          kl=[0.1, 0.2, 0.3, 0.4], kl_coef=0.5)
    garbage = _loss_and_grad([-1.0, float("nan"), -0.5, 50.0], [-1.1, float("inf"), -0.4, -90.0],
                             [1.0, -7.0, 1.0, float("nan")], weight, kl=[0.1, float("inf"), 0.3, -5.0], kl_coef=0.5)
    assert base[0] == garbage[0] and torch.equal(base[1], garbage[1])
    assert base[1][1] == 0 and base[1][3] == 0 and base[1][0] != 0
    assert base[2]["kl"] == pytest.approx((0.1 + 0.3) / 2)
    # The same change in a policy position does change the loss: the test can fail.
    other = _loss_and_grad([-1.0, -2.0, -0.9, -3.0], [-1.1, -2.0, -0.4, -3.0], [1.0] * 4, weight,
                           kl=[0.1, 0.2, 0.3, 0.4], kl_coef=0.5)
    assert other[0] != base[0]


def test_clipping():
    # ratio e^0.5 > 1.2 with positive advantage: clipped, no gradient
    loss, grad, parts = _loss_and_grad([0.0], [-0.5], [1.0], [1.0])
    assert loss == pytest.approx(-1.2) and grad[0] == 0 and parts["clip_frac"] == 1.0
    loss, grad, parts = _loss_and_grad([0.0], [-0.1], [1.0], [1.0])
    assert loss == pytest.approx(-math.exp(0.1)) and grad[0] != 0 and parts["clip_frac"] == 0.0


def test_act_policy_sampling_and_log_probs():
    policy = ActPolicy(5, 3, hidden_size=8, seed=0)
    obs = [np.full(5, i, dtype=np.float32) for i in range(64)]
    runs = []
    for _ in range(2):
        policy.reset_batch([None] * 64, [np.random.default_rng(1)] * 64)  # the policy seat: one wave generator
        runs.append(policy.act_batch(obs, list(range(64))))
    a = runs[0]
    assert a == runs[1] and set(a) <= {0, 1, 2} and len(set(a)) == 3
    logp, entropy = policy.log_probs_and_entropy(obs[:4], a[:4])
    assert logp.requires_grad and torch.all(logp <= 0)
    assert entropy.tolist() == pytest.approx([math.log(3)] * 4, abs=0.05)  # near uniform at init
    assert torch.equal(ActPolicy(5, 3, 8, seed=0).net[0].weight, policy.net[0].weight)
    assert not torch.equal(ActPolicy(5, 3, 8, seed=1).net[0].weight, policy.net[0].weight)
