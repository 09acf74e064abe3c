"""Truncated importance sampling for tokens another engine (vLLM) sampled: known numbers."""

from __future__ import annotations

import math

import pytest
import torch

from simpop.train import objectives


def test_weights_mismatch_and_truncation_with_known_numbers():
    old = torch.tensor([[-1.0, -2.0, -0.5, 7.0]])
    gen = torch.tensor([[-1.5, -1.0, -0.5, float("nan")]])
    weight = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last unit is not the policy's: ignored, even as nan
    out = objectives.truncated_is_weights(old, gen, weight, cap=1.5)
    # ratios exp(0.5) = 1.6487 (truncated to 1.5), exp(-1) = 0.3679, exp(0) = 1
    assert torch.allclose(out.weight, torch.tensor([[1.5, math.exp(-1.0), 1.0, 0.0]]))
    assert out.abs_diff_sum == pytest.approx(1.5) and out.truncated == 1.0
    untruncated = objectives.truncated_is_weights(old, gen, weight, cap=math.inf)
    assert untruncated.truncated == 0.0 and untruncated.weight[0, 0] == pytest.approx(math.exp(0.5))
    for bad in (0.0, float("nan")):
        with pytest.raises(ValueError, match="cap"):
            objectives.truncated_is_weights(old, gen, weight, cap=bad)


def test_the_surrogate_is_weighted_and_its_gradient_scales():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    advantage, weight = torch.tensor([1.0, 1.0]), torch.ones(2)
    is_weight = torch.tensor([0.5, 2.0])
    per_unit = objectives.per_unit_loss(logp, logp.detach(), advantage, weight, is_weight=is_weight)
    assert torch.allclose(per_unit.loss, torch.tensor([-0.5, -2.0]))  # ratio 1: -A * w
    loss, _ = objectives.policy_loss(logp, logp.detach(), advantage, weight, is_weight=is_weight)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([-0.25, -1.0]))  # d(-w * exp(logp - old) * A / 2)
    plain = objectives.per_unit_loss(logp.detach(), logp.detach(), advantage, weight)
    assert torch.allclose(plain.loss, torch.tensor([-1.0, -1.0]))


def test_grpo_config_validates_the_cap():
    from simpop.train.grpo import GRPOConfig

    assert GRPOConfig().tis_cap == 2.0 and GRPOConfig(tis_cap=0).tis_cap == 0
    with pytest.raises(ValueError, match="tis_cap"):
        GRPOConfig(tis_cap=-1)
