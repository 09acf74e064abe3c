"""τ² env cost outside model calls, per domain: reset, one turn, and τ²'s evaluation at the end.

Runs the gold-replaying agent against the scripted user (no model), so every millisecond measured is
the env's own: parsing the action, τ²'s orchestrator and tools, building both JSON observations.
The episode's last step, which also runs τ²'s evaluator, is reported separately. Also prints the
one-off cost of importing τ² and loading each domain.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8, help="episodes per domain (tasks with gold actions)")
    args = parser.parse_args()

    start = time.perf_counter()
    from simpop.envs.tau2.env import Tau2Env
    from simpop.envs.tau2.simulators import GoldAgent, ScriptedUser
    print(f"import tau2: {time.perf_counter() - start:.1f} s (once per process)")

    print(f"{'domain':8s} {'load s':>7s} {'reset ms':>9s} {'turn ms':>8s} {'turns':>6s} {'final ms':>9s} "
          f"{'obs KB':>7s}")
    for domain in ("mock", "airline", "retail", "telecom"):
        start = time.perf_counter()
        env = Tau2Env(domain)
        load_s = time.perf_counter() - start
        tasks = [i for i in env.scenario_ids() if env.load_scenario(i).task.evaluation_criteria.actions]
        resets, turns, finals, obs_kb = [], [], [], []
        for task_id in tasks[:args.episodes]:
            start = time.perf_counter()
            observations, _ = env.reset(seed=0, options={"scenario_id": task_id})
            resets.append(time.perf_counter() - start)
            user = ScriptedUser(perform_gold_user_actions=domain == "telecom")
            user.reset(env.scenario, env.user_rng())
            agent = GoldAgent(env.scenario)
            while not env.done:
                seat = env.to_act
                action = agent.act(observations[seat]) if seat == env.policy_seat else user.act(observations[seat])
                start = time.perf_counter()
                observations, *_ = env.step({seat: action})
                elapsed = time.perf_counter() - start
                (finals if env.done else turns).append(elapsed)
                obs_kb.append(sum(len(o) for o in observations.values()) / 2 / 1024)
        print(f"{domain:8s} {load_s:7.2f} {1000 * statistics.mean(resets):9.1f} {1000 * statistics.median(turns):8.2f} "
              f"{len(turns):6d} {1000 * statistics.mean(finals):9.1f} {statistics.mean(obs_kb):7.1f}")
    print("turn ms: median env.step time of a non-final turn (tool call or message, both observations built);\n"
          "final ms: the last step, which runs τ²'s evaluator (it rebuilds and replays the domain database).")


if __name__ == "__main__":
    main()
