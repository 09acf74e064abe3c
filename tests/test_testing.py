"""The conformance checkers in :mod:`simpop.testing` pass on conforming envs and simulators and fail on broken ones.

A checker that cannot fail is worthless, so every check is run on a deliberately broken env or simulator
(subclasses of the P4G act env and its native persuadee, each with one defect) and must raise an
``AssertionError`` that names the check.
"""

from __future__ import annotations

import functools
import itertools
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

import simpop
from simpop import testing
from simpop.testing.harness import first_difference, sample_actions
from simpop.envs.dialogue import DialogueEnv, Outcome, Turn
from simpop.envs.registration import load, spec

ACT_ID = "simpop/PersuasionAct-v0"
#: The env class and native simulator factory of the act-level P4G env, from the registry.
ActEnv = load(spec(ACT_ID).entry_point)
native_act = load(spec(ACT_ID).default_simulator)
ActPersuadee = type(native_act(None))


def act_env() -> Any:
    return simpop.make(ACT_ID)


# ============================================================================================ a user's own env
class TinyEnv(DialogueEnv):
    """A minimal conforming env, as a user would write one: the user ends the dialogue by answering 2 (from turn 6)."""

    metadata = {**DialogueEnv.metadata, "name": "tiny_v0"}
    policy_seat, user_seat, first_seat = "agent", "user", "agent"

    def __init__(self, max_steps: int = 10):
        super().__init__(max_steps)

    def _make_spaces(self):
        obs = spaces.Box(0.0, 1.0, (3,), np.float32)
        return {s: obs for s in self.possible_agents}, {s: spaces.Discrete(3) for s in self.possible_agents}

    def scenario_ids(self) -> list[str]:
        return ["easy", "hard"]

    def load_scenario(self, scenario_id: str) -> Any:
        return SimpleNamespace(id=scenario_id)

    def _validate(self, seat: str, action: Any) -> str | None:
        if isinstance(action, (bool, np.bool_)) or not self.action_space(seat).contains(action):
            return f"action must be an int in [0, 3), got {action!r}"
        return None

    def _apply(self, seat: str, action: Any) -> str:
        self.transcript.append(Turn(seat, f"{seat} says {int(action)}", act=str(int(action))))
        return self.user_seat if seat == self.policy_seat else self.policy_seat

    def _outcome(self) -> Outcome | None:
        last = self.transcript[-1] if self.transcript else None
        if last is not None and last.seat == self.user_seat and last.act == "2" and len(self.transcript) >= 6:
            return Outcome({self.policy_seat: 1.0 if self.scenario.id == "easy" else 0.5})
        return None

    def _observe(self, seat: str) -> np.ndarray:
        last = int(self.transcript[-1].act) / 2 if self.transcript else 0.0
        return np.array([self.steps / self.max_steps, float(self.to_act == seat), last], np.float32)


class TinyUser:
    """A duck-typed simulator (no simpop base class): answers at random from the slot's generator."""

    name = "tiny-user"

    def __init__(self) -> None:
        self._rngs: list[np.random.Generator] = []

    @property
    def spec(self) -> Any:
        return SimpleNamespace(kind="custom", model="tiny", personas="scenario", decoding=(("p_end", 1 / 3),))

    def reset(self, scenario: Any, rng: np.random.Generator) -> None:
        self.reset_batch([scenario], [rng])

    def act(self, observation: Any) -> Any:
        return self.act_batch([observation], [0])[0]

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        self._rngs = list(rngs)

    def act_batch(self, observations: list[Any], slots: list[int]) -> list[int]:
        if any(not 0 <= s < len(self._rngs) for s in slots):
            raise IndexError(f"slots {slots} not started: reset_batch() started {len(self._rngs)} slots")
        return [int(self._rngs[s].integers(3)) for s in slots]

    def feedback(self, slots: list[int], rewards: list[float]) -> None:
        pass

    def member(self, slot: int) -> TinyUser:
        return self


def test_importing_testing_is_light():
    code = ("import sys, simpop.testing; "
            "print(sorted({'torch', 'transformers', 'tau2', 'litellm', 'pettingzoo'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_users_own_env_and_simulator_pass():
    assert testing.check_dialogue_env(TinyEnv, single_agent_simulator=TinyUser()) == [
        *testing.ENV_CHECKS, "single_agent_view"]
    assert testing.check_simulator(TinyUser, TinyEnv) == list(testing.SIMULATOR_CHECKS)


def test_p4g_act_env_and_native_simulator_pass():
    """The registered id, a factory and an instance all work; the native simulator as factory, class and instance."""
    for env in (ACT_ID, act_env, act_env()):
        assert testing.check_dialogue_env(env, single_agent_simulator=native_act) == [
            *testing.ENV_CHECKS, "single_agent_view"]
    for simulator in (native_act, ActPersuadee, ActPersuadee()):
        assert testing.check_simulator(simulator, ACT_ID, seed=3) == list(testing.SIMULATOR_CHECKS)


def test_p4g_text_env_native_simulator_passes():
    env_id = "simpop/Persuasion-v0"
    assert testing.check_simulator(load(spec(env_id).default_simulator), env_id, episodes=3, slots=4)


# ============================================================================================ broken envs
class UnmemoisedSpaces(ActEnv):
    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0.0, 1.0, super().observation_space(agent).shape, np.float32)


