"""Metrics helpers and the metrics log."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from simpop.evaluation.metrics import (MetricsLogger, bootstrap_ci, categorical_entropy, mean_ci, mean_token_entropy,
                                       student_t_quantile, success_rate)


def test_success_rate():
    assert success_rate([True, False, True, True]) == 0.75
    assert math.isnan(success_rate([]))


@pytest.mark.parametrize(("q", "df", "expected"), [(0.975, 1, 12.706204736), (0.975, 4, 2.776445105),
                                                     (0.95, 10, 1.812461123), (0.995, 30, 2.749995654)])
def test_t_quantile_matches_tables(q, df, expected):
    assert student_t_quantile(q, df) == pytest.approx(expected, rel=1e-8)


def test_mean_ci():
    mean, lo, hi = mean_ci([1.0, 2.0, 3.0, 4.0])
    half = 3.182446305 * np.std([1, 2, 3, 4], ddof=1) / 2
    assert mean == 2.5 and lo == pytest.approx(2.5 - half) and hi == pytest.approx(2.5 + half)
    assert mean_ci([0.7]) == (0.7, 0.7, 0.7)
    assert all(math.isnan(x) for x in mean_ci([]))
    wide, narrow = mean_ci([0, 1, 0, 1], level=0.99), mean_ci([0, 1, 0, 1], level=0.8)
    assert wide[1] < narrow[1] < narrow[2] < wide[2]
    with pytest.raises(ValueError, match="level"):
        mean_ci([1, 2], level=95)


def test_bootstrap_ci_covers_the_normal_interval_and_is_reproducible():
    outcomes = [1] * 30 + [0] * 70  # a success rate of 0.3 over 100 dialogues
    mean, lo, hi = bootstrap_ci([outcomes])
    half = 1.96 * math.sqrt(0.3 * 0.7 / 100)
    assert mean == pytest.approx(0.3) and lo == pytest.approx(0.3 - half, abs=0.02) and hi == pytest.approx(0.3 + half, abs=0.02)
    values = list(np.random.default_rng(0).normal(size=50))
    assert bootstrap_ci([outcomes]) == (mean, lo, hi) and bootstrap_ci([values], seed=1) != bootstrap_ci([values])
    gap = bootstrap_ci([[1] * 40, [0] * 30 + [1] * 10], statistic=lambda a, b: float(a.mean() - b.mean()))
    assert gap[0] == pytest.approx(0.75) and 0.55 < gap[1] < 0.75 < gap[2] < 0.95  # two samples, resampled apart
    assert bootstrap_ci([[0.4]]) == (0.4, 0.4, 0.4)
    assert all(math.isnan(x) for x in bootstrap_ci([[]])) and all(math.isnan(x) for x in bootstrap_ci([]))
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([outcomes], level=1.5)


def test_entropies():
    assert categorical_entropy(np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])) == pytest.approx([math.log(2), 0.0])
    assert mean_token_entropy([9.0, 1.0, 3.0], [0, 1, 1]) == 2.0
    with pytest.raises(ValueError, match="shape"):
        mean_token_entropy([1.0], [1, 1])


def test_logger_writes_jsonl_and_tensorboard_and_resumes(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in (1, 2, 3):
        logger.log(step, {"loss": np.float32(0.5) * step, "success": step / 4})
    logger.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    assert json.loads(lines[1]) == {"step": 2, "loss": 1.0, "success": 0.5}
    assert any((tmp_path / "tb").iterdir())
    # A run killed after step 3 whose last checkpoint is step 2 resumes writing after step 2.
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "lo')  # torn line
    resumed = MetricsLogger(tmp_path, resume_step=2, report_to="none")
    assert [r["step"] for r in resumed.read()] == [1, 2]
    resumed.log(3, {"loss": 9.0})
    assert [r["step"] for r in resumed.read()] == [1, 2, 3]
    assert MetricsLogger(tmp_path, report_to="none").read() == []  # a fresh run starts a fresh log
