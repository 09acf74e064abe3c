"""RLlib's PPO trains simpop/PersuasionAct-v0 (simpop.integrations.rllib_marl): the frozen-opponent rule's figures
per seed, with the CPU and wall time training took.

Per seed, in RLlib's own environment (``make rllib-env``; ``--python``): both seats (30 iterations), then the policy
seat alone against the population ``persuadee`` + ``persuadee?temperature=0.8`` (20 iterations). On 300 fixed seeds,
the rule of the TorchRL route (``simpop.integrations.marl_ppo.gain``): the trained persuader (sampled) against a
uniformly random one, facing the frozen final user (both seats) or the reference persuadee (alone); the trained
user's ``KL(user || reference)`` per turn against a uniformly random user's, facing a random persuader. A seat
learned if its gain exceeds 2 standard errors. One run at a time, one torch thread each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from simpop.user_input import SEED

ROOT = Path(__file__).resolve().parents[1]


def row(figures: dict) -> str:
    verdict = "learned" if figures["learned"] else "NOT learned"
    return (f"{figures['trained']:.3f} / {figures['random']:.3f} ({figures['difference']:+.3f}, SE "
            f"{figures['se']:.3f}, {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=SEED, nargs="+", default=[0, 1, 2])
    parser.add_argument("--python", default=os.environ.get("SIMPOP_RLLIB_PYTHON", str(ROOT / ".venv-rllib/bin/python")),
                        help="a Python with ray[rllib] (default: $SIMPOP_RLLIB_PYTHON, else .venv-rllib)")
    args = parser.parse_args()
    if not Path(args.python).is_file():
        parser.error(f"no Python at {args.python}: run `make rllib-env` or pass --python")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    print("mode  seed  CPU (wall)        persuader: trained / random (gain, SE)   user KL per turn: trained / random "
          "(gain, SE)")
    learned = 0
    for mode in ("both", "solo"):
        for seed in args.seeds:
            result = subprocess.run([args.python, "-m", "simpop.integrations.rllib_marl", mode, "--seed", str(seed)],
                                    capture_output=True, text=True, env=env, cwd=ROOT, check=False)
            if result.returncode != 0:
                raise SystemExit(f"{mode} seed {seed} failed:\n{result.stderr[-3000:]}")
            out = json.loads(result.stdout.splitlines()[-1])
            policy = out["policy_vs_final_user" if mode == "both" else "policy_vs_reference"]
            user = out.get("user_kl")
            print(f"{mode:5} {seed:4}  {out['cpu_s']:5.1f} s ({out['wall_s']:4.0f} s)  {row(policy)}   "
                  f"{row(user) if user else '-'}")
            if mode == "both":
                print(f"{'':11}persuader vs the reference persuadee: {row(out['policy_vs_reference'])}")
            learned += policy["learned"] and (user is None or user["learned"])
    print(f"the rule holds in {learned} of {2 * len(args.seeds)} runs")


if __name__ == "__main__":
    main()
