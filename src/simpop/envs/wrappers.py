"""Single-agent views of dialogue envs: bind a simulator (or population) to the user seat.

``UserSeat(env, simulator)`` is a ``gymnasium.Env`` for the policy seat: every time the user seat is
to act, the simulator answers, so any single-agent trainer (simpop's, Stable-Baselines3, TRL) can
train against a population without knowing it is there.

**One owner per simulator state.** A simulator keeps its dialogue state in slots and ``UserSeat`` plays slot
0, so several views holding one simulator object (``gymnasium.make_vec(id, num_envs=2,
vectorization_mode="sync", simulator=users)``, or Stable-Baselines3's ``make_vec_env`` with
``env_kwargs={"simulator": users}``) would share that slot: one view's reset overwrites the state of the
dialogue another is in the middle of, and its trajectories go silently wrong. Copying the simulator per view
is not right in general (an LLM simulator holds its model, a trainable one the parameters a co-trainer
updates, a population the failure rates its sampling rule reads), and the simulator contract has no reset of
one slot. So ``simulator=`` may be a *spec* (each view builds its own: ``gymnasium.make_vec(id, num_envs=2,
simulator="persuadee?temperature=0.8")``) or a *factory* (a class or a zero-argument callable) that each view
calls and owns what it returns (``vectorization_mode="async"`` pickles the simulator into each worker, a copy
each as well).
One simulator object used by several views is fine while their episodes do not interleave; a view about to
act in a dialogue whose simulator another view has reset since raises :class:`SharedSimulatorError` (naming
the simulator and the fix) instead of returning a wrong step.
"""


from __future__ import annotations

import itertools
import weakref
from typing import Any

import gymnasium

from simpop.envs.dialogue import DialogueEnv
from simpop.envs.registration import load, make, spec
from simpop.seat import Simulator, SimulatorSpec, expected_success

#: What builds a simulator from a spec passed to ``gymnasium.make`` (an entry point, imported only when a spec is
#: given: envs sit below the simulator registry).
SPEC_BUILDER = "simpop.simulators.registry:build_simulator"
#: ``id(simulator)`` -> the claim of the view that reset it last (entries go when the simulator does).
_CLAIMS: dict[int, int] = {}
_NEXT_CLAIM = itertools.count(1)


class SharedSimulatorError(RuntimeError):
    """A simulator object is shared by several single-agent views whose episodes interleave."""


class UnsupportedRenderMode(TypeError, ValueError):
    """A ``render_mode`` the env does not have (e.g. ``rgb_array``: dialogue envs render text).

    A ``TypeError`` as well, so that callers that try a render mode and fall back without it when the env
    refuses it (Stable-Baselines3's ``make_vec_env`` asks for ``rgb_array``) do so.
    """


