"""Issue 14 acceptance: simpop's scores of τ²-mock trajectories are τ²'s own.

The same trajectories (the gold agent and a deliberately wrong agent, against the scripted user, several
trials per task) are scored by the env's reward, by τ²'s ``evaluate_simulation`` on τ²'s own "mock"
domain (a fresh load, not simpop's cache), and by τ²'s ``evaluate_trajectories`` tool re-scoring the
results file simpop wrote; all per-episode rewards agree, and pass^k from the file by τ²'s
``compute_metrics`` equals :func:`~simpop.envs.tau2.results.pass_hat_k` and a hand computation.
"""

from __future__ import annotations

import json
from fractions import Fraction
from math import comb

import pytest
from tau2.data_model.simulation import Results
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.metrics.agent_metrics import compute_metrics
from tau2.run import get_tasks
from tau2.scripts.evaluate_trajectories import compute_simulation_rewards

from simpop.envs.tau2.env import Tau2Env
from simpop.envs.tau2.results import pass_hat_k, write_tau2_results
from simpop.envs.tau2.simulators import GoldAgent, ScriptedUser
from simpop.envs.wrappers import UserSeat

TRIALS = 3


class WrongAgent(GoldAgent):
    """The gold agent with the string arguments of its tool calls corrupted (ids too, when ``ids``)."""

    ids = False

    def __init__(self, scenario):
        super().__init__(scenario)
        self.actions = [(name, {k: f"{v}-wrong" if isinstance(v, str) and (self.ids or not k.endswith("_id")) else v
                                for k, v in args.items()}) for name, args in self.actions]


class WrongIdsAgent(WrongAgent):
    ids = True


def agent_for(task_index: int, trial: int) -> type[GoldAgent]:
    """Gold or wrong by (task, trial), so that tasks differ in how many of their trials succeed."""
    return WrongAgent if (task_index + trial) % 3 == 0 else GoldAgent


@pytest.fixture(scope="module")
def played():
    """Every mock task, TRIALS trials each: (task, trial) -> (agent class, env reward, SimulationRun)."""
    env = Tau2Env("mock")
    seat = UserSeat(env, ScriptedUser())
    out = {}
    for trial in range(TRIALS):
        for index, task_id in enumerate(env.scenario_ids()):
            obs, _ = seat.reset(seed=100 * trial + index, options={"scenario_id": task_id})
            agent_class = agent_for(index, trial)
            agent, done = agent_class(env.scenario), False
            while not done:
                obs, reward, terminated, truncated, info = seat.step(agent.act(obs))
                done = terminated or truncated
            assert terminated and info["reward"] == reward
            out[task_id, trial] = (agent_class, reward, env.simulation_run(trial))
    return out


def test_env_rewards_are_taus_evaluate_simulation_on_taus_own_domain(played):
    tasks = {t.id: t for t in get_tasks("mock")}  # τ²'s own load of the tasks
    for (task_id, trial), (_, reward, run) in played.items():
        reference = evaluate_simulation(simulation=run, task=tasks[task_id], evaluation_type=EvaluationType.ALL,
                                        solo_mode=False, domain="mock")
        assert reward == reference.reward, (task_id, trial)
    # The wrong agent really fails where the task checks the database, and the gold agent passes there.
    for task_id in ("create_task_1", "update_task_1", "update_task_with_message_history"):
        rewards = {agent: r for (t, _), (agent, r, _) in played.items() if t == task_id}
        assert rewards == {GoldAgent: 1.0, WrongAgent: 0.0}, task_id


def test_taus_tooling_rescores_simpops_results_file_to_the_same_rewards_and_pass_hat_k(tmp_path, played):
    path = tmp_path / "mock.json"
    write_tau2_results(path, "mock", [run for _, _, run in played.values()], agent="gold-or-wrong", user="scripted",
                       num_trials=TRIALS)
    results = Results.load(path)
    rescored = compute_simulation_rewards(results)  # τ²'s evaluate_trajectories: its evaluator, its domain
    assert {(s.task_id, s.trial): s.reward_info.reward for s in rescored.simulations} == \
        {key: reward for key, (_, reward, _) in played.items()}
    successes: dict[str, list[bool]] = {}
    for (task_id, _), (_, reward, _) in played.items():
        successes.setdefault(task_id, []).append(reward == 1.0)
    assert len({sum(v) for v in successes.values()}) >= 2  # tasks differ in successes: pass^k is not trivial
    metrics = compute_metrics(rescored)
    assert sorted(metrics.pass_hat_ks) == list(range(1, TRIALS + 1))
    for k in range(1, TRIALS + 1):
        by_hand = sum(Fraction(comb(sum(v), k), comb(len(v), k)) for v in successes.values()) / len(successes)
        assert pass_hat_k(successes, k) == pytest.approx(float(by_hand), abs=1e-12)
        assert metrics.pass_hat_ks[k] == pytest.approx(pass_hat_k(successes, k), abs=1e-12)
    json.loads(path.read_text())  # plain JSON, as τ² writes it


def test_a_trajectory_taus_evaluator_raises_on_scores_0_as_taus_skipped_samples_do():
    # The task asserts task_2's status; with a wrong user id the agent never creates task_2 and τ²'s env
    # assertion raises. τ²'s run then fails, or with skip_failed_samples records reward 0: simpop scores 0.
    env = Tau2Env("mock")
    seat = UserSeat(env, ScriptedUser())
    obs, _ = seat.reset(seed=0, options={"scenario_id": "create_task_1_with_env_assertions"})
    agent, done = WrongIdsAgent(env.scenario), False
    while not done:
        obs, reward, terminated, truncated, info = seat.step(agent.act(obs))
        done = terminated or truncated
    run = env.simulation_run(0)
    with pytest.raises(ValueError, match="Task task_2 not found"):
        evaluate_simulation(simulation=run, task=env.scenario.task, evaluation_type=EvaluationType.ALL,
                            solo_mode=False, domain="mock")
    assert reward == 0.0 and info["evaluation_error"] == "ValueError: Task task_2 not found"
    assert run.reward_info.reward == 0.0 and run.reward_info.info == {"evaluation_error": info["evaluation_error"]}
    assert run.messages and run.termination_reason.value == "user_stop"
