"""CooperBench rollouts with and without reusing verdicts (``Evaluator(reuse_verdicts=...)``), side by side.

GRPO collects groups of dialogues per scenario; on CooperBench-mini with the native teammate and a persuader-free
policy that says hello and submits nothing, every dialogue of a group ends in the same pair of patches, which is
where an untrained policy spends its first updates. The script times ``RolloutEngine.collect`` over the same
scenarios with the store on and off (alternating, after one warm-up each) and prints the ratio.

    python benchmarks/cooperbench_verdicts.py [--groups 2] [--group-size 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import time

import simpop
from simpop.envs.cooperbench import evaluator
from simpop.envs.cooperbench.simulators import default_teammate
from simpop.rollout import RolloutEngine
from simpop.seat import Player

ENV_ID = "simpop/CooperBench-mini-v0"


class HelloThenSubmit(Player):
    """The policy seat: one message, then submit (an untrained policy's typical dialogue)."""

    def act_batch(self, observations, slots):
        return [json.dumps({"type": "submit"}) if json.loads(o)["messages"] else
                json.dumps({"type": "message", "text": "I'll take feature 1."}) for o in observations]


def collect_seconds(reuse: bool, groups: int, group_size: int) -> float:
    """Wall seconds of one collect of ``groups`` x ``group_size`` dialogues."""
    evaluator.VERDICTS.clear()

    def make_env():
        env = simpop.make(ENV_ID)
        env.evaluator.reuse_verdicts = reuse
        return env

    engine = RolloutEngine(make_env, HelloThenSubmit(), default_teammate(make_env()))
    start = time.perf_counter()
    engine.collect(engine.scenario_ids()[:groups], group_size=group_size, seed=0)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    times: dict[bool, list[float]] = {True: [], False: []}
    for reuse in (True, False):
        collect_seconds(reuse, 1, 2)  # warm-up: the base repositories and the interpreter check
    for _ in range(args.repeats):
        for reuse in (False, True):
            times[reuse].append(collect_seconds(reuse, args.groups, args.group_size))
    off, on = min(times[False]), min(times[True])
    print(f"{args.groups} groups x {args.group_size} dialogues: {off:.1f} s without reuse, {on:.1f} s with it "
          f"({off / on:.2f}x)")


if __name__ == "__main__":
    main()
