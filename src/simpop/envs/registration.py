"""Env ids -> string entry points, and ``make``.

Entry points are strings (``"package.module:Name"``) so that registering an env imports nothing
heavy; the module is imported on first ``make``. Every id is also registered with Gymnasium, where
``gymnasium.make(id, simulator=...)`` returns the single-agent view of the policy seat
(:class:`simpop.envs.wrappers.UserSeat`; ``simulator`` may also be a factory, and one simulator object
shared by views whose episodes interleave is refused: see :mod:`simpop.envs.wrappers`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import gymnasium


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered env.

    Attributes:
        id: ``simpop/<Name>-v<N>``; bump ``N`` when behaviour changes.
        entry_point: ``"module:Class"`` of the PettingZoo env.
        kwargs: Default constructor arguments (overridden by ``make``'s keyword arguments).
        default_simulator: ``"module:factory"``; ``factory(env)`` returns the benchmark's native
            simulator for the user seat, used when the single-agent view is made without one.
    """

    id: str
    entry_point: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    default_simulator: str | None = None


_REGISTRY: dict[str, EnvSpec] = {}


def load(entry_point: str) -> Any:
    """Import ``"module:attr"`` (``attr`` may be dotted, e.g. ``Class.from_spec``) and return the attribute."""
    module_name, _, attr = entry_point.partition(":")
    if not attr:
        raise ValueError(f"entry point {entry_point!r} must look like 'package.module:Name'")
    value = importlib.import_module(module_name)
    for part in attr.split("."):
        value = getattr(value, part)
    return value


def register(id: str, entry_point: str, default_simulator: str | None = None, **kwargs: Any) -> None:
    """Register an env id (and its Gymnasium single-agent view)."""
    if id in _REGISTRY:
        raise ValueError(f"env id {id!r} is already registered")
    _REGISTRY[id] = EnvSpec(id, entry_point, dict(kwargs), default_simulator)
    gymnasium.register(id=id, entry_point="simpop.envs.wrappers:make_user_seat", kwargs={"env_id": id})


def ids() -> list[str]:
    """All registered env ids, sorted."""
    return sorted(_REGISTRY)


def spec(id: str) -> EnvSpec:
    try:
        return _REGISTRY[id]
    except KeyError:
        raise KeyError(f"unknown env id {id!r}; registered ids: {', '.join(ids())}") from None


def make(id: str, **kwargs: Any):
    """Build the PettingZoo env registered as ``id``; keyword arguments override the defaults."""
    s = spec(id)
    return load(s.entry_point)(**{**s.kwargs, **kwargs})


def parse_env_args(pairs: list[str]) -> dict[str, Any]:
    """Command-line env arguments ``["max_turns=4", ...]`` -> ``{"max_turns": 4}`` (values parsed as YAML scalars)."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-arg takes KEY=VALUE (e.g. max_turns=4), got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out
