"""Constructor arguments that particular registered ids need in tests (e.g. a dataset path)."""

from __future__ import annotations

from typing import Any

from simpop.envs.cooperbench.dataset import MINI_DIR

#: env id -> constructor arguments (ids not listed need none).
_KWARGS: dict[str, dict[str, Any]] = {
    # The real-dataset id, pointed at the packaged mini set (same layout) so that it is covered too.
    "simpop/CooperBench-v0": {"dataset": str(MINI_DIR)},
}

#: Ids that build exactly another id's env with these arguments: checked once, under the other id
#: (``test_conformance.test_an_id_checked_under_another_builds_the_same_env`` holds the pairing).
SAME_ENV = {"simpop/CooperBench-v0": "simpop/CooperBench-mini-v0"}


def kwargs_for(env_id: str) -> dict[str, Any]:
    """Keyword arguments for ``simpop.make(env_id, ...)`` in the conformance tests."""
    return dict(_KWARGS.get(env_id, {}))
