"""Algorithm hooks of simpop.train.objectives on hand-built inputs (no models)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from simpop.train.objectives import (
    ALGORITHMS,
    EPS,
    Algorithm,
    LossTotals,
    advantages,
    aggregate,
    algorithm,
    keep_informative,
    per_unit_loss,
    pick_informative,
    policy_loss,
    zero_variance_fraction,
    zero_variance_groups,
)

REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]


# ============================================================ reference: the trainer's original formulas (grpo.py)
def old_group_advantages(rewards: Sequence[float], groups: Sequence[int], scale: bool = True) -> np.ndarray:
    r = np.asarray(rewards, dtype=float)
    g = np.asarray(groups)
    if r.shape != g.shape or r.ndim != 1:
        raise ValueError(f"rewards {r.shape} and groups {g.shape} must be equal-length 1-D sequences")
    out = np.zeros_like(r)
    for label in np.unique(g):
        members = g == label
        centred = r[members] - r[members].mean()
        std = r[members].std()
        if std == 0:
            continue
        out[members] = centred / (std + EPS) if scale else centred
    return out


def old_zero_variance_fraction(rewards: Sequence[float], groups: Sequence[int]) -> float:
    r, g = np.asarray(rewards, dtype=float), np.asarray(groups)
    labels = np.unique(g)
    if labels.size == 0:
        return math.nan
    return float(np.mean([np.ptp(r[g == label]) == 0 for label in labels]))


def old_surrogate_loss(logp, old_logp, advantage, weight, clip_eps, kl=None, kl_coef=0.0, normaliser=None):
    normaliser = max(float(weight.sum()) if normaliser is None else normaliser, 1.0)
    on = weight > 0
    zero = torch.zeros((), dtype=logp.dtype)
    logp, old_logp = torch.where(on, logp, zero), torch.where(on, old_logp, zero)
    advantage = torch.where(on, advantage, zero)
    ratio = torch.exp(logp - old_logp)
    per_unit = -torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantage)
    kl_sum = 0.0
    if kl is not None:
        kl = torch.where(on, kl, zero)
        per_unit = per_unit + kl_coef * kl
        kl_sum = float((kl.detach() * weight).sum())
    loss = (per_unit * weight).sum() / normaliser
    clipped = (((ratio.detach() - 1).abs() > clip_eps) & on).float()
    return loss, {"kl": kl_sum / normaliser, "clip_frac": float((clipped * weight).sum()) / normaliser}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values *and* bit patterns (so 0.0 and -0.0 differ)."""
    int_type = {torch.float32: torch.int32, torch.float64: torch.int64}[a.dtype]
    return a.dtype == b.dtype and torch.equal(a.view(int_type), b.view(int_type))


# ====================================================================================== advantages
def test_each_variant_advantages_by_hand():
    # group 0: mean 0.5, population std 0.5; group 1: all equal -> exactly 0 under a group baseline
    grpo = 0.5 / (0.5 + 1e-6)
    expected = {
        "grpo": [grpo, -grpo, -grpo, grpo, 0, 0, 0, 0],
        "dapo": [grpo, -grpo, -grpo, grpo, 0, 0, 0, 0],
        "dr_grpo": [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0],
        # centred [.5, -.5, -.5, .5, 0, 0, 0, 0]: batch mean 0, batch std sqrt(4 * .25 / 8) = sqrt(1/8)
        "reinforce_pp": [a / (math.sqrt(1 / 8) + 1e-6) for a in (0.5, -0.5, -0.5, 0.5)] + [0, 0, 0, 0],
    }
    assert set(expected) == set(ALGORITHMS)
    for name, want in expected.items():
        got = algorithm(name).advantages(REWARDS, GROUPS)
        assert got == pytest.approx(want, rel=1e-12, abs=0), name
        assert list(got[4:]) == [0.0] * 4, name  # exactly 0, not just close
    assert 0.5 / (math.sqrt(1 / 8) + 1e-6) == pytest.approx(math.sqrt(2), rel=1e-5)  # the numbers above make sense


def test_batch_baseline_by_hand():
    # batch mean 0.75 -> centred [.25, -.75, -.75, .25, .25, .25, .25, .25]; std sqrt((6/16 + 2*9/16) / 8)
    std = math.sqrt((6 * 0.0625 + 2 * 0.5625) / 8)
    got = advantages(REWARDS, GROUPS, baseline="batch", scale="batch")
    assert got == pytest.approx([c / (std + 1e-6) for c in (0.25, -0.75, -0.75, 0.25, 0.25, 0.25, 0.25, 0.25)])
    assert got[0] == pytest.approx(1 / math.sqrt(3), rel=1e-5) and got[1] == pytest.approx(-math.sqrt(3), rel=1e-5)
    assert advantages(REWARDS, GROUPS, baseline="batch", scale="none") == pytest.approx(
        [0.25, -0.75, -0.75, 0.25, 0.25, 0.25, 0.25, 0.25])
    assert list(advantages([2.0, 2.0, 2.0], [0, 1, 1], baseline="batch", scale="batch")) == [0.0, 0.0, 0.0]
    assert list(advantages([3.0, 3.0], [0, 0], scale="batch")) == [0.0, 0.0]


