"""The env's reward is τ²'s own evaluator's reward on the same trajectory.

A scripted agent replays each task's gold actions against the scripted user; τ²'s
``evaluate_simulation``, with τ²'s own domain constructor (a fresh load, not simpop's cache), scores
the env's trajectory; the two rewards must be equal. Every mock task with gold actions and a spread
of airline, retail and telecom tasks run here; ``benchmarks/tau2_gold_replay.py`` runs them all.
"""

from __future__ import annotations

import pytest
from tau2.data_model.simulation import SimulationRun
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

from simpop.envs.tau2.env import Tau2Env
from simpop.envs.tau2.simulators import ScriptedUser, play_gold
from simpop.envs.wrappers import UserSeat

#: Every k-th task with gold actions, per domain (mock: all).
STRIDE = {"mock": 1, "airline": 11, "retail": 28, "telecom": 30, "telecom-workflow": 60}


def gold_tasks(env: Tau2Env, stride: int) -> list[str]:
    ids = [i for i in env.scenario_ids() if (env.load_scenario(i).task.evaluation_criteria.actions or [])]
    return ids[::stride]


@pytest.mark.parametrize("domain", list(STRIDE))
def test_env_reward_equals_tau2_evaluator_on_the_same_trajectory(domain):
    env = Tau2Env(domain)
    # Telecom's gold actions include the user's device actions, which the scripted user then makes.
    seat = UserSeat(env, ScriptedUser(perform_gold_user_actions=domain.startswith("telecom")))
    rewards = []
    for task_id in gold_tasks(env, STRIDE[domain]):
        reward, terminated, info = play_gold(seat, task_id)
        assert terminated and info["termination_reason"] == "user_stop"
        run = SimulationRun(id=task_id, task_id=task_id, start_time="", end_time="", duration=0.0,
                            termination_reason=info["termination_reason"], messages=env.trajectory())
        reference = evaluate_simulation(simulation=run, task=env.scenario.task, evaluation_type=EvaluationType.ALL,
                                        solo_mode=False, domain=domain)
        assert reward == info["reward"] == reference.reward, task_id
        assert info["reward_breakdown"] == {k.value: v for k, v in reference.reward_breakdown.items()}
        rewards.append(reward)
    assert len(rewards) >= 2
    if not domain.startswith("telecom"):  # replaying the gold actions solves these domains' tasks
        assert rewards == [1.0] * len(rewards)


def test_the_reference_agent_solves_every_mock_task_but_the_ones_it_names():
    """``--policy reference`` is the ceiling on every task except those ``gold_unreachable`` names, which the
    panel card lists with the reason."""
    from simpop.envs.tau2.simulators import gold_unreachable
    from simpop.evaluation.panels import named_panels

    env = Tau2Env("mock")
    seat = UserSeat(env, ScriptedUser())
    unreachable = []
    for task_id in env.scenario_ids():
        reward, terminated, _ = play_gold(seat, task_id)
        why = gold_unreachable(env.scenario.task)
        assert terminated and reward == (0.0 if why else 1.0), (task_id, why)
        unreachable += [task_id] * bool(why)
    assert unreachable == ["update_task_with_history_and_env_assertions"]
    card = " ".join(named_panels()["tau2-mock-v1"].split())
    assert all(task_id in card for task_id in unreachable) and "only an environment assertion" in card
