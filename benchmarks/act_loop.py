"""Act-level updates/s of the collapse experiment: this checkout vs another tree (e.g. HEAD), one run.

Each measurement is a child process with its own ``PYTHONPATH`` (``<tree>/src``) that builds one condition's
trainer exactly as ``simpop experiment collapse --level act`` does (:func:`~simpop.experiments.collapse.build_trainer`,
default act-level settings: 8 x 8 dialogues of 10 persuader turns, one torch thread), runs one warm-up
update, then times ``--updates`` updates. The two trees alternate ``--repeats`` times (a shared CPU drifts)
and the best rate of each is reported with the ratio. The children also print a digest of every update's
training success, policy loss and simulator loss: equal digests mean the two trees trained identically.
It also times whole runs, as ``make run`` runs each (condition, seed): 200 updates and 11 evaluations on the panels
(:func:`~simpop.experiments.collapse.run_one`), each tree in a child process, alternating, with a digest of each
run's ``metrics.jsonl`` (timings left out): equal digests mean the same run. ``--run-baseline`` names that
comparison's own baseline (default: the revision before this section was added), ``--runs 0`` skips it.
And it times one wave of persuadee replies in this checkout, a call per dialogue vs one batched call.

The table gives each tree's milliseconds per update too (the goal of issue 29: <= 8 ms at 64 dialogues, on
a quiet machine) and the load average before and after: on a shared machine, read the ratio.

The baseline is a git revision (checked out into a temporary worktree; default: the commit before the act
env was stepped as arrays, :class:`~simpop.envs.persuasion.act_wave.ActWave`) or a simpop tree::

    nice -n 19 .venv/bin/python benchmarks/act_loop.py [--baseline REV_OR_TREE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import CHECKOUT, run_child, tree  # noqa: E402  (benchmarks/baseline.py)

#: The last commit before the act-level waves were stepped as arrays (issue 29).
BEFORE_ARRAYS = "be41bef"
#: The last commit before evaluations kept their envs and verbalized sampling drew over the batch (issue 29).
BEFORE_RUNS = "f02dce2"


def child(condition: str, updates: int, seed: int) -> dict:
    """Time ``updates`` act-level updates of ``condition`` in this process (whatever simpop it imports)."""
    import torch

    import simpop
    from simpop.envs.registration import make
    # via collapse (not .conditions, their home since issue 31): older trees, the baseline, have them there only
    from simpop.experiments.collapse import CollapseConfig, build_trainer

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    config = CollapseConfig(level="act", conditions=(condition,))
    trainer = build_trainer(condition, config, seed, make(config.env_id, **config.env_kwargs()), {})
    trainer.step()  # warm-up (imports, first allocations)
    digest = hashlib.sha256()
    start = time.perf_counter()
    for _ in range(updates):
        metrics = trainer.step()
        digest.update(repr([round(metrics.get(key, 0.0), 9) for key in ("success", "loss", "sim_loss")]).encode())
    elapsed = time.perf_counter() - start
    return {"updates_per_s": updates / elapsed, "digest": digest.hexdigest()[:12], "simpop": simpop.__file__}


def reply_speed(rows: int = 64, repeats: int = 200) -> list[tuple[float, float, float]]:
    """(temperature, per-dialogue ms, batched ms) of one wave's persuadee replies in this checkout: a call per row
    (:meth:`PersuadeeModel.respond`, a batch of one) vs one :meth:`PersuadeeModel.respond_batch`, same states and
    seeds."""
    import numpy as np

    from simpop.envs.persuasion.acts import PERSUADER_ACTS
    from simpop.envs.persuasion.model import PersuadeeModel
    from simpop.envs.persuasion.personas import PersonaSampler

    model, rng = PersuadeeModel(), np.random.default_rng(0)
    states, acts = [], []
    for persona in PersonaSampler().sample_many(rows, rng):
        state = model.initial_state(persona)
        for act in rng.choice(PERSUADER_ACTS, size=int(rng.integers(1, 9))):
            state = model.update(state, str(act))
        states.append(state)
        acts.append(str(act))
    out = []
    for temperature in (0.0, 1.0):
        times = []
        for batched in (False, True):
            rngs = [np.random.default_rng(i) for i in range(rows)]
            start = time.perf_counter()
            for _ in range(repeats):
                if batched:
                    model.respond_batch(states, acts, rngs, temperature)
                else:
                    [model.respond(s, a, r, temperature) for s, a, r in zip(states, acts, rngs)]
            times.append((time.perf_counter() - start) / repeats * 1e3)
        out.append((temperature, *times))
    return out


def child_run(condition: str, seed: int) -> dict:
    """Time one whole (condition, seed) run of the act-level experiment in this process, as ``make run`` runs it."""
    import tempfile

    import simpop
    from simpop.experiments.collapse import CollapseConfig, run_one

    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run_dir = run_one(CollapseConfig(level="act"), condition, seed, Path(out), False)
        elapsed = time.perf_counter() - start
        digest = hashlib.sha256()
        for line in (run_dir / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            digest.update(json.dumps({k: v for k, v in record.items() if not k.endswith("_s")},  # timings differ
                                     sort_keys=True).encode())
    return {"seconds": elapsed, "digest": digest.hexdigest()[:12], "simpop": simpop.__file__}


def measure(tree: Path, condition: str, updates: int, seed: int, whole_run: bool = False) -> dict:
    return run_child(tree, __file__, ["--child", "--condition", condition, "--updates", str(updates), "--seed",
                                      str(seed), *(["--whole-run"] if whole_run else [])], OMP_NUM_THREADS="1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BEFORE_ARRAYS, help="the revision or tree to compare against")
    parser.add_argument("--conditions", nargs="+", default=["frozen", "cotrain", "population"])
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-baseline", default=BEFORE_RUNS, help="the revision or tree the whole runs compare with")
    parser.add_argument("--runs", type=int, default=1, help="whole runs per condition and tree (0: none)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--condition", help=argparse.SUPPRESS)
    parser.add_argument("--whole-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child_run(args.condition, args.seed) if args.whole_run
                         else child(args.condition, args.updates, args.seed)))
        return
    with tree(args.baseline) as baseline:
        compare(args, baseline)
    if args.runs:
        with tree(args.run_baseline) as baseline:
            compare_runs(args, baseline)


def compare(args: argparse.Namespace, baseline: Path) -> None:
    """The table: each condition's best rate in the baseline tree and in this checkout."""
    print(f"act-level updates/s, {args.updates} updates after one warm-up, best of {args.repeats} "
          f"(baseline {args.baseline} at {baseline} vs checkout {CHECKOUT})")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'condition':<12} {'baseline':>9} {'checkout':>9} {'ratio':>6} {'ms before':>9} {'ms after':>8}  "
          f"same trajectories")
    for condition in args.conditions:
        runs: dict[str, list[dict]] = {"baseline": [], "checkout": []}
        for _ in range(args.repeats):
            for name, folder in (("baseline", baseline), ("checkout", CHECKOUT)):
                runs[name].append(measure(folder, condition, args.updates, args.seed))
        old = max(r["updates_per_s"] for r in runs["baseline"])
        new = max(r["updates_per_s"] for r in runs["checkout"])
        same = runs["baseline"][0]["digest"] == runs["checkout"][0]["digest"]
        print(f"{condition:<12} {old:9.2f} {new:9.2f} {new / old:5.2f}x {1e3 / old:9.2f} {1e3 / new:8.2f}  "
              f"{'yes' if same else 'no'}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\none wave of 64 persuadee replies (this checkout: a respond call per dialogue vs one respond_batch)")
    for temperature, one, batch in reply_speed():
        print(f"temperature {temperature:g}: {one:.2f} ms vs {batch:.2f} ms, {one / batch:.1f}x")