def test_labels_need_not_be_contiguous_or_integers():
    got = advantages([1.0, 5.0, 0.0, 5.0], ["a", "b", "a", "b"], scale="none")
    assert list(got) == [0.5, 0.0, -0.5, 0.0]
    assert advantages([], []).shape == (0,)


def test_grpo_advantages_match_the_old_formula_bit_for_bit():
    rng = np.random.default_rng(0)
    for trial in range(50):
        n_groups, size = int(rng.integers(1, 9)), int(rng.integers(2, 9))
        if trial % 2:  # binary rewards: many zero-variance groups
            rewards = rng.integers(0, 2, n_groups * size).astype(float)
        else:
            rewards = np.round(rng.normal(size=n_groups * size), int(rng.integers(1, 4)))
        groups = rng.permutation(np.repeat(rng.choice(1000, n_groups, replace=False), size))
        for ours, scale in ((algorithm("grpo").advantages(rewards, groups), True),
                            (algorithm("dr_grpo").advantages(rewards, groups), False)):
            old = old_group_advantages(rewards, groups, scale=scale)
            assert ours.dtype == old.dtype and np.array_equal(ours.view(np.int64), old.view(np.int64))
        assert zero_variance_fraction(rewards, groups) == old_zero_variance_fraction(rewards, groups)


# ==================================================================================== group filter
def test_group_filter():
    assert zero_variance_groups(REWARDS, GROUPS) == {1}
    assert zero_variance_groups([1, 2, 3, 3], ["x", "x", "y", "y"]) == {"y"}
    assert zero_variance_fraction(REWARDS, GROUPS) == 0.5
    assert zero_variance_fraction([1, 1, 0, 1, 0.3, 0.3], [0, 0, 1, 1, 2, 2]) == pytest.approx(2 / 3)
    assert math.isnan(zero_variance_fraction([], []))
    assert zero_variance_groups([], []) == set()
    assert keep_informative(REWARDS, GROUPS).tolist() == [True] * 4 + [False] * 4
    assert keep_informative([0, 5, 1, 5], [7, 3, 7, 3]).tolist() == [True, False, True, False]


def test_pick_informative():
    pool = [[1, 1], [0, 1], [0, 0, 0], [1, 0], [0.5, 0.2], [2, 2]]
    pick = pick_informative(pool, 2)
    assert (pick.chosen, pick.uninformative, pick.surplus, pick.complete) == ((1, 3), 3, 1, True)
    short = pick_informative(pool, 5)
    assert (short.chosen, short.uninformative, short.surplus, short.complete) == ((1, 3, 4), 3, 0, False)
    none = pick_informative([[1.0], [2, 2]], 1)  # a one-dialogue group has no variance either
    assert (none.chosen, none.uninformative, none.complete) == ((), 2, False)
    with pytest.raises(ValueError, match="n .* must be >= 1"):
        pick_informative(pool, 0)
    with pytest.raises(ValueError, match="group 1: rewards must be a non-empty"):
        pick_informative([[0, 1], []], 1)
    with pytest.raises(ValueError, match="group 0: rewards must be finite"):
        pick_informative([[0, float("nan")]], 1)


