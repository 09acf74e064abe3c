"""Scalar metrics and the per-step metrics log.

``success_rate`` and ``wilson_ci`` summarise episodes (a success rate with a Wilson score interval, which
stays within [0, 1]); ``mean_ci`` (Student-t) summarises per-seed values, ``bootstrap_ci`` the dialogues of
one seed; ``categorical_entropy`` and
``mean_token_entropy`` are the policy-entropy diagnostics (DESIGN.md §3 Evaluation);
:class:`MetricsLogger` writes ``metrics.jsonl`` (one JSON object per step) and sends the same numbers to the
experiment trackers chosen (:mod:`simpop.evaluation.trackers`: TensorBoard by default, Weights & Biases).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

#: Metric keys that measure speed (wall-clock or CPU time); they differ between otherwise identical runs.
WALL_CLOCK_KEYS = frozenset({"tokens_per_s", "steps_per_s", "rollout_s", "update_s", "cpu_s_per_update"})


def success_rate(successes: Iterable[bool | float]) -> float:
    """Fraction of successful episodes (NaN for none)."""
    values = [float(s) for s in successes]
    return float(np.mean(values)) if values else math.nan


def wilson_ci(successes: float, n: int, level: float = 0.95) -> tuple[float, float, float]:
    """Success rate and its two-sided Wilson score interval ``(rate, lo, hi)``, always within [0, 1].

    With ``z`` the standard normal quantile at ``0.5 + level / 2`` and ``p = successes / n``::

        centre = (p + z^2 / (2n)) / (1 + z^2 / n)
        half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / (4 n^2))

    Unlike the normal (Wald) or Student-t interval it never leaves [0, 1] and is not empty at 0 or n
    successes. With ``n == 0`` all three are NaN.

    Args:
        successes: Number of successes (0 <= successes <= n; fractional counts are allowed).
        n: Number of trials.
        level: Confidence level in (0, 1).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95; got {level}")
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return math.nan, math.nan, math.nan
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = successes / n
    scale = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z / scale * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    # At 0 (or n) successes the bound is exactly 0 (or 1); computed, it can be off by a rounding error.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return p, lo, hi


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t confidence interval ``(mean, lo, hi)``.

    With one value the interval is that value itself (no spread can be estimated); with none,
    all three are NaN.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95; got {level}")
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if x.size == 1:
        return mean, mean, mean
    half = student_t_quantile(0.5 + level / 2, df=x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def bootstrap_ci(samples: Sequence[Sequence[float]], statistic: Callable[..., float] | None = None,
                 level: float = 0.95, resamples: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """``statistic`` of ``samples`` and its percentile-bootstrap interval ``(value, lo, hi)`` (scipy's ``bootstrap``).

    Each sample (e.g. one evaluation's per-dialogue outcomes) is resampled with replacement on its own,
    ``resamples`` times with a generator seeded by ``seed`` (the same data give the same interval);
    ``statistic`` takes one array per sample (default: the mean of the one sample). For paired data pass
    the per-unit differences as one sample. An empty sample gives NaN for all three; samples of one value each
    give an interval of zero width (no spread can be estimated).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95; got {level}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    arrays = [np.asarray(s, dtype=float) for s in samples]
    if not arrays or any(a.size == 0 for a in arrays):
        return math.nan, math.nan, math.nan
    value = float(statistic(*arrays)) if statistic else float(arrays[0].mean())
    if all(a.size == 1 for a in arrays):
        return value, value, value
    from scipy.stats import bootstrap  # on first use: importing simpop loads no scipy

    lo, hi = bootstrap(arrays, statistic or np.mean, vectorized=statistic is None, n_resamples=resamples,
                       confidence_level=level, method="percentile", rng=np.random.default_rng(seed)).confidence_interval
    return value, float(lo), float(hi)


@functools.lru_cache(maxsize=256)
def student_t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (``q`` in (0.5, 1); scipy's, cached: a
    report asks for the same few quantiles a thousand times)."""
    if not 0.5 < q < 1 or df < 1:
        raise ValueError(f"need 0.5 < q < 1 and df >= 1, got q={q}, df={df}")
    from scipy.stats import t  # on first use: importing simpop loads no scipy

    return float(t.ppf(q, df))


#: The most pairs :func:`pairs_needed` searches.
MAX_PAIRS = 10_000


def paired_power(pairs: int, difference: float, sd: float, alpha: float) -> float:
    """Power of a two-sided paired t-test at level ``alpha`` over ``pairs`` pairs to detect ``difference``, the
    pairs' differences having standard deviation ``sd`` (noncentral t)."""
    from scipy import stats

    if pairs < 2:
        return 0.0
    if sd <= 0:
        return 1.0
    df, shift = pairs - 1, difference * math.sqrt(pairs) / sd
    critical = stats.t.ppf(1 - alpha / 2, df)
    exact = float(stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift))
    # scipy's noncentral t gives NaN far in its tail (large shifts): there the normal approximation is exact enough
    return exact if math.isfinite(exact) else float(stats.norm.sf(critical - shift) + stats.norm.cdf(-critical - shift))


def pairs_needed(difference: float, sd: float, alpha: float, target: float = 0.8) -> int:
    """The fewest pairs (>= 2) with which :func:`paired_power` reaches ``target`` (:data:`MAX_PAIRS` + 1: never)."""
    low, high = 2, MAX_PAIRS + 1
    while low < high:  # power rises with pairs
        mid = (low + high) // 2
        if paired_power(mid, difference, sd, alpha) >= target:
            high = mid
        else:
            low = mid + 1
    return low


def categorical_entropy(probs: np.ndarray) -> np.ndarray:
    """Entropy (nats) of each row of a probability matrix (``0 log 0 = 0``)."""
    p = np.asarray(probs, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return terms.sum(axis=-1)


def mean_token_entropy(entropies: Sequence[float], mask: Sequence[int]) -> float:
    """Mean per-token entropy over the positions where ``mask`` is 1 (the policy's own tokens)."""
    e, m = np.asarray(entropies, dtype=float), np.asarray(mask, dtype=bool)
    if e.shape != m.shape:
        raise ValueError(f"entropies {e.shape} and mask {m.shape} must have the same shape")
    return float(e[m].mean()) if m.any() else math.nan


class MetricsLogger:
    """Append one JSON object per step to ``run_dir/metrics.jsonl`` and send its numbers to the trackers.

    Args:
        run_dir: The run folder (created if missing).
        resume_step: When resuming from a checkpoint taken after step ``k``, pass ``k``: lines of
            later steps (written after that checkpoint by the run that died) are dropped so the log
            continues exactly as an uninterrupted run would have written it, and the trackers get only the
            steps after the last one it logged (they hold the others). ``None`` starts a fresh log (an
            existing one is truncated) and fresh tracker runs.
        report_to: The trackers (:func:`simpop.evaluation.trackers.trackers_named`: ``tensorboard``, ``wandb``,
            both, ``none``, ``all``).
        config: The run's settings, for the trackers (W&B's run config).
        name: The run's name in the trackers (W&B; default the folder's name).
        group: The trackers' group of the run (W&B).
    """

    def __init__(self, run_dir: str | Path, resume_step: int | None = None, report_to: str = "tensorboard", *,
                 config: dict[str, Any] | None = None, name: str | None = None, group: str | None = None):
        from simpop.evaluation.trackers import open_trackers

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        kept: list[str] = []
        #: The trackers hold the steps up to this one (those the interrupted run logged).
        self.tracked_through = -math.inf
        if resume_step is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                # A half-written last line (killed mid-write) is dropped with the later steps.
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                self.tracked_through = max(self.tracked_through, record.get("step", -math.inf))
                if record.get("step", math.inf) <= resume_step:
                    kept.append(line)
        self._trackers = open_trackers(report_to, self.run_dir, config=config, resume=resume_step is not None,
                                       name=name, group=group)
        self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Write ``{"step": step, **metrics}`` as one line; its numbers also go to the trackers."""
        from simpop.evaluation.trackers import tracked_values

        record = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
            f.flush()
        if step > self.tracked_through:
            self._trackers.scalars(int(step), tracked_values(record))

    def read(self) -> list[dict[str, Any]]:
        """Every record written so far."""
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def close(self) -> None:
        """Finish the tracker runs (the JSONL file is written per record)."""
        self._trackers.close()


def _plain(value: Any) -> Any:
    """Numpy scalars -> Python numbers so that ``json`` can write them."""
    return value.item() if isinstance(value, np.generic) else value

