"""Constructor arguments that particular registered ids need in tests (e.g. a dataset path)."""

from __future__ import annotations

from typing import Any

from simpop.envs.cooperbench.dataset import MINI_DIR

#: env id -> constructor arguments (ids not listed need none).
_KWARGS: dict[str, dict[str, Any]] = {
    # The real-dataset id, pointed at the packaged mini set (same layout) so that it is covered too.
    "simpop/CooperBench-v0": {"dataset": str(MINI_DIR)},
}


def kwargs_for(env_id: str) -> dict[str, Any]:
    """Keyword arguments for ``simpop.make(env_id, ...)`` in the conformance tests."""
    return dict(_KWARGS.get(env_id, {}))
