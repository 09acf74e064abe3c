"""Issue 18 item 7: one simulator object shared by several single-agent views (vectorised envs); a spec or a
factory gives each view its own."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

import simpop.envs  # noqa: F401  (registers the ids)
from simpop.envs.wrappers import SharedSimulatorError, UserSeat
from simpop.envs.persuasion.simulators import ActPersuadee
from simpop.envs.registration import make
from simpop.simulators.registry import build_simulator

ENV = "simpop/PersuasionAct-v0"
SEEDS = (1, 2)
ACTIONS = [(t % 5, (t + 2) % 5) for t in range(12)]
ACT_ENV = make(ENV)


USERS = ["persuadee?decoding=greedy&personas=modal", "persuadee?temperature=0.8", "persuadee?temperature=1.2"]


def users():
    """The README's population (stochastic members, so a clobbered slot shows in the trajectories)."""
    return build_simulator(USERS, env=ACT_ENV)


def alone(i: int, env=None) -> list[tuple]:
    """Env i's first episode played alone (default: with its own simulator): (obs, reward, terminated) per step."""
    env = gymnasium.make(ENV, simulator=users()) if env is None else env
    obs, _ = env.reset(seed=SEEDS[i])
    out = [(obs, 0.0, False)]
    for actions in ACTIONS:
        obs, reward, terminated, truncated, _ = env.step(actions[i])
        out.append((obs, reward, terminated or truncated))
        if terminated or truncated:
            break
    return out


def vectorised(vec) -> list[list[tuple]]:
    """Each env's first episode inside ``vec`` (a Gymnasium vector env)."""
    obs, _ = vec.reset(seed=list(SEEDS))
    out = [[(obs[i], 0.0, False)] for i in range(2)]
    for actions in ACTIONS:
        obs, rewards, terminated, truncated, _ = vec.step(np.array(actions))
        for i in range(2):
            if not out[i][-1][2]:
                out[i].append((obs[i], float(rewards[i]), bool(terminated[i] or truncated[i])))
    return out


def same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x[0], y[0]) and x[1] == y[1] and x[2] == y[2] for x, y in zip(a, b))


def test_readme_pattern_with_one_shared_simulator_is_a_clear_error():
    vec = gymnasium.make_vec(ENV, num_envs=2, vectorization_mode="sync", simulator=users())
    vec.reset(seed=list(SEEDS))
    with pytest.raises(SharedSimulatorError, match="shared by several envs.*factory"):
        vec.step(np.array(ACTIONS[0]))


def test_stable_baselines3_vec_env_with_one_shared_simulator_is_a_clear_error():
    shared = users()
    vec = DummyVecEnv([lambda: gymnasium.make(ENV, simulator=shared) for _ in range(2)])
    vec.reset()
    with pytest.raises(SharedSimulatorError, match="shared by several envs"):
        vec.step(np.array(ACTIONS[0]))


def test_a_factory_gives_each_env_its_own_simulator_and_the_trajectories_of_envs_played_alone():
    vec = gymnasium.make_vec(ENV, num_envs=2, vectorization_mode="sync", simulator=users)
    simulators = [env.unwrapped.simulator for env in vec.envs]
    assert simulators[0] is not simulators[1]
    got = vectorised(vec)
    for i in range(2):
        assert len(got[i]) > 2 and same(got[i], alone(i))


def test_a_spec_gives_each_env_its_own_simulator_and_the_trajectories_of_envs_played_alone():
    vec = gymnasium.make_vec(ENV, num_envs=2, vectorization_mode="sync", simulator=USERS)
    simulators = [env.unwrapped.simulator for env in vec.envs]
    assert simulators[0] is not simulators[1] and all(type(s).__name__ == "Population" for s in simulators)
    got = vectorised(vec)
    for i in range(2):
        assert len(got[i]) > 2 and same(got[i], alone(i))
    one = gymnasium.make(ENV, simulator="persuadee?temperature=0.8").unwrapped.simulator
    assert isinstance(one, ActPersuadee) and one.temperature == 0.8
    weighted = gymnasium.make(ENV, simulator={USERS[0]: 3.0, USERS[1]: 1.0}).unwrapped.simulator
    assert [m.name for m in weighted.members] == USERS[:2] and weighted._weights() == [3.0, 1.0]


def test_without_the_guard_the_shared_simulator_would_give_wrong_trajectories():
    """What the error prevents: the same shared simulator stepped through the bare views diverges."""
    class Unguarded(UserSeat):
        def step(self, action):
            self._claim = None  # the check off: what UserSeat did before it had one
            return super().step(action)

    shared = users()
    vec = gymnasium.vector.SyncVectorEnv([lambda: Unguarded(make(ENV), shared) for _ in range(2)])
    got = vectorised(vec)
    assert not all(same(got[i], alone(i)) for i in range(2))


def test_one_simulator_used_by_views_one_after_another_is_fine():
    shared = users()
    first, second = gymnasium.make(ENV, simulator=shared), gymnasium.make(ENV, simulator=shared)
    for i, env in enumerate((first, second)):
        assert same(alone(i, env), alone(i))


def test_interleaved_views_raise_until_reset():
    shared = ActPersuadee()
    a, b = gymnasium.make(ENV, simulator=shared), gymnasium.make(ENV, simulator=shared)
    a.reset(seed=0)
    a.step(0)
    b.reset(seed=1)   # b takes the simulator's state over in the middle of a's episode
    b.step(0)
    with pytest.raises(SharedSimulatorError, match="ActPersuadee"):
        a.step(1)
    a.reset(seed=2)   # a's new episode owns it again; now b is the one whose state is gone
    a.step(1)
    with pytest.raises(SharedSimulatorError):
        b.step(1)


def test_a_class_is_a_factory_and_a_bad_factory_is_refused():
    env = gymnasium.make(ENV, simulator=ActPersuadee)
    assert isinstance(env.unwrapped.simulator, ActPersuadee)
    with pytest.raises(TypeError, match="not a simulator"):
        gymnasium.make(ENV, simulator=lambda: 42)
