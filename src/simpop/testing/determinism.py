"""Reproducible episodes: the same seed and actions give the same record; a pickled env goes on as the original."""

from __future__ import annotations

import pickle
from typing import Any

from simpop.testing.harness import (STEP_FIELDS, calling, fail, fields_difference, fresh_env, reset,
                                  sample_actions, step, transcript)

#: The names of the values in each kind of record :func:`_rollout` keeps.
_RECORD_FIELDS = {"reset": ("observations", "infos", "user_seed"), "step": ("actions", *STEP_FIELDS),
                  "transcript": ("transcript",)}

_Record = list[tuple[str, int, tuple[Any, ...]]]


def _rollout(check: str, env: Any, seed: int, steps: int) -> _Record:
    """Reset with ``seed`` and take ``steps`` seeded steps (resetting with new seeds after an episode ends).

    Returns:
        Records ``(kind, iteration, values)``, with values named by :data:`_RECORD_FIELDS`.
    """
    obs, infos = reset(check, env, seed)
    record: _Record = [("reset", -1, (obs, infos, getattr(env, "user_seed", None)))]
    for n in range(steps):
        if not env.agents:
            record.append(("transcript", n, (transcript(env),)))
            obs, infos = reset(check, env, seed + n + 1)
            record.append(("reset", n, (obs, infos, getattr(env, "user_seed", None))))
            continue
        actions = sample_actions(env, n)
        record.append(("step", n, (actions, *step(check, env, actions))))
    record.append(("transcript", steps, (transcript(env),)))
    return record


def _rollout_difference(a: _Record, b: _Record) -> str | None:
    """Where two rollouts first differ, as ``iteration 3 (step), rewards['persuader']: 0.0 != 1.0``."""
    for (kind, n, x), (other, _, y) in zip(a, b, strict=False):
        where = "the first reset" if n < 0 else f"iteration {n} ({kind})"
        if kind != other:
            return f"{where}: one env did {kind}, the other {other}"
        found = fields_difference(x, y, _RECORD_FIELDS[kind])
        if found:
            return f"{where}, {found}"
    return None if len(a) == len(b) else f"the number of records: {len(a)} != {len(b)}"


def check_determinism(env_or_factory: Any, *, seed: int = 0, steps: int = 12, min_steps: int | None = None) -> None:
    """Two fresh envs, same seed and same seeded actions for ``steps`` steps: identical records.

    The record holds every reset's observations, infos and ``user_seed``, every step's five results and
    the transcripts. After an episode ends the env is reset with a new seed (counted as one of ``steps``).

    Args:
        env_or_factory: The env (factory, id or instance).
        seed: The reset seed.
        steps: Steps (and resets) to take.
        min_steps: How many of them must be steps rather than resets (default: all but two), so that
            the check sees transitions and not only resets.

    Raises:
        AssertionError: On the first difference, or if too few steps were taken.
    """
    name = "check_determinism"
    a, b = (_rollout(name, fresh_env(name, env_or_factory), seed, steps) for _ in range(2))
    found = _rollout_difference(a, b)
    if found:
        fail(name, f"two envs reset with seed={seed} and given the same actions differ at {found}",
             "draw every random choice from the generator seeded by reset(seed=...) (self.np_random or "
             "generators derived from it); no global random/np.random, unseeded generators, clocks or set order")
    taken = sum(1 for kind, *_ in a if kind == "step")
    needed = max(1, steps - 2) if min_steps is None else min_steps
    if taken < needed:
        fail(name, f"only {taken} of {steps} iterations were steps (episodes ended too early); need {needed}",
             "episodes of sampled actions should last several steps; or pass a smaller min_steps")


def check_pickle(env_or_factory: Any, *, seed: int = 0) -> None:
    """A mid-episode env survives ``pickle``: same transcript, and the clone's next step equals the original's.

    Raises:
        AssertionError: If pickling fails or the clone diverges.
    """
    name = "check_pickle"
    env = fresh_env(name, env_or_factory)
    for attempt in range(8):  # a sampled first action may end the episode (a lucky guess): try other samples
        reset(name, env, seed + attempt)
        step(name, env, sample_actions(env, attempt))
        if env.agents:
            break
    else:
        fail(name, "every sampled first step ended the episode, so no mid-episode env could be pickled",
             "episodes of sampled actions should last several steps")
    with calling(name, "pickle.loads(pickle.dumps(env))", "keep only picklable state on the env (no open "
                 "files, locks, lambdas or live processes), or implement __getstate__/__setstate__"):
        clone = pickle.loads(pickle.dumps(env))
    if transcript(clone) != transcript(env):
        fail(name, "the unpickled env has a different transcript", "pickle the transcript with the env")
    actions = sample_actions(env, 1)
    found = fields_difference(step(name, clone, actions), step(name, env, actions), STEP_FIELDS)
    if found:
        fail(name, f"after the same action the clone and the original differ: {found}",
             "pickle every piece of episode state, including random generators")
