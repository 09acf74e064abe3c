"""What the checks share, for writing more: failures that say what to fix, the argument forms, driving an env."""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import numpy as np

#: Longest repr shown in a failure message.
REPR_LIMIT = 240
#: Safety cap on steps while driving an env to the end of an episode (envs have their own step caps).
MAX_EPISODE_STEPS = 100_000
#: Names of the five results of ``env.step``.
STEP_FIELDS = ("observations", "rewards", "terminations", "truncations", "infos")


class CheckFailed(AssertionError):
    """A failed check (an ``AssertionError``, so that test runners report it as a failure)."""


def fail(check: str, problem: str, fix: str) -> NoReturn:
    """Raise the failure of ``check``: what is wrong and how to fix it."""
    raise CheckFailed(f"[{check}] {problem}\n    fix: {fix}")


@contextlib.contextmanager
def calling(check: str, what: str, fix: str) -> Iterator[None]:
    """Turn an unexpected exception from env or simulator code into a check failure."""
    try:
        yield
    except CheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - every exception from user code is a failure to report
        kind = "failed an assertion" if isinstance(exc, AssertionError) else f"raised {type(exc).__name__}"
        raise CheckFailed(f"[{check}] {what} {kind}: {exc}\n    fix: {fix}") from exc


def expect_error(check: str, what: str, call: Callable[[], Any], errors: tuple[type[Exception], ...], says: str,
                 fix: str) -> None:
    """``call()`` must raise one of ``errors`` with a message that contains ``says`` (any message if empty)."""
    try:
        answer = call()
    except errors as exc:
        if not str(exc) or says.lower() not in str(exc).lower():
            fail(check, f"{what} raised {type(exc).__name__} without saying {says or 'why'!r}: {exc}", fix)
    except Exception as exc:  # noqa: BLE001
        fail(check, f"{what} raised {type(exc).__name__} ({exc}), expected {' or '.join(e.__name__ for e in errors)}",
             fix)
    else:
        fail(check, f"{what} did not raise; it answered {short(answer)}", fix)


def short(value: Any) -> str:
    """``repr(value)``, cut to :data:`REPR_LIMIT` characters."""
    text = repr(value)
    return text if len(text) <= REPR_LIMIT else text[:REPR_LIMIT] + f"... ({len(text)} chars)"


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where two nested records first differ (``None`` if equal); arrays compare by dtype, shape and bytes."""
    where = path or "<top>"
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} {short(a)} != {type(b).__name__} {short(b)}"
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: array {a.dtype}{a.shape} != array {b.dtype}{b.shape}"
        if a.dtype == object:
            return first_difference(a.tolist(), b.tolist(), path)
        return None if a.tobytes() == b.tobytes() else f"{where}: {short(a)} != {short(b)}"
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        pairs: Iterator[tuple[str, Any, Any]] = ((f"{path}[{key!r}]", a[key], b[key]) for key in a)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: length {len(a)} != {len(b)}"
        pairs = ((f"{path}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b, strict=True)))
    elif isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None
    else:
        try:
            equal = bool(a == b)
        except Exception:  # noqa: BLE001 - objects whose == is not a truth value
            equal = repr(a) == repr(b)
        return None if equal else f"{where}: {short(a)} != {short(b)}"
    return next((found for at, x, y in pairs if (found := first_difference(x, y, at))), None)


def fields_difference(a: tuple[Any, ...], b: tuple[Any, ...], fields: tuple[str, ...]) -> str | None:
    """The first difference between two tuples of named results, e.g. ``rewards['persuader']: 0.0 != 0.5``."""
    if len(a) != len(b):
        return f"{len(a)} results != {len(b)} results"
    pairs = zip(fields, a, b, strict=False)
    return next((found for field, x, y in pairs if (found := first_difference(x, y, field))), None)


def is_env(obj: Any) -> bool:
    """An env instance (an env class is a factory)."""
    return not isinstance(obj, type) and callable(getattr(obj, "step", None)) and callable(getattr(obj, "reset", None))


def fresh_env(check: str, env_or_factory: Any) -> Any:
    """A new env: from the zero-argument factory, by ``simpop.make`` from an id, or a deep copy of an instance."""
    if isinstance(env_or_factory, str):
        import simpop

        factory: Callable[[], Any] = functools.partial(simpop.make, env_or_factory)
    elif is_env(env_or_factory):
        factory = functools.partial(copy.deepcopy, env_or_factory)
    elif callable(env_or_factory):
        factory = env_or_factory
    else:
        raise TypeError(f"expected an env, a zero-argument env factory or a registered env id, got {env_or_factory!r}")
    with calling(check, "building the env", "the env factory must build an env with no arguments"):
        return factory()


def is_simulator(obj: Any) -> bool:
    """A simulator instance (a simulator class is a factory)."""
    return not isinstance(obj, type) and callable(getattr(obj, "reset_batch", None)) and \
        callable(getattr(obj, "act_batch", None))


def simulator_factory(simulator_or_factory: Any) -> Callable[[Any], Any]:
    """``factory(env) -> simulator``: the instance itself, a class called with no arguments, or the factory."""
    if is_simulator(simulator_or_factory):
        return lambda env: simulator_or_factory
    if isinstance(simulator_or_factory, type):
        return lambda env: simulator_or_factory()
    if callable(simulator_or_factory):
        return simulator_or_factory
    raise TypeError(f"expected a simulator, a simulator class or a factory(env), got {simulator_or_factory!r}")


def sample(space: Any, seed: int) -> Any:
    """A sample of ``space`` seeded with ``seed``."""
    space.seed(seed)
    return space.sample()


def sample_actions(env: Any, step: int) -> dict[str, Any]:
    """Seeded actions for every live seat (the off-turn one is ignored by the env)."""
    return {agent: sample(env.action_space(agent), 1000 * step + i) for i, agent in enumerate(env.agents)}


def transcript(env: Any) -> list[tuple[Any, ...]]:
    """The env's transcript as comparable tuples ``(seat, text, act)``."""
    return [(t.seat, t.text, t.act) for t in getattr(env, "transcript", [])]


def reset(check: str, env: Any, seed: int | None, options: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """``env.reset``, an exception a failure of ``check``."""
    with calling(check, f"reset(seed={seed}, options={options})", "reset must accept seed= and options="):
        return env.reset(seed=seed, options=options)


def step(check: str, env: Any, actions: dict[str, Any]) -> tuple[Any, ...]:
    """``env.step``, an exception a failure of ``check``."""
    with calling(check, f"step({short(actions)})", "a valid step must not raise"):
        return env.step(actions)


def play_to_end(check: str, env: Any) -> None:
    """Step ``env`` with sampled actions until the episode ends."""
    cap = int(getattr(env, "max_steps", MAX_EPISODE_STEPS))
    for n in range(cap + 1):
        if not env.agents:
            return
        step(check, env, sample_actions(env, n))
    fail(check, f"the episode did not end within {cap} steps (env.max_steps) of sampled actions",
         "end the episode (truncated=True) once max_steps steps have been taken")
