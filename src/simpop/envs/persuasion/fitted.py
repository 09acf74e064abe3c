"""Fitting the native persuadee to the P4G corpus: the release simpop ships (read by :mod:`.release`) and its quality.

:func:`fit_release` makes ``data/p4g-fit-v1.json`` from the public corpus (repository and commit in its ``corpus``
field, with the SHA-256 of each file read) and records the command that remakes it (``command``)::

    simpop fit-p4g --corpus DIR            # writes the fit and the realism statistics (simpop.evaluation.realism)
    simpop fit-p4g --corpus DIR --check    # re-fits and compares with the shipped files (exit 1 if they differ)

What it holds, all fitted on a **training split** (:func:`split`: a seeded 80/20 split of the dialogues, annotated
and unannotated ones split separately so both halves have annotations) and never on the held-out 20%:

- ``point``: :func:`~simpop.envs.persuasion.corpus.fit_params` on the training split;
- ``resamples``: the same fit on ``len(resamples)`` bootstrap resamples of the training split (``fitted-<i>`` is
  resample ``i``; the spread of the resamples is the fit's uncertainty);
- ``personas``: per-attribute marginals of the training persuadees (numbers: mean and sd on the default sampler's
  grid; income and categories: frequencies), the ``human-<n>-<seed>`` persona set's sampler (attributes drawn
  independently: the corpus's correlations are not kept);
- ``quality``: the fit on the held-out split (:func:`fit_quality`): NLL per annotated dialogue of the persuadee's
  acts given the persuader's, fitted vs the hand-set model, and calibration of the donation rate and amount.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simpop.envs.persuasion.corpus import Corpus, fit_params, load_corpus
from simpop.envs.persuasion.likelihood import per_dialogue, reference_episodes, turns_of
from simpop.envs.persuasion.model import AMOUNT_LEVELS, PersuadeeModel, PersuadeeParams, asked_inclinations
from simpop.envs.persuasion.personas import CATEGORIES, CATEGORICAL, DEFAULT_MARGINALS, NUMERIC, Marginal, Persona
from simpop.envs.persuasion.release import FIT_VERSION

#: Where the corpus comes from (the fit records the commit it read).
CORPUS_REPOSITORY = "https://github.com/ohyj1002/persuasionforgood"
CORPUS_COMMIT = "3fbc0df7bd2a081413cad6e6092e7c712efc26c4"
CORPUS_FILES = {"full_dialog.csv": "data/FullData/full_dialog.csv", "full_info.csv": "data/FullData/full_info.csv",
                "300_dialog.xlsx": "data/AnnotatedData/300_dialog.xlsx",
                "300_info.xlsx": "data/AnnotatedData/300_info.xlsx"}
#: Seed of the split, the bootstrap resamples and the calibration draws; share of dialogues held out; resamples.
FIT_SEED, HELDOUT_FRACTION, RESAMPLES = 2019, 0.2, 20
#: Reference-persuader dialogues per held-out persona when predicting its donation.
PREDICTION_DRAWS = 32
#: Probability bins of the donation-rate reliability table.
CALIBRATION_BINS = 5


# ---------------------------------------------------------------------------------------------- fitting
def split(corpus: Corpus, fraction: float = HELDOUT_FRACTION, seed: int = FIT_SEED) -> tuple[Corpus, Corpus]:
    """(training, held-out) :class:`~simpop.envs.persuasion.corpus.Corpus`: ``fraction`` of the annotated and of the
    unannotated dialogues (each in dialogue-id order, permuted with ``seed``) are held out."""
    if not 0 < fraction < 1:
        raise ValueError(f"held-out fraction must be in (0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    train, held = [], []
    for group in ([d for d in corpus.dialogues if d.annotated], [d for d in corpus.dialogues if not d.annotated]):
        group = sorted(group, key=lambda d: d.id)
        order = rng.permutation(len(group))
        cut = int(round(fraction * len(group)))
        held += [group[i] for i in order[:cut]]
        train += [group[i] for i in order[cut:]]
    if not train or not held:
        raise ValueError(f"the corpus has {len(corpus.dialogues)} dialogues: too few to hold {fraction:.0%} out")
    return Corpus(tuple(train)), Corpus(tuple(held))


def persona_marginals(personas: Sequence[Persona]) -> dict[str, Marginal]:
    """Each attribute's marginal over ``personas``: numbers a normal (their mean and sd) on the default sampler's
    grid; income and categories their frequencies (a small floor keeps every value possible)."""
    out = {}
    for name in NUMERIC:
        values = np.array([getattr(p, name) for p in personas], dtype=float)
        if name == "income":
            counts = np.bincount(np.clip(np.round(values).astype(int), 1, 12) - 1, minlength=12)
            out[name] = Marginal(weights=tuple(float(c + 0.5) for c in counts))
        else:
            out[name] = Marginal(float(values.mean()), float(max(values.std(), 1e-3)), DEFAULT_MARGINALS[name].step)
    for name in CATEGORICAL:
        column = [getattr(p, name) for p in personas]
        out[name] = Marginal(weights=tuple(float(column.count(c) + 0.5) for c in CATEGORIES[name]))
    return out


def fit_release(corpus_dir: str, *, seed: int = FIT_SEED, fraction: float = HELDOUT_FRACTION,
                resamples: int = RESAMPLES, commit: str = CORPUS_COMMIT, command: str = "") -> dict[str, Any]:
    """The shipped fit's content (see the module docstring), fitted to the P4G corpus in ``corpus_dir``.

    Args:
        corpus_dir: The corpus folder (:func:`~simpop.envs.persuasion.corpus.load_corpus`).
        seed: The seed of the held-out split and of the bootstrap resamples.
        fraction: The share of dialogues held out from the fit.
        resamples: How many bootstrap resamples are fitted.
        commit: The corpus repository's commit the files come from (recorded, not checked).
        command: The command that made it (recorded).
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    corpus = load_corpus(corpus_dir)
    train, held = split(corpus, fraction, seed)
    point = fit_params(train)
    files = {name: hashlib.sha256((Path(corpus_dir) / name).read_bytes()).hexdigest()
             for name in CORPUS_FILES if (Path(corpus_dir) / name).is_file()}
    return {
        "version": FIT_VERSION,
        "corpus": {"repository": CORPUS_REPOSITORY, "commit": commit, "files": CORPUS_FILES, "sha256": files,
                   "dialogues": len(corpus.dialogues), "skipped": corpus.skipped,
                   "annotated": len(corpus.annotated)},
        "command": command,
        "split": {"seed": seed, "heldout_fraction": fraction, "train": len(train.dialogues),
                  "heldout": len(held.dialogues), "train_annotated": len(train.annotated),
                  "heldout_annotated": len(held.annotated),
                  "heldout_ids_sha256": hashlib.sha256("\n".join(sorted(d.id for d in held.dialogues)).encode()
                                                       ).hexdigest()},
        "point": _params_dict(point),
        "resamples": [_params_dict(fit_params(train.resample(seed, i))) for i in range(resamples)],
        "personas": {name: asdict(m) for name, m in persona_marginals(train.personas()).items()},
        "quality": fit_quality(point, held, seed=seed),
    }


