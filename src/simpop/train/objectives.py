"""Policy-gradient objectives for multi-turn GRPO, split into pluggable algorithm hooks.

An update of :class:`~simpop.train.grpo.GRPOTrainer` has four hooks, each a small pure function here:

1. **Advantages** (:func:`advantages`): one number per dialogue from the dialogues' returns ``r``.
2. **Group filter** (:func:`keep_informative`, :func:`pick_informative`): drop groups whose rewards are all
   equal (they carry no signal) and refill the batch (dynamic sampling).
3. **Per-unit loss** (:func:`per_unit_loss`): the clipped surrogate with an asymmetric range
   ``clip(rho, 1 - eps_low, 1 + eps_high)``, ``rho = pi(u) / pi_old(u)``, plus ``kl_coef * KL``.
4. **Aggregation** (:func:`aggregate`): how per-unit losses become one scalar (``token-mean``,
   ``sequence-mean`` or ``token-sum``), with batch-level normalisers (:class:`LossTotals`) so that the
   losses of micro-batches add up to the loss of the whole batch.

A *unit* is a policy token (text level, ``[B, T]`` tensors, one row per dialogue, weight = rollout mask)
or a policy decision (act level, ``[N]`` tensors; each decision counts as its own one-unit sequence).

Variants (:data:`ALGORITHMS`; add one by adding one entry there):

- ``grpo`` (Shao et al. 2024, DeepSeekMath): ``A = (r - mean_g) / (std_g + eps)`` within the scenario's
  group (population std), 0 in groups with equal rewards; symmetric clip 0.2; ``token-mean`` (the sum over
  all policy units of the batch divided by their number). Reproduces the trainer's original numerics.
- ``dr_grpo`` (Liu et al. 2025, "Understanding R1-Zero-like training: a critical perspective"):
  ``A = r - mean_g`` (no std division: it up-weights near-solved or near-failed groups) and ``token-sum``:
  ``L = sum_{i,t} l_{i,t} / (n_sequences * max_len)`` with a constant ``max_len`` (no per-length bias).
- ``dapo`` (Yu et al. 2025, "DAPO: an open-source LLM reinforcement learning system at scale"): GRPO
  advantages with "clip-higher" ``clip(rho, 1 - 0.2, 1 + 0.28)`` (low-probability tokens can rise, which
  keeps entropy up), ``token-mean``, and dynamic sampling: groups with equal rewards are dropped and more
  groups are collected until the batch is full of informative ones.
- ``reinforce_pp`` (Hu 2025, "REINFORCE++", the "-baseline" form for several samples per prompt):
  ``A' = r - mean_g`` then global normalisation ``A = A' / (std_batch(A') + eps)``, the population std of
  ``A'`` over every dialogue of the batch (zero-variance groups included, and kept at exactly 0).
  ``A'`` already has batch mean 0, so it is not re-centred. ``token-mean``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch

EPS = 1e-6

Baseline = Literal["group", "batch"]
Scale = Literal["group", "batch", "none"]
Aggregation = Literal["token-mean", "sequence-mean", "token-sum"]
BASELINES: tuple[str, ...] = ("group", "batch")
SCALES: tuple[str, ...] = ("group", "batch", "none")
AGGREGATIONS: tuple[str, ...] = ("token-mean", "sequence-mean", "token-sum")


# ====================================================================================== advantages
def _rewards_and_groups(rewards: Sequence[float] | np.ndarray,
                        groups: Sequence[Hashable] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r, g = np.asarray(rewards, dtype=float), np.asarray(groups)
    if r.shape != g.shape or r.ndim != 1:
        raise ValueError(f"rewards {r.shape} and groups {g.shape} must be equal-length 1-D sequences")
    if not np.isfinite(r).all():
        raise ValueError(f"rewards must be finite, got {r[~np.isfinite(r)][:3].tolist()}")
    return r, g


def advantages(rewards: Sequence[float], groups: Sequence[Hashable], *, baseline: Baseline = "group",
               scale: Scale = "group", eps: float = EPS) -> np.ndarray:
    """One advantage per dialogue: a baseline is subtracted from its return, then it is optionally scaled.

    Args:
        rewards: One return per dialogue.
        groups: The group (scenario) of each dialogue; any hashable labels, in any order.
        baseline: ``"group"`` subtracts the mean return of the dialogue's group; ``"batch"`` the mean return
            of the whole batch.
        scale: ``"group"`` divides by ``std_g + eps``, the population std of the group's returns (GRPO);
            ``"batch"`` divides by ``std_b + eps``, the population std of the centred returns over the whole
            batch (REINFORCE++ global normalisation); ``"none"`` keeps the centred return (Dr. GRPO).
        eps: Added to the std before dividing.

    Returns:
        float64 advantages. With the group baseline, groups whose returns are all equal get exactly 0 (no
        rounding noise); with the batch baseline, a batch whose returns are all equal gets 0.

    Raises:
        ValueError: Mismatched or non-1-D inputs, non-finite rewards, an unknown ``baseline``/``scale``, or
            ``baseline="batch"`` with ``scale="group"`` (equal-reward groups would be divided by ``eps``).
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if baseline == "batch" and scale == "group":
        raise ValueError("scale='group' needs baseline='group' (with the batch mean as baseline, equal-reward "
                         "groups have std 0 but non-zero centred returns)")
    r, g = _rewards_and_groups(rewards, groups)
    out = np.zeros_like(r)
    if r.size == 0:
        return out
    if baseline == "group":
        for label in np.unique(g):
            members = g == label
            centred = r[members] - r[members].mean()
            std = r[members].std()
            if std == 0:  # equal rewards: no signal (and no 0/0 noise from rounding)
                continue
            out[members] = centred / (std + eps) if scale == "group" else centred
    elif np.ptp(r) > 0:
        out = r - r.mean()
    if scale == "batch":
        std = out.std()
        out = out / (std + eps) if std > 0 else np.zeros_like(r)
    return out