# ==================================================================================== policy loss
def _loss(ratios, adv, eps_low, eps_high, weight=None):
    logp = torch.tensor([math.log(r) for r in ratios], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(len(ratios), dtype=torch.float64)
    weight = torch.ones(len(ratios), dtype=torch.float64) if weight is None else torch.tensor(weight)
    loss, parts = policy_loss(logp, old, torch.tensor(adv, dtype=torch.float64), weight, eps_low=eps_low,
                              eps_high=eps_high)
    loss.backward()
    return loss.item(), logp.grad.tolist(), parts


def test_clip_higher_by_hand():
    ratios, adv = [1.25, 0.7, 1.1, 1.5], [1.0, 1.0, -1.0, -1.0]
    # -min(rho A, clip(rho) A): unit 0 (rho 1.25, A > 0) is clipped to 1.2 by [0.8, 1.2] but not by [0.8, 1.28];
    # unit 1 stays at 0.7 (min picks the unclipped side), unit 2 is inside, unit 3 (A < 0) keeps -1.5.
    symmetric = _loss(ratios, adv, 0.2, 0.2)
    assert symmetric[0] == pytest.approx((-1.2 - 0.7 + 1.1 + 1.5) / 4, abs=1e-12)
    assert symmetric[1] == pytest.approx([0.0, -0.7 / 4, 1.1 / 4, 1.5 / 4], abs=1e-12)
    assert symmetric[2]["clip_frac"] == 3 / 4  # 1.25, 0.7 and 1.5 lie outside [0.8, 1.2]
    higher = _loss(ratios, adv, 0.2, 0.28)
    assert higher[0] == pytest.approx((-1.25 - 0.7 + 1.1 + 1.5) / 4, abs=1e-12)
    assert higher[1] == pytest.approx([-1.25 / 4, -0.7 / 4, 1.1 / 4, 1.5 / 4], abs=1e-12)
    assert higher[2]["clip_frac"] == 2 / 4  # 0.7 and 1.5 lie outside [0.8, 1.28]
    assert higher[2]["kl"] == 0.0
    # the lower bound is separate: with eps_low 0.35, unit 1 (A > 0, rho 0.7) ...
    low = _loss(ratios, adv, 0.35, 0.28)
    assert low[2]["clip_frac"] == 1 / 4  # ... is inside [0.65, 1.28]; only 1.5 is outside
    # the dapo entry is this objective
    logp = torch.tensor([math.log(r) for r in ratios], dtype=torch.float64)
    dapo, _ = algorithm("dapo").loss(logp, torch.zeros(4, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64),
                                     torch.ones(4, dtype=torch.float64))
    assert dapo.item() == higher[0]


def test_kl_term_by_hand():
    logp = torch.tensor([-1.0, -2.0, -3.0], dtype=torch.float64, requires_grad=True)
    kl = torch.tensor([0.1, 0.2, 0.4], dtype=torch.float64) + 0 * logp
    weight = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    loss, parts = policy_loss(logp, logp.detach(), torch.tensor([1.0, -1.0, 5.0], dtype=torch.float64), weight,
                              kl=kl, kl_coef=0.5)
    # ratio 1 everywhere: surrogate (-1 + 1) / 2 = 0; KL term 0.5 * (0.1 + 0.2) / 2
    assert loss.item() == pytest.approx(0.075, abs=1e-12)
    assert parts["kl"] == pytest.approx(0.15, abs=1e-12) and parts["clip_frac"] == 0.0


# ===================================================================================== aggregation
VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
WEIGHT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)


def test_aggregation_modes_by_hand():
    # policy units: row 0 -> 1, 2; row 1 -> 4; row 2 has none (not counted as a sequence)
    totals = LossTotals.of([WEIGHT], max_len=10)
    assert (totals.units, totals.sequences, totals.max_len) == (3.0, 2, 10.0)
    assert aggregate(VALUES, WEIGHT, "token-mean", totals).item() == pytest.approx(7 / 3)
    assert aggregate(VALUES, WEIGHT, "sequence-mean", totals).item() == pytest.approx((1.5 + 4) / 2)
    assert aggregate(VALUES, WEIGHT, "token-sum", totals).item() == pytest.approx(7 / (2 * 10))
    assert aggregate(VALUES, WEIGHT, "token-sum").item() == pytest.approx(7 / (2 * 3))  # default max_len: width
    assert aggregate(VALUES, WEIGHT).item() == pytest.approx(7 / 3)  # default: token-mean over this batch
    # act level: [N] units are N sequences of one unit
    values, weight = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 0.0, 1.0, 1.0])
    acts = LossTotals.of([weight])
    assert (acts.units, acts.sequences, acts.max_len) == (3.0, 3, 1.0)
    for mode in ("token-mean", "sequence-mean", "token-sum"):
        assert aggregate(values, weight, mode).item() == pytest.approx(8 / 3), mode
    assert aggregate(values, weight, "token-sum", LossTotals.of([weight], max_len=2)).item() == pytest.approx(8 / 6)


def _random_batch(seed: int, rows: int = 7, width: int = 6, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.rand(rows, width, generator=g) < 0.6).to(dtype)
    weight[0] = 0  # a dialogue without policy tokens
    logp = -torch.rand(rows, width, generator=g, dtype=dtype) * 3
    old = logp + torch.randn(rows, width, generator=g, dtype=dtype) * 0.3
    adv = torch.randn(rows, 1, generator=g, dtype=dtype).expand(-1, width)
    kl = torch.rand(rows, width, generator=g, dtype=dtype)
    return logp, old, adv, weight, kl


