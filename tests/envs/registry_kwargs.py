"""Constructor arguments that particular registered ids need in tests (e.g. a dataset path)."""

from __future__ import annotations

from typing import Any


def kwargs_for(env_id: str) -> dict[str, Any]:
    """Keyword arguments for ``simpop.make(env_id, ...)`` in the conformance tests."""
    return {}