# ==================================================================================== group filter
def zero_variance_groups(rewards: Sequence[float], groups: Sequence[Hashable]) -> set[Hashable]:
    """Labels of the groups whose rewards are all equal (with a group baseline they get no gradient)."""
    r, g = _rewards_and_groups(rewards, groups)
    return {label.item() for label in np.unique(g) if np.ptp(r[g == label]) == 0}


def zero_variance_fraction(rewards: Sequence[float] | np.ndarray, groups: Sequence[Hashable] | np.ndarray) -> float:
    """Fraction of groups whose rewards are all equal; nan when there are no groups."""
    r, g = _rewards_and_groups(rewards, groups)
    labels = np.unique(g)
    if labels.size == 0:
        return math.nan
    return float(np.mean([np.ptp(r[g == label]) == 0 for label in labels]))


def keep_informative(rewards: Sequence[float], groups: Sequence[Hashable]) -> np.ndarray:
    """Boolean mask over dialogues: True where the dialogue's group has rewards that differ (DAPO filter)."""
    r, g = _rewards_and_groups(rewards, groups)
    keep = np.ones(r.shape, dtype=bool)
    for label in np.unique(g):
        members = g == label
        if np.ptp(r[members]) == 0:
            keep[members] = False
    return keep


@dataclass(frozen=True)
class GroupPick:
    """The result of :func:`pick_informative`.

    Attributes:
        chosen: Indices of the chosen groups, in input order (at most ``wanted``).
        wanted: How many informative groups were asked for.
        uninformative: Groups discarded because their rewards are all equal.
        surplus: Informative groups left over after the first ``wanted`` (also discarded).
    """

    chosen: tuple[int, ...]
    wanted: int
    uninformative: int
    surplus: int

    @property
    def complete(self) -> bool:
        """Whether ``wanted`` informative groups were found (else the caller collects more)."""
        return len(self.chosen) == self.wanted


def pick_informative(group_rewards: Sequence[Sequence[float]], n: int) -> GroupPick:
    """The first ``n`` groups, in order, whose rewards are not all equal (DAPO dynamic sampling).

    Args:
        group_rewards: The rewards of each collected group (one sequence per group, non-empty).
        n: Informative groups wanted (``scenarios_per_update``).

    Returns:
        A :class:`GroupPick`; ``complete`` is False when fewer than ``n`` groups are informative.
    """
    if n < 1:
        raise ValueError(f"n (informative groups wanted) must be >= 1, got {n}")
    chosen: list[int] = []
    uninformative = surplus = 0
    for i, rewards in enumerate(group_rewards):
        r = np.asarray(rewards, dtype=float)
        if r.ndim != 1 or r.size == 0:
            raise ValueError(f"group {i}: rewards must be a non-empty 1-D sequence, got shape {r.shape}")
        if not np.isfinite(r).all():
            raise ValueError(f"group {i}: rewards must be finite, got {r.tolist()}")
        if np.ptp(r) == 0:
            uninformative += 1
        elif len(chosen) < n:
            chosen.append(i)
        else:
            surplus += 1
    return GroupPick(tuple(chosen), n, uninformative, surplus)


