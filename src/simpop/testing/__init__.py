"""Conformance checks for dialogue envs and user simulators, for simpop's own tests and for yours.

Two entry points run every check and raise ``AssertionError`` naming the failed check and what to fix:

- :func:`check_dialogue_env` for a two-seat env (the :class:`~simpop.envs.dialogue.DialogueEnv`
  contract: PettingZoo's parallel API test, two seats, seeded determinism, pickling, scenario
  selection, memoised spaces, off-turn actions ignored, misuse raising, bad actions flagged, and
  optionally Gymnasium's checker on the single-agent view);
- :func:`check_simulator` for whatever fills the user seat (the Simulator contract: slots, ``act`` =
  slot 0 of ``act_batch``, seeded determinism, ``spec``, ``feedback``, ``member``, bad slots raising).

Each check is also a function of its own, in a module per family (:mod:`~simpop.testing.api`,
:mod:`~simpop.testing.determinism`, :mod:`~simpop.testing.bad_input`, :mod:`~simpop.testing.simulator`;
what they share, for writing more, is :mod:`~simpop.testing.harness`) and by name in :data:`ENV_CHECKS`
and :data:`SIMULATOR_CHECKS`, so that a test suite can parametrise over them::

    import functools, pytest, simpop
    from simpop.testing import ENV_CHECKS, check_simulator

    make_env = functools.partial(simpop.make, "simpop/PersuasionAct-v0")

    @pytest.mark.parametrize("check", list(ENV_CHECKS.values()), ids=list(ENV_CHECKS))
    def test_env(check):
        check(make_env)

    def test_my_simulator():
        check_simulator(lambda env: MySimulator(), make_env)

Envs are passed as a factory (a zero-argument callable, e.g. ``functools.partial(simpop.make, id)``),
a registered env id, or an instance (copied with :func:`copy.deepcopy` wherever a check needs fresh
envs); a factory gives the strongest checks. Simulators are passed as an instance, a class (called with
no arguments) or a factory called with the env (like the registry's ``default_simulator`` entry points);
a factory or class gives a fresh simulator to each run, an instance is reused (``reset_batch`` must then
discard all earlier state).

Importing this package is cheap (numpy, plus what ``import simpop`` loads): PettingZoo, the env modules
and ``simpop.envs.wrappers`` are imported when a check needs them, and nothing here imports torch,
transformers or ``simpop.simulators`` (simulators are duck-typed).
"""

from collections.abc import Callable
from typing import Any

from simpop.testing.api import (check_parallel_api, check_scenarios, check_seats, check_single_agent_view,
                                check_spaces_memoised)
from simpop.testing.bad_input import NOT_AN_ACTION, check_bad_action, check_misuse_raises, check_off_turn_ignored
from simpop.testing.determinism import check_determinism, check_pickle
from simpop.testing.simulator import (Policy, check_simulator_bad_slot, check_simulator_batch,
                                      check_simulator_determinism, check_simulator_slot0, check_simulator_spec)

__all__ = ["ENV_CHECKS", "NOT_AN_ACTION", "SIMULATOR_CHECKS", "Policy", "check_bad_action", "check_determinism",
           "check_dialogue_env", "check_misuse_raises", "check_off_turn_ignored", "check_parallel_api", "check_pickle",
           "check_scenarios", "check_seats", "check_simulator", "check_simulator_bad_slot", "check_simulator_batch",
           "check_simulator_determinism", "check_simulator_slot0", "check_simulator_spec", "check_single_agent_view",
           "check_spaces_memoised"]


#: The env checks :func:`check_dialogue_env` runs (all but the single-agent view), by name; each takes
#: ``(env_or_factory, *, seed=...)``.
ENV_CHECKS: dict[str, Callable[..., None]] = {
    "seats": check_seats,
    "spaces_memoised": check_spaces_memoised,
    "parallel_api": check_parallel_api,
    "scenarios": check_scenarios,
    "determinism": check_determinism,
    "pickle": check_pickle,
    "off_turn_ignored": check_off_turn_ignored,
    "misuse_raises": check_misuse_raises,
    "bad_action": check_bad_action,
}


#: The checks in :data:`ENV_CHECKS` that take ``steps``.
_TAKES_STEPS = frozenset({"determinism", "off_turn_ignored", "bad_action"})


def check_dialogue_env(env_or_factory: Any, *, seed: int = 0, steps: int = 12,
                       single_agent_simulator: Any = None) -> list[str]:
    """Run every env-contract check (:data:`ENV_CHECKS`, plus the single-agent view if a simulator is given).

    Args:
        env_or_factory: A zero-argument env factory (best), a registered env id, or an env instance.
        seed: Seed for resets and sampled actions.
        steps: Steps for the determinism, off-turn and bad-action checks.
        single_agent_simulator: A simulator (or factory called with the env) for the user seat: if given,
            Gymnasium's checker runs on ``UserSeat(env, simulator)``.

    Returns:
        The names of the checks that ran (all passed).

    Raises:
        AssertionError: From the first failing check, naming it and what to fix.
    """
    for key, check in ENV_CHECKS.items():
        check(env_or_factory, seed=seed, **({"steps": steps} if key in _TAKES_STEPS else {}))
    if single_agent_simulator is None:
        return list(ENV_CHECKS)
    check_single_agent_view(env_or_factory, single_agent_simulator, seed=seed)
    return [*ENV_CHECKS, "single_agent_view"]


#: The simulator checks :func:`check_simulator` runs, by name; each takes
#: ``(simulator_or_factory, env_id_or_factory, *, seed=..., episodes=..., slots=..., policy=...)``.
SIMULATOR_CHECKS: dict[str, Callable[..., None]] = {
    "spec": check_simulator_spec,
    "batch": check_simulator_batch,
    "slot0": check_simulator_slot0,
    "determinism": check_simulator_determinism,
    "bad_slot": check_simulator_bad_slot,
}


def check_simulator(simulator_or_factory: Any, env_id_or_factory: Any, *, seed: int = 0, episodes: int = 2,
                    slots: int = 3, policy: Policy | None = None) -> list[str]:
    """Run every Simulator-contract check (:data:`SIMULATOR_CHECKS`) with the simulator in the env's user seat.

    Args:
        simulator_or_factory: A simulator, a simulator class, or a factory called with the env (fresh
            simulators make the determinism check meaningful).
        env_id_or_factory: A registered env id, a zero-argument env factory, or an env instance.
        seed: Seed for env resets, the policy and the generators handed to the simulator.
        episodes: Episodes per run (each batched run starts ``slots`` dialogues per episode).
        slots: Slots in the batched runs.
        policy: ``policy(observation, action_space, rng) -> action`` for the policy seat (default: sample
            the policy seat's action space).

    Returns:
        The names of the checks that ran (all passed).

    Raises:
        AssertionError: From the first failing check, naming it and what to fix.
    """
    for key, check in SIMULATOR_CHECKS.items():
        # The spec check needs only a short run; slot0 ignores slots and bad_slot episodes (one signature for all).
        sizes = {"episodes": 1, "slots": min(slots, 2)} if key == "spec" else {"episodes": episodes, "slots": slots}
        check(simulator_or_factory, env_id_or_factory, seed=seed, policy=policy, **sizes)
    return list(SIMULATOR_CHECKS)
