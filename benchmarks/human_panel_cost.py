"""What the human-fitted panel and the training simulator's realism index add to ``make run``, measured side by side.

In one process, for each condition of the default act-level experiment, it times (best of ``--repeats``, the order
alternating so that a shared CPU's drift hits every part alike): one GRPO update, one evaluation on the held-out and
robustness panels and the training simulator (what ``make run`` evaluated before), one evaluation on the human-fitted
panel ``p4g-act-human-v1``, and the realism index of the training simulator (once per run). It prints the projected
share of a default run (200 updates, 11 evaluations, 1 realism index)::

    (200 u + 11 (e + h) + r) / (200 u + 11 e)

and ``make run``'s projected wall time from the time it took before (``--before-s``, docs/results/collapse.md: 198 s)::

    .venv/bin/python benchmarks/human_panel_cost.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before-s", type=float, default=198.0, help="make run's experiment time without the panel")
    args = parser.parse_args()

    import torch

    from simpop.envs.registration import make
    from simpop.evaluation.panel import evaluate
    from simpop.experiments.collapse import training_realism
    from simpop.experiments.conditions import CONDITIONS, CollapseConfig, build_panel, build_trainer, evaluate_run

    torch.set_num_threads(1)
    config = CollapseConfig()
    episodes, kwargs = config.eval_episodes, config.env_kwargs()

    def timed_parts(trainer, heldout, robust, human):  # the parts of one condition, bound to its objects
        return {
            "update": lambda: trainer.step(),
            "before": lambda: (evaluate_run(config.env_id, trainer, heldout, episodes, 1, kwargs),
                               evaluate(config.env_id, trainer.policy, robust, episodes, 1, kwargs)),
            "human": lambda: evaluate(config.env_id, trainer.policy, human, episodes, 1, kwargs),
            "realism": lambda: training_realism(trainer.training_simulator, 1),
        }

    shares = []
    for condition in CONDITIONS:
        env = make(config.env_id, **config.env_kwargs())
        trainer = build_trainer(condition, config, 0, env)
        heldout, robust, human = (build_panel(config, env, name=n) for n in ("heldout", "robust", "human"))
        trainer.step()  # warm-up
        parts = timed_parts(trainer, heldout, robust, human)
        best = {name: float("inf") for name in parts}
        for repeat in range(args.repeats):
            for name in (list(parts) if repeat % 2 == 0 else list(reversed(parts))):
                start = time.perf_counter()
                parts[name]()
                best[name] = min(best[name], time.perf_counter() - start)
        u, e, h, r = best["update"], best["before"], best["human"], best["realism"]
        share = (200 * u + 11 * (e + h) + r) / (200 * u + 11 * e)
        shares.append(share)
        print(f"{condition:>10}: update {u * 1e3:6.1f} ms, evaluation before {e:5.2f} s, human-fitted panel "
              f"{h:5.2f} s, realism index {r:5.2f} s -> a run takes {share:.2f}x as long")
    mean = sum(shares) / len(shares)
    print(f"mean over conditions: {mean:.2f}x; make run's experiment: {args.before_s:.0f} s -> "
          f"~{args.before_s * mean:.0f} s")


if __name__ == "__main__":
    main()
