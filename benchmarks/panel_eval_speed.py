"""``simpop eval`` member by member vs every member in one wave, side by side in one run, with the records compared.

Runs the same evaluation twice as child processes of this checkout (``--waves member``, then ``--waves panel``,
alternating ``--repeats`` times: a shared CPU drifts) and prints each one's wall time, the ratio, the load
average around each run, and whether the two wrote the same records (every episode's member, scenario, trial,
success, reward and transcript). Extra ``simpop eval`` arguments (e.g. ``--sim-generator vllm:launch``) go to the
one-wave run only with ``--panel-args``. The default is issue 29's command::

    nice -n 19 .venv/bin/python benchmarks/panel_eval_speed.py
    # simpop eval --env simpop/Tau2-mock-v0 --policy reference --panel tau2-mock-v1 --num-trials 2
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
COMMAND = ["--env", "simpop/Tau2-mock-v0", "--policy", "reference", "--panel", "tau2-mock-v1", "--num-trials", "2"]


def records(folder: Path) -> list[tuple]:
    """What must match: each episode's member, scenario, trial, outcome and transcript, in a fixed order."""
    rows = []
    for line in (folder / "episodes.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        rows.append((r["member"], r["scenario"], r["trial"], r["success"], r["reward"], r.get("error"),
                     json.dumps(r["transcript"], sort_keys=True)))
    return sorted(rows)


def run(args: list[str], out: Path) -> tuple[float, tuple[float, float]]:
    """Wall seconds of one ``simpop eval`` child and the 1-minute load average before and after it."""
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT / "src"), "OMP_NUM_THREADS": "1"}
    before = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "simpop.cli", "eval", *args, "--no-progress", "--out", str(out)],
                   env=env, cwd=CHECKOUT, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start, (before, os.getloadavg()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-args", default=shlex.join(COMMAND), help="the simpop eval arguments (both runs)")
    parser.add_argument("--panel-args", default="", help="extra arguments of the one-wave run only")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    common = shlex.split(args.eval_args)
    modes = {"member": [*common, "--waves", "member"], "panel": [*common, "--waves", "panel",
                                                                  *shlex.split(args.panel_args)]}
    print(f"simpop eval {args.eval_args}: --waves member vs --waves panel {args.panel_args}".rstrip())
    times: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for mode, argv in modes.items():
                out = Path(tmp) / f"{mode}{r}"
                seconds, (before, after) = run(argv, out)
                times[mode].append(seconds)
                print(f"{mode:<7} run {r}: {seconds:7.1f} s  (load average {before:.2f} -> {after:.2f})", flush=True)
        same = records(Path(tmp) / "member0") == records(Path(tmp) / "panel0")
        n = len(records(Path(tmp) / "member0"))
    old, new = min(times["member"]), min(times["panel"])
    print(f"best: member by member {old:.1f} s, one wave {new:.1f} s, ratio {old / new:.2f}x; "
          f"same records ({n} episodes): {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