# ==================================================================================== per-unit loss
def _check_clip(eps_low: float, eps_high: float) -> None:
    if not 0 < eps_low < 1:
        raise ValueError(f"eps_low must be in (0, 1) (the ratio is clipped below at 1 - eps_low), got {eps_low}")
    if not (math.isfinite(eps_high) and eps_high > 0):
        raise ValueError(f"eps_high must be a positive number (0.2 symmetric, 0.28 DAPO clip-higher), got {eps_high}")


def _check_shapes(weight: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    if weight.ndim not in (1, 2):
        raise ValueError(f"weight must be [N] (act level) or [B, T] (text level), got shape {tuple(weight.shape)}")
    for name, tensor in tensors.items():
        if tensor is not None and tensor.shape != weight.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} but weight has {tuple(weight.shape)}; "
                             f"every per-unit tensor must match (expand per-dialogue advantages to [B, T])")


class UnitLoss(NamedTuple):
    """Per-unit parts of the loss (all 0 at masked units).

    Attributes:
        loss: Clipped surrogate plus ``kl_coef * KL``, with gradient.
        clipped: 1.0 where the ratio lies outside ``[1 - eps_low, 1 + eps_high]`` (detached).
        kl: The masked KL (with gradient), or None without a KL term.
    """

    loss: torch.Tensor
    clipped: torch.Tensor
    kl: torch.Tensor | None


def per_unit_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantage: torch.Tensor, weight: torch.Tensor, *,
                  eps_low: float = 0.2, eps_high: float = 0.2, kl: torch.Tensor | None = None,
                  kl_coef: float = 0.0, is_weight: torch.Tensor | None = None) -> UnitLoss:
    """``-min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A) + kl_coef * KL`` per unit.

    Units with weight 0 (simulator, env and template tokens) are replaced by constants *before* any
    arithmetic, so whatever they hold (even inf or nan) reaches neither the loss nor its gradient
    (``torch.where`` routes no gradient to the branch it does not take).

    Args:
        logp: Current log-probs of the units (with gradient), ``[N]`` or ``[B, T]``.
        old_logp: Log-probs under the policy that collected them.
        advantage: Advantage per unit.
        weight: 1 for the policy's units, 0 elsewhere.
        eps_low: Lower clip range, in (0, 1).
        eps_high: Upper clip range, > 0 (DAPO clip-higher: larger than ``eps_low``).
        kl: KL to the reference per unit (with gradient), or None.
        kl_coef: KL weight.
        is_weight: Per-unit importance weight of the surrogate (detached), e.g. :func:`truncated_is_weights`
            when another engine sampled the units; None: 1.

    Returns:
        A :class:`UnitLoss`. ``clipped`` marks ratios outside the range whatever the advantage's sign.
    """
    _check_clip(eps_low, eps_high)
    _check_shapes(weight, logp=logp, old_logp=old_logp, advantage=advantage, kl=kl, is_weight=is_weight)
    on = weight > 0
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    logp, old_logp = torch.where(on, logp, zero), torch.where(on, old_logp, zero)
    advantage = torch.where(on, advantage, zero)
    ratio = torch.exp(logp - old_logp)
    loss = -torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * advantage)
    if is_weight is not None:
        loss = loss * torch.where(on, is_weight.detach(), zero)
    if kl is not None:
        kl = torch.where(on, kl, zero)
        loss = loss + kl_coef * kl
    shift = ratio.detach() - 1  # |shift| > eps written one-sided per bound (exact same test when symmetric)
    clipped = (((shift > eps_high) | (-shift > eps_low)) & on).float()
    return UnitLoss(loss, clipped, kl)


class Mismatch(NamedTuple):
    """Truncated importance sampling of one (micro-)batch (:func:`truncated_is_weights`).

    Attributes:
        weight: ``min(pi_old / pi_gen, cap)`` per unit (0 at masked units), detached.
        abs_diff_sum: Sum over units of ``|log pi_old - log pi_gen|`` (divide by the batch's units).
        truncated: Units whose ratio exceeded the cap.
    """

    weight: torch.Tensor
    abs_diff_sum: float
    truncated: float