@pytest.mark.parametrize("mode", ["token-mean", "sequence-mean", "token-sum"])
def test_micro_batches_add_up_to_the_full_batch(mode):
    logp, old, adv, weight, kl = _random_batch(1, dtype=torch.float64)
    splits = [(0, 2), (2, 5), (5, 7)]  # uneven, each micro-batch trimmed to its own width as the trainer pads
    widths = [max(int(weight[a:b].nonzero()[:, 1].max()) + 1 if weight[a:b].any() else 1, 1) for a, b in splits]
    micro_weights = [weight[a:b, :w] for (a, b), w in zip(splits, widths)]
    totals = LossTotals.of(micro_weights, max_len=40)
    full_totals = LossTotals.of([weight], max_len=40)
    assert (totals.units, totals.sequences) == (full_totals.units, full_totals.sequences)

    def run(a, b, w, tot):
        x = logp[a:b, :w].clone().requires_grad_(True)
        loss, parts = policy_loss(x, old[a:b, :w], adv[a:b, :w], weight[a:b, :w], eps_low=0.2, eps_high=0.28,
                                  kl=kl[a:b, :w] * (1 + 0 * x), kl_coef=0.3, aggregation=mode, totals=tot)
        loss.backward()
        return loss.item(), x.grad, parts

    full_loss, full_grad, full_parts = run(0, 7, weight.shape[1], full_totals)
    pieces = [run(a, b, w, totals) for (a, b), w in zip(splits, widths)]
    assert sum(p[0] for p in pieces) == pytest.approx(full_loss, rel=1e-12)
    assert full_loss != 0
    for ((a, b), w), piece in zip(zip(splits, widths), pieces):
        assert torch.allclose(piece[1], full_grad[a:b, :w], rtol=1e-12, atol=1e-15)
    for key in ("kl", "clip_frac"):
        assert sum(p[2][key] for p in pieces) == pytest.approx(full_parts[key], rel=1e-12)


@pytest.mark.parametrize("mode", ["token-mean", "sequence-mean", "token-sum"])
@pytest.mark.parametrize("two_d", [True, False])
def test_masked_units_with_nan_and_inf_give_finite_loss_and_no_gradient(mode, two_d):
    logp, old, adv, weight, kl = _random_batch(2)
    if not two_d:
        logp, old, adv, weight, kl = (t.reshape(-1) for t in (logp, old, adv.contiguous(), weight, kl))
    off = weight == 0
    bad = torch.tensor([float("nan"), float("inf"), -float("inf")]).repeat(off.numel())[:int(off.sum())]

    def run(poison: bool):
        x = logp.clone()
        o, a, k = old.clone(), adv.clone(), kl.clone()
        if poison:
            for t in (x, o, a, k):
                t[off] = bad
        x.requires_grad_(True)
        k.requires_grad_(True)  # the gradient reaching the KL input is checked too
        loss, parts = policy_loss(x, o, a, weight, eps_low=0.2, eps_high=0.28, kl=k, kl_coef=0.1, aggregation=mode)
        loss.backward()
        return loss, x.grad, k.grad, parts

    clean, poisoned = run(False), run(True)
    assert torch.isfinite(poisoned[0]) and torch.isfinite(poisoned[1]).all() and torch.isfinite(poisoned[2]).all()
    assert same_bits(clean[0], poisoned[0]) and clean[3] == poisoned[3]
    assert torch.equal(clean[1], poisoned[1]) and torch.equal(clean[2], poisoned[2])
    for grad in poisoned[1:3]:
        assert (grad[off] == 0).all() and (grad[~off] != 0).any()


