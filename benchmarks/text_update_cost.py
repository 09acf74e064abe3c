"""What one text-level update of the collapse experiment costs per condition, in process, and the floor that puts
under the text preset repeated over seeds (issue 29, goal 2).

For each condition it builds the trainer exactly as ``simpop experiment collapse --level text`` does (the preset's
settings: SmolLM2 with LoRA, 4 x 4 dialogues, 2 persuader turns) and times ``--updates`` updates, splitting each
into the rollout (``rollout_s``: generation and env), the policy's update (``update_s``: its forward and backward
passes in torch) and the rest of the step (the co-trained simulators' scoring, backward and optimiser steps).
Generation could move to a server; the updates stay in torch, so ``updates x (policy update + simulator update)``
is a floor on any run of ``--seeds`` x ``--preset-updates`` that no generator can lower (evaluations not counted)::

    nice -n 19 .venv/bin/python benchmarks/text_update_cost.py [--conditions frozen cotrain] [--updates 2]
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conditions", nargs="+", default=["frozen", "cotrain"])
    parser.add_argument("--updates", type=int, default=2, help="updates timed per condition (the last counts)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the run the floor is for")
    parser.add_argument("--preset-updates", type=int, default=32, help="updates per run of the run the floor is for")
    parser.add_argument("--budget-min", type=float, default=90.0, help="the goal the floor is compared with")
    args = parser.parse_args()

    import torch

    from simpop.envs.registration import make
    from simpop.experiments.conditions import CollapseConfig, build_trainer, simulator_backends

    config = CollapseConfig(level="text", conditions=tuple(args.conditions))
    env = make(config.env_id, **config.env_kwargs())
    backends = simulator_backends(config)
    print(f"text-level updates in process, {args.updates} per condition (the last counts); load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'condition':<12} {'update':>7} {'step s':>7} {'rollout s':>9} {'policy s':>8} {'simulators s':>12}")
    floor = 0.0
    for condition in args.conditions:
        torch.manual_seed(0)
        trainer = build_trainer(condition, config, 0, env, backends)
        for i in range(args.updates):
            start = time.perf_counter()
            metrics = trainer.step()
            step = time.perf_counter() - start
            rollout, policy = metrics["rollout_s"], metrics["update_s"]
            print(f"{condition:<12} {i:7d} {step:7.1f} {rollout:9.1f} {policy:8.1f} {step - rollout - policy:12.1f}",
                  flush=True)
        floor += args.seeds * args.preset_updates * (step - rollout)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"floor of {args.seeds} seeds x {args.preset_updates} updates of {', '.join(args.conditions)} (torch side "
          f"only): {floor / 60:.0f} min, {floor / 60 / args.budget_min:.2f}x the {args.budget_min:g}-minute goal")


if __name__ == "__main__":
    main()