def truncated_is_weights(old_logp: torch.Tensor, gen_logp: torch.Tensor, weight: torch.Tensor,
                         cap: float) -> Mismatch:
    """Truncated importance sampling (TIS; Yao et al. 2025, as in verl and TRL) for units another engine sampled.

    The generator (vLLM) and the trainer (torch) compute slightly different probabilities for the same weights
    (kernels, precision, batching), so the samples come from ``pi_gen``, not ``pi_old``. Each unit's surrogate
    is weighted by ``min(exp(log pi_old - log pi_gen), cap)``: unbiased up to the truncation, with bounded
    variance.

    Args:
        old_logp: Trainer log-probs of the policy that collected the batch, ``[N]`` or ``[B, T]``.
        gen_logp: The generator's log-probs of the same units (``Trajectory.logprobs``).
        weight: 1 at the policy's units, 0 elsewhere.
        cap: Largest weight (> 0; verl/TRL use 2; ``math.inf``: plain importance sampling).
    """
    if not cap > 0:
        raise ValueError(f"the TIS cap must be a positive number (2 is usual), got {cap}")
    _check_shapes(weight, old_logp=old_logp, gen_logp=gen_logp)
    on = weight > 0
    zero = torch.zeros((), dtype=old_logp.dtype, device=old_logp.device)
    delta = torch.where(on, old_logp.detach() - gen_logp.to(old_logp.dtype), zero)
    ratio = torch.exp(delta)
    return Mismatch(torch.where(on, ratio.clamp(max=cap), zero), float((delta.abs() * weight).sum()),
                    float(((ratio > cap) & on).sum()))


# ===================================================================================== aggregation
@dataclass(frozen=True)
class LossTotals:
    """Normalisers of the *whole* batch, shared by its micro-batches so that their losses add up.

    Attributes:
        units: Total weight (number of policy units) in the batch.
        sequences: Sequences with at least one unit (rows of ``[B, T]`` weights; each unit of ``[N]`` weights).
        max_len: The constant of ``token-sum`` (Dr. GRPO's maximum generation length).
    """

    units: float
    sequences: int
    max_len: float = 1.0

    @classmethod
    def of(cls, weights: Iterable[torch.Tensor], max_len: float | None = None) -> LossTotals:
        """Totals over the weights of every micro-batch of a batch.

        Args:
            weights: The weight (mask) tensor of each micro-batch, ``[N]`` or ``[B, T]``.
            max_len: ``token-sum`` constant, e.g. ``max_new_tokens * max_policy_turns``. None uses the widest
                row (``T``; 1 for ``[N]`` weights), which is the same for all micro-batches of a batch but
                not across batches: pass a constant for Dr. GRPO proper.
        """
        weights = list(weights)
        units = sum(float(w.sum()) for w in weights)
        sequences = sum(int(((w.sum(-1) if w.ndim == 2 else w) > 0).sum()) for w in weights)
        if max_len is None:
            max_len = float(max((w.shape[-1] if w.ndim == 2 else 1 for w in weights), default=1))
        if not (math.isfinite(max_len) and max_len > 0):
            raise ValueError(f"max_len must be a positive number, got {max_len}")
        return cls(units, sequences, max_len)