class Nondeterministic(ActEnv):
    def _start(self) -> None:
        super()._start()
        self._text_rng = np.random.default_rng()  # phrasings no longer follow the reset seed


class ThreeSeats(ActEnv):
    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.possible_agents = [*self.possible_agents, "judge"]


class SameSeatTwice(ActEnv):
    user_seat = "persuader"


class ObservationOutOfSpace(ActEnv):
    def _observe(self, seat: str) -> np.ndarray:
        return np.concatenate([super()._observe(seat), [2.0]]).astype(np.float32)


class RewardMissing(ActEnv):
    def step(self, actions: dict[str, Any]):
        out = super().step(actions)
        out[1].pop(self.user_seat, None)
        return out


class Unpicklable(ActEnv):
    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.on_step = lambda: None


class DuplicateScenarios(ActEnv):
    def scenario_ids(self) -> list[str]:
        ids = super().scenario_ids()
        return [*ids, ids[0]]


class IgnoresScenarioOption(ActEnv):
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        return super().reset(seed=seed)


class UnknownScenarioAccepted(ActEnv):
    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        if options.get("scenario_id") not in (None, *self.scenario_ids()):
            options["scenario_id"] = self.scenario_ids()[0]  # silently plays another scenario
        return super().reset(seed=seed, options=options)


class OffTurnNotFlagged(ActEnv):
    def step(self, actions: dict[str, Any]):
        out = super().step(actions)
        for info in out[4].values():
            info.pop("off_turn_action_ignored", None)
        return out


class OffTurnLeaks(ActEnv):
    def step(self, actions: dict[str, Any]):
        seat = self.to_act
        out = super().step(actions)
        if any(a != seat and v is not None for a, v in actions.items()):
            out[1][self.policy_seat] += 0.5  # the ignored action still pays
        return out


class SilentAfterDone(ActEnv):
    def step(self, actions: dict[str, Any]):
        if not self.agents and self.transcript:
            return {}, {}, {}, {}, {}
        return super().step(actions)


class StepsBeforeReset(ActEnv):
    def step(self, actions: dict[str, Any]):
        if self.scenario is None:
            self.reset()
        return super().step(actions)


class BadActionRaises(ActEnv):
    def _validate(self, seat: str, action: Any) -> str | None:
        if not isinstance(action, (int, np.integer)):
            raise TypeError(f"expected an int, got {type(action).__name__}")
        return super()._validate(seat, action)


class BadActionPassesTheTurn(ActEnv):
    def step(self, actions: dict[str, Any]):
        seat = self.to_act
        out = super().step(actions)
        if "invalid_action" in out[4].get(seat, {}) and self.agents:
            self.to_act = next(a for a in self.possible_agents if a != seat)
        return out


#: (broken env, the check that must catch it, what its message must say).
BROKEN_ENVS = [
    (UnmemoisedSpaces, testing.check_spaces_memoised, "new object"),
    (Nondeterministic, testing.check_determinism, "(transcript), transcript["),
    (ThreeSeats, testing.check_seats, "not two distinct seats"),
    (SameSeatTwice, testing.check_seats, "not two distinct seats"),
    (ObservationOutOfSpace, testing.check_parallel_api, "not in its observation space"),
    (RewardMissing, testing.check_parallel_api, "Live agent was not given reward"),
    (Unpicklable, testing.check_pickle, "pickle"),
    (DuplicateScenarios, testing.check_scenarios, "distinct"),
    (IgnoresScenarioOption, testing.check_scenarios, "gave scenario"),
    (UnknownScenarioAccepted, testing.check_scenarios, "did not raise"),
    (OffTurnNotFlagged, testing.check_off_turn_ignored, "off_turn_action_ignored'] is None"),
    (OffTurnLeaks, testing.check_off_turn_ignored, "changed rewards"),
    (SilentAfterDone, testing.check_misuse_raises, "after the episode ended did not raise"),
    (StepsBeforeReset, testing.check_misuse_raises, "before reset() did not raise"),
    (BadActionRaises, testing.check_bad_action, "raised TypeError"),
    (BadActionPassesTheTurn, testing.check_bad_action, "act again"),
]


@pytest.mark.parametrize("broken, check, says", BROKEN_ENVS, ids=lambda x: getattr(x, "__name__", None))
def test_env_checks_fail_on_broken_envs(broken, check, says):
    with pytest.raises(AssertionError, match=rf"\[{check.__name__}\]") as failure:
        check(broken)
    assert says in str(failure.value) and "fix:" in str(failure.value)
    with pytest.raises(AssertionError, match=rf"\[{check.__name__}\]"):
        testing.check_dialogue_env(broken)  # the aggregate runs the same check


def test_single_agent_view_fails_on_a_broken_env():
    with pytest.raises(AssertionError, match=r"\[check_single_agent_view\].*observation"):
        testing.check_single_agent_view(ObservationOutOfSpace, native_act)