def _params_dict(params: PersuadeeParams) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(params).items()}


# ---------------------------------------------------------------------------------------------- quality
def dialogue_nll(params: PersuadeeParams, dialogues: Sequence[Any]) -> np.ndarray:
    """Per annotated dialogue with a scorable turn: the negative log-likelihood (nats) of its persuadee acts given
    its persuader acts under ``params`` (the realism anchor's measure, :func:`~.likelihood.reference_episodes`)."""
    episodes = [e for e in reference_episodes(dialogues) if any(r >= 0 for _, r in e.turns)]
    theta = torch.as_tensor(params.to_vector(), dtype=torch.float64)
    with torch.no_grad():
        logprob, _ = per_dialogue(theta, None, turns_of(episodes), 1.0)
    return -logprob.numpy()


def predicted_donations(params: PersuadeeParams, personas: Sequence[Persona], seed: int = FIT_SEED,
                        draws: int = PREDICTION_DRAWS) -> tuple[np.ndarray, np.ndarray]:
    """Per persona: the probability of donating and the donors' distribution over :data:`AMOUNT_LEVELS` when a
    corpus-like :func:`~simpop.envs.persuasion.model.reference_persuader` asks (means over ``draws`` dialogues)."""
    rng = np.random.default_rng([seed, 1])
    model = PersuadeeModel(params)
    incl = asked_inclinations(params, [p for p in personas for _ in range(draws)], rng).reshape(len(personas), draws)
    p = 1.0 / (1.0 + np.exp(-incl))
    amounts = model.amount_probabilities(incl.ravel()).reshape(*incl.shape, -1)  # [n, draws, levels]
    donors = (p[..., None] * amounts).sum(1)
    return p.mean(1), donors / donors.sum(1, keepdims=True)


