"""For every τ² task with gold actions: does the env's reward equal τ²'s own evaluator's on the same trajectory?

A scripted agent replays each task's gold actions against the scripted user (telecom: the user also
makes the gold device actions). τ²'s ``evaluate_simulation``, with τ²'s own domain constructor (a
fresh load, not simpop's cache), scores the env's trajectory. Prints, per domain, the number of
tasks, how many rewards match exactly, and how many replays score 1.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domains", nargs="+", default=["mock", "airline", "retail", "telecom"])
    args = parser.parse_args()

    # simpop's τ² module first: it stops litellm's cost-map download before τ² imports litellm.
    from simpop.envs.tau2.env import Tau2Env
    from simpop.envs.tau2.simulators import ScriptedUser, play_gold
    from simpop.envs.wrappers import UserSeat
    from tau2.data_model.simulation import SimulationRun
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    print(f"{'domain':8s} {'tasks':>6s} {'match':>6s} {'reward 1':>9s} {'seconds':>8s}")
    for domain in args.domains:
        start = time.perf_counter()
        env = Tau2Env(domain)
        seat = UserSeat(env, ScriptedUser(perform_gold_user_actions=domain == "telecom"))
        tasks = matches = solved = 0
        for task_id in env.scenario_ids():
            if not env.load_scenario(task_id).task.evaluation_criteria.actions:
                continue
            reward, terminated, info = play_gold(seat, task_id)
            run = SimulationRun(id=task_id, task_id=task_id, start_time="", end_time="", duration=0.0,
                                termination_reason=info["termination_reason"], messages=env.trajectory())
            reference = evaluate_simulation(simulation=run, task=env.scenario.task,
                                            evaluation_type=EvaluationType.ALL, solo_mode=False, domain=domain)
            tasks += 1
            matches += reward == reference.reward
            solved += reward == 1.0
            if reward != reference.reward:
                print(f"  MISMATCH {domain} {task_id}: env {reward} vs τ² {reference.reward}")
        print(f"{domain:8s} {tasks:6d} {matches:6d} {solved:9d} {time.perf_counter() - start:8.1f}")


if __name__ == "__main__":
    main()