def test_every_env_check_has_a_broken_env():
    covered = {check.__name__ for _, check, _ in BROKEN_ENVS}
    assert covered == {check.__name__ for check in testing.ENV_CHECKS.values()}


class EndsOnFirstGuess(TinyEnv):
    """A guessing game: the scenario is a number, and a first action that guesses it ends the dialogue."""

    def scenario_ids(self) -> list[str]:
        return ["0", "1", "2"]

    def _outcome(self) -> Outcome | None:
        if len(self.transcript) == 1 and self.transcript[0].act == self.scenario.id:
            return Outcome({self.policy_seat: 1.0})
        return super()._outcome()


def test_pickle_check_retries_a_first_step_that_ends_the_episode():
    first_try = EndsOnFirstGuess()
    first_try.reset(seed=0)
    first_try.step(sample_actions(first_try, 0))
    assert first_try.done  # the check's first sampled action would leave nothing to pickle mid-episode
    testing.check_pickle(EndsOnFirstGuess)


def test_determinism_needs_enough_steps():
    with pytest.raises(AssertionError, match=r"\[check_determinism\] only \d+ of 12"):
        testing.check_determinism(functools.partial(TinyEnv, max_steps=1), steps=12)


# ============================================================================================ broken simulators
class OutOfSpace(ActPersuadee):
    def act_batch(self, observations: list[Any], slots: list[int]) -> list[int]:
        return [10_000 for _ in super().act_batch(observations, slots)]


class ActDiffersFromSlot0(ActPersuadee):
    def act(self, observation: Any) -> int:
        return (super().act(observation) + 7) % 161


class UnseededDraws(ActPersuadee):
    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        super().reset_batch(scenarios, [np.random.default_rng() for _ in rngs])


class DropsAnAction(ActPersuadee):
    def act_batch(self, observations: list[Any], slots: list[int]) -> list[int]:
        return super().act_batch(observations, slots)[:-1] if len(slots) > 1 else super().act_batch(observations, slots)


class AnswersAnySlot(ActPersuadee):
    def act_batch(self, observations: list[Any], slots: list[int]) -> list[int]:
        return super().act_batch(observations, [s % len(self._slots) for s in slots])


class CountingSpec(ActPersuadee):
    _calls = itertools.count()

    @property
    def spec(self) -> Any:
        return SimpleNamespace(kind="persuadee", model="base", personas="scenario", decoding=(), call=next(self._calls))


class SpecIsAString(ActPersuadee):
    @property
    def spec(self) -> Any:
        return "persuadee"


class FeedbackWithoutRewards(ActPersuadee):
    def feedback(self, slots: list[int]) -> None:  # type: ignore[override]
        pass


class MemberIsNone(ActPersuadee):
    def member(self, slot: int) -> Any:
        return None


#: (broken simulator, the check that must catch it, what its message must say).
BROKEN_SIMULATORS = [
    (OutOfSpace, testing.check_simulator_batch, "not in the user seat's action space"),
    (DropsAnAction, testing.check_simulator_batch, "not 2 actions"),
    (FeedbackWithoutRewards, testing.check_simulator_batch, "feedback"),
    (MemberIsNone, testing.check_simulator_batch, "member(0) returned None"),
    (ActDiffersFromSlot0, testing.check_simulator_slot0, "act() and act_batch(..., [0]) answered differently"),
    (UnseededDraws, testing.check_simulator_determinism, "two runs with seed=0 differ"),
    (AnswersAnySlot, testing.check_simulator_bad_slot, "answered"),
    (CountingSpec, testing.check_simulator_spec, "str(spec) changed"),
    (SpecIsAString, testing.check_simulator_spec, "has no kind, model, personas, decoding"),
]


@pytest.mark.parametrize("broken, check, says", BROKEN_SIMULATORS, ids=lambda x: getattr(x, "__name__", None))
def test_simulator_checks_fail_on_broken_simulators(broken, check, says):
    with pytest.raises(AssertionError, match=rf"\[{check.__name__}\]") as failure:
        check(broken, ACT_ID)
    assert says in str(failure.value) and "fix:" in str(failure.value)
    with pytest.raises(AssertionError, match=r"\[check_simulator_"):
        testing.check_simulator(broken, ACT_ID)


def test_every_simulator_check_has_a_broken_simulator():
    covered = {check.__name__ for _, check, _ in BROKEN_SIMULATORS}
    assert covered == {check.__name__ for check in testing.SIMULATOR_CHECKS.values()}


def test_a_simulator_that_never_gets_a_turn_is_reported():
    with pytest.raises(AssertionError, match=r"user seat never acted.*\n.*policy="):
        testing.check_simulator_batch(native_act, ACT_ID, policy=lambda obs, space, rng: 99)


def test_first_difference_points_at_the_change():
    a = {"obs": [np.zeros(3, np.float32), 1.0], "info": {"x": float("nan")}}
    b = {"obs": [np.array([0, 1, 0], np.float32), 1.0], "info": {"x": float("nan")}}
    assert first_difference(a, a) is None
    assert first_difference(a, b).startswith("['obs'][0]: array(")
    assert "int 1 != float 1.0" in first_difference([1], [1.0])