def compare_runs(args: argparse.Namespace, baseline: Path) -> None:
    """The table of whole runs: each condition's best time in the baseline tree and in this checkout."""
    conditions = ("frozen", "verbalized", "cotrain", "population")
    print(f"\nwhole (condition, seed {args.seed}) runs as make run runs them (200 updates, 11 evaluations), best of "
          f"{args.runs} (baseline {args.run_baseline} at {baseline} vs checkout {CHECKOUT})")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'condition':<12} {'s before':>9} {'s after':>8} {'ratio':>6}  same run")
    total = [0.0, 0.0]
    for condition in conditions:
        runs: dict[str, list[dict]] = {"baseline": [], "checkout": []}
        for _ in range(args.runs):
            for name, folder in (("baseline", baseline), ("checkout", CHECKOUT)):
                runs[name].append(measure(folder, condition, 0, args.seed, whole_run=True))
        old = min(r["seconds"] for r in runs["baseline"])
        new = min(r["seconds"] for r in runs["checkout"])
        total = [total[0] + old, total[1] + new]
        same = runs["baseline"][0]["digest"] == runs["checkout"][0]["digest"]
        print(f"{condition:<12} {old:9.2f} {new:8.2f} {old / new:5.2f}x  {'yes' if same else 'no'}")
    print(f"{'all four':<12} {total[0]:9.2f} {total[1]:8.2f} {total[0] / total[1]:5.2f}x")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