class UserSeat(gymnasium.Env):
    """The policy seat of ``env`` as a Gymnasium env, with ``simulator`` in the user seat.

    Rewards the policy seat receives during the simulator's turns are added to the step's reward. When the
    episode ends, a simulator that knows how likely its decision made success
    (:meth:`~simpop.seat.Simulator.success_probability`) has it reported as ``info["expected_success"]``.
    The simulator's random generator comes from the env's reset seed, so a seeded reset makes the
    whole episode reproducible.
    """

    def __init__(self, env: DialogueEnv, simulator: Simulator):
        self.env = env
        self.simulator = simulator
        self.seat = env.policy_seat
        self.observation_space = env.observation_space(self.seat)
        self.action_space = env.action_space(self.seat)
        self.metadata = dict(env.metadata)
        self.render_mode = env.render_mode
        self._return = 0.0
        self._claim: int | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Reset the env and start the simulator's dialogue in slot 0; returns the policy seat's observation and info.
        """
        super().reset(seed=seed)
        self._claim = _claim(self.simulator)  # before the reset: a failed reset has touched the state too
        observations, infos = self.env.reset(seed=seed, options=options)
        self._return = 0.0
        self.simulator.reset(self.env.scenario, self.env.user_rng())
        obs, reward, terminated, truncated, info = self._advance(observations, infos)
        if terminated or truncated:
            raise RuntimeError("the episode ended before the policy seat acted once")
        return obs, info

    def step(self, action: Any):
        """Apply the policy's action, then let the simulator act until it is the policy's turn again.

        Returns:
            Gymnasium's observation, reward (summed over the simulator's turns), terminated, truncated, info.

        Raises:
            RuntimeError: The episode has ended.
            SharedSimulatorError: Another view stepped the same simulator in between.
        """
        if self.env.done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        if self._claim is not None and _CLAIMS.get(id(self.simulator)) != self._claim:
            raise SharedSimulatorError(
                f"simulator {getattr(self.simulator, 'name', '?')!r} ({type(self.simulator).__name__}) is shared by "
                f"several envs: another env reset it after this one did, so the dialogue state this step needs now "
                f"belongs to that env's episode. Give each env its own simulator: pass its spec or a factory, e.g. "
                f"gymnasium.make_vec(id, num_envs=N, simulator='persuadee?temperature=0.8') (or "
                f"env_kwargs={{'simulator': spec_or_factory}} for Stable-Baselines3's make_vec_env), or reset this "
                f"env before stepping it again")
        observations, rewards, terminations, truncations, infos = self.env.step({self.seat: action})
        self._return += rewards[self.seat]
        obs, extra, terminated, truncated, info = self._advance(
            observations, infos, terminations[self.seat], truncations[self.seat])
        return obs, float(rewards[self.seat] + extra), terminated, truncated, info

    def _advance(self, observations, infos, terminated: bool = False, truncated: bool = False):
        """Let the simulator act until the policy seat is to act or the episode ends."""
        user = self.env.user_seat
        reward = 0.0
        while not (terminated or truncated) and self.env.to_act == user:
            action = self.simulator.act(observations[user])
            observations, rewards, terminations, truncations, infos = self.env.step({user: action})
            reward += rewards[self.seat]
            terminated, truncated = terminations[self.seat], truncations[self.seat]
        self._return += reward
        info = infos[self.seat]
        if terminated or truncated:
            self.simulator.feedback([0], [self._return])
            if (expected := expected_success(self.simulator, 0)) is not None:
                info = {**info, "expected_success": expected}
        return observations[self.seat], reward, terminated, truncated, info

    def render(self):
        """The env's rendering of the transcript."""
        return self.env.render()

    def close(self) -> None:
        """Close the env."""
        self.env.close()


def make_user_seat(env_id: str, simulator: Any = None, **kwargs: Any) -> UserSeat:
    """Gymnasium entry point: the registered env's policy seat, with ``simulator`` in the user seat.

    ``simulator`` is a simulator; a factory (a class or a zero-argument callable, called once per view); a spec
    (``"persuadee?temperature=0.8"``, a list of specs: a uniform population, ``{spec: weight}``, or a population
    mapping), built for this view's env, so that ``gymnasium.make_vec`` gives each env its own (an LLM spec loads
    its model once per env: pass a factory to share one); or None, the env's native simulator.

    Raises:
        TypeError: ``simulator`` is none of these, or a factory returned something else.
        ValueError: A spec that does not build (the message names what is wrong in it).
        UnsupportedRenderMode: ``render_mode`` is not one of the env's (``ansi``, ``human``).
    """
    render_mode = kwargs.get("render_mode")
    modes = getattr(load(spec(env_id).entry_point), "metadata", {}).get("render_modes", [])
    if render_mode is not None and render_mode not in modes:
        raise UnsupportedRenderMode(f"{env_id} does not support render_mode={render_mode!r}; its render modes are "
                                    f"{modes} (dialogue envs render text), or None")
    from_spec = isinstance(simulator, (str, SimulatorSpec, list, tuple, dict))
    if simulator is not None and not from_spec and not callable(simulator) and not (
            hasattr(simulator, "reset") and hasattr(simulator, "act")):
        raise TypeError(f"simulator must be a Simulator, a factory returning one or a spec, got {simulator!r}")
    env = make(env_id, **kwargs)
    if from_spec:
        simulator = load(SPEC_BUILDER)(simulator, env=env)
    elif simulator is not None and not isinstance(simulator, Simulator) and callable(simulator):
        factory, simulator = simulator, simulator()
        if not (hasattr(simulator, "reset") and hasattr(simulator, "act")):
            raise TypeError(f"simulator factory {factory!r} returned {simulator!r}, not a simulator")
    if simulator is None:
        factory = spec(env_id).default_simulator
        if factory is None:
            raise ValueError(f"{env_id} has no native simulator; pass simulator=... to gymnasium.make")
        simulator = load(factory)(env)
    return UserSeat(env, simulator)


def _claim(simulator: Any) -> int:
    """A new claim on ``simulator``'s state: the view holding the newest one may step."""
    key = id(simulator)
    if key not in _CLAIMS:
        try:
            weakref.finalize(simulator, _CLAIMS.pop, key, None)
        except TypeError:  # not weak-referenceable: the entry stays (one int per such simulator)
            pass
    _CLAIMS[key] = claim = next(_NEXT_CLAIM)
    return claim
