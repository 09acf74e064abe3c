"""TorchRL trains both seats of simpop/PersuasionAct-v0 (simpop.integrations.torchrl_marl): learning curves and
frozen-opponent checks, with the CPU and wall time they took.

Printed per iteration: the user seat's realism reward (mean log-probability of its replies under the reference
persuadee) and the policy seat's success in the batch (against the co-trained user). After training, the trained
persuader (sampled) and a uniformly random one play 300 fixed seeds against the frozen final user and against the
reference persuadee itself. ``--iterations`` (default 60) sets the length; one torch thread.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from simpop.integrations.torchrl_marl import MarlConfig, success_rate, train_both_seats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = MarlConfig(iterations=args.iterations, seed=args.seed)
    wall, cpu = time.perf_counter(), time.process_time()
    trained = train_both_seats(config, log=lambda line: None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print("iteration  user_realism  policy_success")
    for record in trained.history:
        print(f"{int(record['iteration']):9d}  {record['user_realism']:12.3f}  {record['policy_success']:14.3f}")
    realism = [r["user_realism"] for r in trained.history]
    success = np.convolve([r["policy_success"] for r in trained.history], np.ones(5) / 5, "valid")
    print(f"training: {args.iterations} iterations x {config.frames_per_batch} frames in {cpu:.1f} s CPU "
          f"({wall:.1f} s wall)")
    print(f"user realism: first {realism[0]:.3f} -> last five {np.mean(realism[-5:]):.3f}")
    print(f"policy success in batches (5-iteration mean): lowest {success.min():.3f} -> last {success[-1]:.3f}")
    user, persuader = trained.policies["persuadee"], trained.policies["persuader"]
    for name, opponent in (("frozen final user", user), ("reference persuadee", "persuadee")):
        learned, random = success_rate(persuader, opponent, config), success_rate(None, opponent, config)
        print(f"vs {name}: trained persuader {learned:.3f}, random persuader {random:.3f} "
              f"(ratio {learned / max(random, 1e-9):.2f})")


if __name__ == "__main__":
    main()