def calibration(params: PersuadeeParams, dialogues: Sequence[Any], seed: int = FIT_SEED) -> dict[str, Any]:
    """How well ``params`` predicts the donations of ``dialogues`` (their personas, asked by the reference persuader).

    Returns predicted vs observed donor rate and mean donation, the Brier score, the expected calibration error over
    :data:`CALIBRATION_BINS` equal-count bins of the predicted probability (with the bins), and the total variation
    distance between the predicted and observed donors' amount distributions (observed amounts at the nearest
    level).
    """
    p, amounts = predicted_donations(params, [d.persuadee_persona for d in dialogues], seed)
    y = np.array([d.donated for d in dialogues], dtype=float)
    levels = np.array(AMOUNT_LEVELS)
    observed = np.bincount([int(np.argmin(np.abs(levels - d.donation))) for d in dialogues if d.donated],
                           minlength=len(levels)).astype(float)
    predicted = (p[:, None] * amounts).sum(0)
    bins = []
    for chunk in np.array_split(np.argsort(p, kind="stable"), CALIBRATION_BINS):
        if len(chunk):
            bins.append({"n": int(len(chunk)), "predicted": float(p[chunk].mean()), "observed": float(y[chunk].mean())})
    return {"donor_rate": {"predicted": float(p.mean()), "observed": float(y.mean())},
            "mean_donation": {"predicted": float((p * (amounts @ levels)).mean()),
                              "observed": float(np.mean([d.donation for d in dialogues]))},
            "brier": float(np.mean((p - y) ** 2)),
            "ece": float(sum(b["n"] * abs(b["predicted"] - b["observed"]) for b in bins) / len(y)),
            "bins": bins,
            "amount_tv": float(0.5 * np.abs(predicted / predicted.sum() - observed / max(observed.sum(), 1)).sum())}


def fit_quality(params: PersuadeeParams, held: Corpus, seed: int = FIT_SEED, bootstrap: int = 2000) -> dict[str, Any]:
    """The fit ``params`` against the hand-set model on the held-out dialogues ``held``: mean NLL per annotated
    dialogue of each, their paired difference (fitted - hand-set) with a 95% bootstrap CI over dialogues, and
    :func:`calibration` of each."""
    base = PersuadeeParams()
    fitted_nll, base_nll = dialogue_nll(params, held.annotated), dialogue_nll(base, held.annotated)
    diff = fitted_nll - base_nll
    rng = np.random.default_rng([seed, 2])
    means = diff[rng.integers(len(diff), size=(bootstrap, len(diff)))].mean(1) if len(diff) else np.array([math.nan])
    return {"heldout_dialogues": len(held.dialogues), "heldout_scored_dialogues": int(len(diff)),
            "nll_per_dialogue": {"fitted": float(fitted_nll.mean()) if len(diff) else math.nan,
                                 "hand_set": float(base_nll.mean()) if len(diff) else math.nan,
                                 "difference": float(diff.mean()) if len(diff) else math.nan,
                                 "ci95": [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]},
            "calibration": {"fitted": calibration(params, held.dialogues, seed),
                            "hand_set": calibration(base, held.dialogues, seed)}}