def aggregate(values: torch.Tensor, weight: torch.Tensor, mode: Aggregation = "token-mean",
              totals: LossTotals | None = None) -> torch.Tensor:
    """Reduce per-unit ``values`` to the scalar loss of this (micro-)batch.

    With ``U = totals.units``, ``S = totals.sequences`` and ``L = totals.max_len`` of the whole batch:

    - ``token-mean``: ``sum_{i,t} w l / max(U, 1)``: every unit of the batch weighs the same (GRPO, DAPO).
    - ``sequence-mean``: ``sum_i (sum_t w l / sum_t w) / max(S, 1)``: every sequence weighs the same,
      its units share its weight (the original GRPO paper). Rows without units add 0.
    - ``token-sum``: ``sum_{i,t} w l / (max(S, 1) * L)``: Dr. GRPO, a constant instead of each length.

    Micro-batches must split along sequences (rows); given the batch's ``totals``, their results sum to the
    whole-batch result. ``[N]`` inputs are N sequences of one unit (to weigh act-level decisions per dialogue,
    pass ``[dialogues, max_decisions]`` tensors padded with weight 0).

    Args:
        values: Per-unit values, ``[N]`` or ``[B, T]``; they must be finite at masked units (``0 * nan`` is
            nan), as :func:`per_unit_loss` makes them.
        weight: Per-unit weights, same shape.
        mode: One of :data:`AGGREGATIONS`.
        totals: Batch normalisers; None takes them from ``weight`` alone (a batch in one piece).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")
    _check_shapes(weight, values=values)
    totals = LossTotals.of([weight]) if totals is None else totals
    weighted = values * weight
    if mode == "token-mean":
        return weighted.sum() / max(totals.units, 1.0)
    if mode == "token-sum":
        return weighted.sum() / (max(totals.sequences, 1) * totals.max_len)
    rows = weighted[:, None] if weight.ndim == 1 else weighted
    count = weight[:, None].sum(-1) if weight.ndim == 1 else weight.sum(-1)
    per_sequence = rows.sum(-1) / torch.where(count > 0, count, torch.ones_like(count))
    return per_sequence.sum() / max(totals.sequences, 1)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantage: torch.Tensor, weight: torch.Tensor, *,
                eps_low: float = 0.2, eps_high: float = 0.2, kl: torch.Tensor | None = None, kl_coef: float = 0.0,
                aggregation: Aggregation = "token-mean", totals: LossTotals | None = None,
                is_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`per_unit_loss` reduced by :func:`aggregate`, plus metrics.

    With the defaults this equals the trainer's original ``surrogate_loss`` bit for bit (``totals.units``
    playing its ``normaliser``).

    Returns:
        ``(loss, {"kl": mean KL, "clip_frac": share of clipped units})``; both metrics are means over the
        units of the whole batch (divided by ``max(totals.units, 1)`` whatever the aggregation), so they
        also add up over micro-batches.
    """
    parts = per_unit_loss(logp, old_logp, advantage, weight, eps_low=eps_low, eps_high=eps_high, kl=kl,
                          kl_coef=kl_coef, is_weight=is_weight)
    totals = LossTotals.of([weight]) if totals is None else totals
    loss = aggregate(parts.loss, weight, aggregation, totals)
    units = max(totals.units, 1.0)
    kl_sum = float((parts.kl.detach() * weight).sum()) if parts.kl is not None else 0.0
    return loss, {"kl": kl_sum / units, "clip_frac": float((parts.clipped * weight).sum()) / units}


# ====================================================================================== algorithms
@dataclass(frozen=True)
class Algorithm:
    """One policy-gradient variant: the settings of every hook.

    Attributes:
        name: Registry key.
        baseline: Advantage baseline (:func:`advantages`).
        scale: Advantage scaling (:func:`advantages`).
        eps_low: Ratio clipped below at ``1 - eps_low``.
        eps_high: Ratio clipped above at ``1 + eps_high``.
        aggregation: Loss aggregation (:func:`aggregate`).
        dynamic_sampling: Drop equal-reward groups and collect more until the batch is full (DAPO).
    """

    name: str
    baseline: Baseline = "group"
    scale: Scale = "group"
    eps_low: float = 0.2
    eps_high: float = 0.2
    aggregation: Aggregation = "token-mean"
    dynamic_sampling: bool = False

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"Algorithm {self.name!r}: {message}")

        need(self.baseline in BASELINES, f"baseline must be one of {BASELINES}, got {self.baseline!r}")
        need(self.scale in SCALES, f"scale must be one of {SCALES}, got {self.scale!r}")
        need(not (self.baseline == "batch" and self.scale == "group"), "scale='group' needs baseline='group'")
        need(self.aggregation in AGGREGATIONS, f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        try:
            _check_clip(self.eps_low, self.eps_high)
        except ValueError as error:
            need(False, str(error))

    def advantages(self, rewards: Sequence[float], groups: Sequence[Hashable]) -> np.ndarray:
        """Per-dialogue advantages under this variant's baseline and scaling."""
        return advantages(rewards, groups, baseline=self.baseline, scale=self.scale)

    def loss(self, logp: torch.Tensor, old_logp: torch.Tensor, advantage: torch.Tensor, weight: torch.Tensor, *,
             kl: torch.Tensor | None = None, kl_coef: float = 0.0, totals: LossTotals | None = None,
             is_weight: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """:func:`policy_loss` with this variant's clip range and aggregation."""
        return policy_loss(logp, old_logp, advantage, weight, eps_low=self.eps_low, eps_high=self.eps_high, kl=kl,
                           kl_coef=kl_coef, aggregation=self.aggregation, totals=totals, is_weight=is_weight)


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("grpo"),
    Algorithm("dr_grpo", scale="none", aggregation="token-sum"),
    Algorithm("dapo", eps_high=0.28, dynamic_sampling=True),
    Algorithm("reinforce_pp", scale="batch"),
)}


def algorithm(name: str) -> Algorithm:
    """The registered variant called ``name``.

    Raises:
        ValueError: Unknown name (the message lists the valid ones).
    """
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of: {', '.join(ALGORITHMS)}") from None
