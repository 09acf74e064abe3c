"""TorchRL trains both seats of simpop/PersuasionAct-v0 (simpop.integrations.torchrl_marl): learning curves and
frozen-opponent checks, with the CPU and wall time they took.

Printed per iteration: the user seat's realism reward (mean log-probability of its replies under the reference
persuadee) and the policy seat's success in the batch (against the co-trained user). After training, on 300 fixed
seeds, the decision rules of ``tests/integrations/test_torchrl_marl.py``: the trained persuader (sampled) against a
uniformly random one, both facing the frozen final user (and, for reference, the reference persuadee itself); the
trained user's ``KL(user || reference)`` per turn against a uniformly random user's, both facing a random persuader.
A seat learned if its gain exceeds 2 standard errors. ``--iterations`` (default 30) and ``--seed`` set the run;
one torch thread.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from simpop.integrations.marl_ppo import gain
from simpop.integrations.torchrl_marl import MarlConfig, evaluate, train_both_seats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = MarlConfig(iterations=args.iterations, seed=args.seed)
    wall, cpu = time.perf_counter(), time.process_time()
    trained = train_both_seats(config, log=lambda line: None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print("iteration  user_realism  policy_success  episode_steps")
    for record in trained.history:
        print(f"{int(record['iteration']):9d}  {record['user_realism']:12.3f}  {record['policy_success']:14.3f}  "
              f"{record['episode_steps']:13.1f}")
    realism = [r["user_realism"] for r in trained.history]
    print(f"training (seed {args.seed}): {args.iterations} iterations x {config.frames_per_batch} frames in "
          f"{cpu:.1f} s CPU ({wall:.1f} s wall)")
    print(f"user realism: first {realism[0]:.3f} -> last five {np.mean(realism[-5:]):.3f}")
    user, persuader = trained.policies["persuadee"], trained.policies["persuader"]
    for name, opponent in (("frozen final user", user), ("reference persuadee", "persuadee")):
        learned, random = evaluate(persuader, opponent, config).success, evaluate(None, opponent, config).success
        print(f"policy seat vs {name}: trained {learned.mean():.3f}, random {random.mean():.3f}, "
              f"gain {gain(learned, random)}")
    uniform, trained_user = evaluate(None, None, config).user_kl, evaluate(None, user, config).user_kl
    print(f"user seat KL(user || reference) per turn: uniform {uniform.mean():.3f}, trained {trained_user.mean():.3f}, "
          f"gain {gain(uniform, trained_user)}")


if __name__ == "__main__":
    main()