def test_grpo_loss_matches_the_old_formula_bit_for_bit():
    grpo = algorithm("grpo")
    for seed in range(20):
        logp, old, adv, weight, kl = _random_batch(seed, rows=8, width=int(5 + seed % 4))
        if seed % 3 == 0:
            adv = torch.zeros_like(adv)  # an all-zero-variance batch: the loss is exactly 0 (same sign bit)
        if seed % 2:
            logp, old, adv, weight, kl = (t.reshape(-1) for t in (logp, old, adv.contiguous(), weight, kl))
            micro = [slice(0, None)]
        else:
            micro = [slice(0, 3), slice(3, 8)]
        with_kl = seed % 4 < 2
        logp = logp.masked_fill(weight == 0, float("nan"))
        normaliser = sum(float(weight[m].sum()) for m in micro)
        totals = LossTotals.of([weight[m] for m in micro])
        for m in micro:
            results = []
            for fn in ("old", "new"):
                x = logp[m].clone().requires_grad_(True)
                k = kl[m] * (1 + 0 * x) if with_kl else None
                if fn == "old":
                    loss, parts = old_surrogate_loss(x, old[m], adv[m], weight[m], 0.2, kl=k, kl_coef=0.05,
                                                     normaliser=normaliser)
                else:
                    loss, parts = grpo.loss(x, old[m], adv[m], weight[m], kl=k, kl_coef=0.05, totals=totals)
                loss.backward()
                results.append((loss.detach(), x.grad, parts))
            (old_loss, old_grad, old_parts), (new_loss, new_grad, new_parts) = results
            assert same_bits(old_loss, new_loss), seed
            assert same_bits(old_grad, new_grad), seed
            assert old_parts == new_parts, seed
    # a ratio exactly on the bound and one just past it
    logp = torch.tensor([math.log(1.2), math.log(0.8), math.log(1.2) + 1e-6, 0.0], requires_grad=True)
    zeros, ones = torch.zeros(4), torch.ones(4)
    adv = torch.tensor([1.0, -1.0, 1.0, 2.0])
    assert old_surrogate_loss(logp, zeros, adv, ones, 0.2)[1] == grpo.loss(logp, zeros, adv, ones)[1]


# ====================================================================================== registry + errors
def test_registry():
    assert list(ALGORITHMS) == ["grpo", "dr_grpo", "dapo", "reinforce_pp"]
    assert algorithm("grpo") == Algorithm("grpo", baseline="group", scale="group", eps_low=0.2, eps_high=0.2,
                                          aggregation="token-mean", dynamic_sampling=False)
    dr = algorithm("dr_grpo")
    assert (dr.scale, dr.aggregation, dr.dynamic_sampling) == ("none", "token-sum", False)
    dapo = algorithm("dapo")
    assert (dapo.eps_low, dapo.eps_high, dapo.aggregation, dapo.dynamic_sampling) == (0.2, 0.28, "token-mean", True)
    rpp = algorithm("reinforce_pp")
    assert (rpp.baseline, rpp.scale, rpp.aggregation) == ("group", "batch", "token-mean")
    assert all(name == a.name for name, a in ALGORITHMS.items())
    with pytest.raises(dataclasses.FrozenInstanceError):
        dapo.eps_high = 0.3  # type: ignore[misc]
    assert dataclasses.replace(dapo, eps_high=0.3).eps_high == 0.3


def test_bad_inputs_fail_clearly():
    with pytest.raises(ValueError, match=r"unknown algorithm 'ppo'; choose one of: grpo, dr_grpo, dapo, reinforce_pp"):
        algorithm("ppo")
    with pytest.raises(ValueError, match="equal-length 1-D"):
        advantages([1.0, 2.0], [0])
    with pytest.raises(ValueError, match="rewards must be finite"):
        advantages([1.0, float("nan")], [0, 0])
    with pytest.raises(ValueError, match="baseline must be one of"):
        advantages([1.0], [0], baseline="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scale must be one of"):
        advantages([1.0], [0], scale="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scale='group' needs baseline='group'"):
        advantages([1.0], [0], baseline="batch", scale="group")
    with pytest.raises(ValueError, match=r"Algorithm 'x': eps_low must be in \(0, 1\)"):
        Algorithm("x", eps_low=1.0)
    with pytest.raises(ValueError, match="Algorithm 'x': eps_high must be a positive number"):
        Algorithm("x", eps_high=0.0)
    with pytest.raises(ValueError, match="Algorithm 'x': aggregation must be one of"):
        Algorithm("x", aggregation="mean")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Algorithm 'x': scale='group' needs baseline='group'"):
        Algorithm("x", baseline="batch")
    t = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="eps_low must be in"):
        policy_loss(t, t, t, t, eps_low=-0.1)
    with pytest.raises(ValueError, match="eps_high must be a positive number"):
        per_unit_loss(t, t, t, t, eps_high=float("inf"))
    with pytest.raises(ValueError, match=r"advantage has shape \(2,\) but weight has \(2, 3\)"):
        policy_loss(t, t, torch.zeros(2), t)
    with pytest.raises(ValueError, match=r"kl has shape \(3,\)"):
        policy_loss(t, t, t, t, kl=torch.zeros(3))
    with pytest.raises(ValueError, match=r"weight must be \[N\] .* or \[B, T\]"):
        policy_loss(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.zeros(1, 2, 3), torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="aggregation must be one of"):
        aggregate(t, t, "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="values has shape"):
        aggregate(torch.zeros(3), t)
    with pytest.raises(ValueError, match="max_len must be a positive number"):
        LossTotals.of([t], max_len=0)
