"""Env ids -> string entry points, and ``make``.

Entry points are strings (``"package.module:Name"``) so that registering an env imports nothing
heavy; the module is imported on first ``make``. Every id is also registered with Gymnasium, where
``gymnasium.make(id, simulator=...)`` returns the single-agent view of the policy seat
(:class:`simpop.envs.wrappers.UserSeat`; ``simulator`` may also be a factory, and one simulator object
shared by views whose episodes interleave is refused: see :mod:`simpop.envs.wrappers`).
"""

from __future__ import annotations

import importlib
import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import gymnasium

from simpop.validation import check


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
    """The :class:`EnvSpec` registered as ``id``.

    Raises:
        KeyError: Unknown id (the message lists the registered ones).
    """
    try:
        return _REGISTRY[id]
    except KeyError:
        raise KeyError(f"unknown env id {id!r}; registered ids: {', '.join(ids())}") from None


def make(id: str, api: Literal["parallel", "aec"] = "parallel", **kwargs: Any):
    """Build the PettingZoo env registered as ``id``; keyword arguments override the defaults.

    ``api="aec"`` returns its AEC view (:mod:`simpop.envs.aec`) instead of the parallel env.

    Raises:
        TypeError: An argument the constructor does not take, or a value of the wrong type for its
            annotation (``max_turns="abc"``), naming the argument.
    """
    if api not in ("parallel", "aec"):
        raise ValueError(f"api must be 'parallel' or 'aec', got {api!r}")
    s = spec(id)
    if "simulator" in kwargs:  # both seats stay open here; the seat a simulator fills is gymnasium.make's view
        raise TypeError(f"{id}: simpop.make builds the two-seat PettingZoo env, whose user seat an agent plays; to fill "
                        f"it with a simulator use gymnasium.make({id!r}, simulator=...) (or gymnasium.make_vec)")
    factory = load(s.entry_point)
    kwargs = dict(kwargs)
    check_arguments(id, factory, kwargs)
    env = factory(**{**s.kwargs, **kwargs})
    if api == "aec":
        from simpop.envs.aec import to_aec

        return to_aec(env)
    return env


def check_arguments(id: str, factory: Any, kwargs: dict[str, Any]) -> None:
    """Check ``kwargs`` against ``factory``'s signature and annotations (:func:`simpop.validation.check`: what can
    be checked is), converting them in place where that is lossless."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    params = signature.parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = sorted(set(kwargs) - set(named))
        if unknown:
            raise TypeError(f"{id}: unknown argument(s) {', '.join(unknown)}; valid: {', '.join(named)}")
    try:
        hints = typing.get_type_hints(factory.__init__ if isinstance(factory, type) else factory)  # type: ignore[misc]
    except Exception:  # unresolvable annotations: leave the checks to the constructor
        return
    for name, value in kwargs.items():
        if name in hints:
            kwargs[name] = check(id, name, hints[name], value, noun="argument ")


def parse_env_args(pairs: list[str]) -> dict[str, Any]:
    """Command-line env arguments ``["max_turns=4", ...]`` -> ``{"max_turns": 4}`` (values parsed as YAML scalars)."""
    from simpop.user_input import error_line, load_yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-arg takes KEY=VALUE (e.g. max_turns=4), got {error_line(repr(pair), 200)}")
        out[key] = load_yaml(value, f"--env-arg {error_line(pair, 200)}")
    return out
