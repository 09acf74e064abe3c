"""Hypothesis budgets by profile (``$HYPOTHESIS_PROFILE``): ``ci``, the default, runs a sixth of each property's
thorough budget (at least 20 examples, or all where the budget is smaller); ``thorough`` (``make test-thorough``)
runs all of it."""

from __future__ import annotations

import os

from hypothesis import settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.register_profile("ci", deadline=None)
settings.register_profile("thorough", deadline=None)
settings.load_profile(PROFILE)


def examples(thorough: int) -> int:
    """How many examples a property whose thorough budget is ``thorough`` runs under the loaded profile."""
    return thorough if PROFILE == "thorough" else max(min(thorough, 20), thorough // 6)
