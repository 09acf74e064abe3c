"""Wilson score intervals for success rates (what ``simpop eval`` reports)."""

from __future__ import annotations

import math

import pytest

from simpop.evaluation.metrics import mean_ci, wilson_ci


def test_wilson_by_hand():
    # 8 of 10 at 95%: z = 1.959964; centre = (0.8 + z^2/20) / (1 + z^2/10) = 0.716740;
    # half = z / (1 + z^2/10) * sqrt(0.8 * 0.2 / 10 + z^2 / 400) = 0.226585.
    z = 1.959963984540054
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z / (1 + z * z / 10) * math.sqrt(0.016 + z * z / 400)
    rate, lo, hi = wilson_ci(8, 10)
    assert rate == 0.8
    assert (lo, hi) == pytest.approx((centre - half, centre + half), abs=1e-12)
    assert (lo, hi) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # the textbook value


def test_wilson_stays_in_unit_interval_and_is_not_empty_at_the_ends():
    rate, lo, hi = wilson_ci(0, 10)
    assert (rate, lo) == (0.0, 0.0) and hi == pytest.approx(0.2775, abs=1e-4)  # z^2 / (n + z^2)
    rate, lo, hi = wilson_ci(10, 10)
    assert (rate, hi) == (1.0, 1.0) and lo == pytest.approx(1 - 0.2775, abs=1e-4)
    for n in (1, 2, 7, 24):
        for k in range(n + 1):
            rate, lo, hi = wilson_ci(k, n)
            assert 0.0 <= lo <= rate <= hi <= 1.0
    # The Student-t interval of the same 0/1 data leaves [0, 1] (why success uses Wilson).
    assert mean_ci([1, 0, 0, 0, 0, 0, 0])[1] < 0


def test_wilson_level_and_edge_cases():
    assert wilson_ci(3, 10, level=0.99)[1] < wilson_ci(3, 10, level=0.9)[1]
    assert all(math.isnan(x) for x in wilson_ci(0, 0))
    with pytest.raises(ValueError, match="level"):
        wilson_ci(1, 2, level=1.0)
    with pytest.raises(ValueError, match="successes"):
        wilson_ci(3, 2)
