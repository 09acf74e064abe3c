"""The text-level collapse preset in process and on one vLLM server, side by side (issue 29, goal 2).

For each condition, a shortened preset run (``--updates`` updates, evaluations at 0 and at the end with
``--eval-episodes`` dialogues per panel member) runs twice back to back: every model call in process (the default)
and with ``--model.generator`` on one vLLM server (:func:`simpop.experiments.conditions.one_server`: the policy and
the co-trained simulators under their versioned adapters, the frozen and verbalized simulators and the panel's LLM
member on the base model; training and survey scoring stay in torch). The server is started once, before the
table (its start is printed, not counted). Rows give each path's wall time, its time per update from the runs'
``metrics.jsonl`` (rollout, policy update), and the ratio. On a CPU the server shares the cores with torch::

    nice -n 19 .venv/bin/python benchmarks/text_collapse_speed.py [--conditions frozen cotrain] [--updates 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

from simpop.experiments.conditions import CONDITIONS


def run(config, out: Path) -> dict[str, float]:
    """One run of ``config`` (one condition, one seed) into ``out``: wall seconds and mean update timings."""
    from simpop.experiments.collapse import run_collapse

    start = time.perf_counter()
    run_collapse(config, out, progress=False)
    wall = time.perf_counter() - start
    (condition,) = config.conditions
    lines = (out / "runs" / condition / f"seed{config.first_seed}" / "metrics.jsonl").read_text().splitlines()
    updates = [r for r in map(json.loads, lines) if r.get("kind") == "train"]
    mean = {key: sum(r.get(key, 0.0) for r in updates) / len(updates) for key in ("rollout_s", "update_s")}
    return {"wall_s": wall, **mean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS))
    parser.add_argument("--updates", type=int, default=2, help="updates per run")
    parser.add_argument("--eval-episodes", type=int, default=4, help="dialogues per panel member per evaluation")
    args = parser.parse_args()

    from simpop.experiments.conditions import CollapseConfig, one_server

    base = CollapseConfig(level="text", conditions=tuple(args.conditions), seeds=1, updates=args.updates,
                          eval_every=args.updates, eval_episodes=args.eval_episodes)
    launch = dataclasses.replace(base, model=dataclasses.replace(base.model, generator="vllm:launch"))
    print(f"text preset, {args.updates} updates and {args.eval_episodes} evaluation dialogues per member, seed 0; "
          f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    start = time.perf_counter()
    with one_server(launch) as served, tempfile.TemporaryDirectory(prefix="simpop-text-speed-") as folder:
        print(f"server started in {time.perf_counter() - start:.0f} s ({served.model.generator})", flush=True)
        print(f"{'condition':<11} {'path':<11} {'wall s':>7} {'rollout s':>9} {'policy s':>8} {'ratio':>6}", flush=True)
        totals = {"in process": 0.0, "one server": 0.0}
        for condition in args.conditions:
            times = {}
            for path, config in (("in process", base), ("one server", served)):
                one = dataclasses.replace(config, conditions=(condition,))
                times[path] = run(one, Path(folder) / path.replace(" ", "-") / condition)
                totals[path] += times[path]["wall_s"]
                ratio = (f"{times['in process']['wall_s'] / times[path]['wall_s']:5.2f}x" if path == "one server"
                         else "")
                print(f"{condition:<11} {path:<11} {times[path]['wall_s']:7.0f} {times[path]['rollout_s']:9.1f} "
                      f"{times[path]['update_s']:8.1f} {ratio:>6}", flush=True)
    print(f"{'all':<11} {'':<11} in process {totals['in process']:.0f} s, one server {totals['one server']:.0f} s: "
          f"{totals['in process'] / totals['one server']:.2f}x; load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
