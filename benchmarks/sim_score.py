"""A text-level co-trained simulator's scoring pass (its update's forward and backward) on real dialogues, in this
checkout and in an earlier revision, side by side (issue 29, goal 2: text-level runs fast enough to repeat).

The parent records one collection of ``simpop experiment collapse --level text``'s cotrain condition (seed 0:
SmolLM2 with LoRA, 4 x 4 dialogues) and keeps the co-trained simulator's turns. Each tree then scores those same
turns in a child process, as ``CoTrainer.update_simulators`` does (the adapter's log-probs and the KL to the base
model, ``backward`` through them, the preset's activation checkpointing), best of ``--repeats``, the trees taking
turns. The table gives each tree's seconds, the ratio, the rows it scored and how far its numbers are from the
baseline's (same dialogues, same adapter: the scores must agree to rounding, which each tree's own rescoring in
other micro-batches shows)::

    nice -n 19 .venv/bin/python benchmarks/sim_score.py [--baseline REV_OR_TREE] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import CHECKOUT, run_child, tree  # noqa: E402  (benchmarks/baseline.py)

#: The last commit before a dialogue's turns were scored in shared rows.
BEFORE_ROWS = "1ae18e1"


def _trainer():
    """The text preset's cotrain trainer (seed 0), as the experiment builds it."""
    import torch

    from simpop.envs.registration import make
    from simpop.experiments.conditions import CollapseConfig, build_trainer, simulator_backends

    config = CollapseConfig(level="text", conditions=("cotrain",))
    env = make(config.env_id, **config.env_kwargs())
    torch.manual_seed(0)
    return build_trainer("cotrain", config, 0, env, simulator_backends(config))


def record(path: Path) -> int:
    """One collection's co-trained simulator turns, saved to ``path``; the number of turns."""
    import torch

    trainer = _trainer()
    for sim in trainer.simulators:
        sim.clear()
    trainer.policy_trainer.collect()
    dialogues = [[(t.prompt_ids, t.token_ids, t.logprobs) for t in e.turns] for e in trainer.simulators[0].episodes]
    torch.save(dialogues, path)
    return sum(map(len, dialogues))


def child(path: Path) -> dict:
    """Score the recorded turns with gradient and run backward, in this process (whatever simpop it imports)."""
    import torch

    import simpop
    from simpop.simulators.trainable import LLMEpisode, LLMTurn

    sim = _trainer().simulators[0]
    torch.manual_seed(1)
    with torch.no_grad():  # the same adapter in both trees, off the base model so that the KL is not 0
        for p in sim.parameters():
            p.add_(0.01 * torch.randn_like(p))
    episodes = [LLMEpisode([LLMTurn(*turn) for turn in dialogue]) for dialogue in torch.load(path)]
    rows = []
    original = sim.backend.token_logprobs

    def counted(sequences, *args, **kwargs):
        rows.append(len(sequences))
        return original(sequences, *args, **kwargs)

    sim.backend.token_logprobs = counted
    start = time.perf_counter()
    scores = sim.score(episodes)
    (-scores.logprob.mean() + 0.05 * scores.kl.mean()).backward()
    seconds = time.perf_counter() - start
    grads = [p.grad for p in sim.parameters() if p.grad is not None]
    # The tree's own rounding: the same scores in micro-batches of half the padded tokens (other shapes).
    sim.backend.token_budget //= 2
    with torch.no_grad():
        again = sim.score(episodes)
    return {"seconds": seconds, "rows": rows[0], "logprob": scores.logprob.tolist(), "kl": scores.kl.tolist(),
            "grad_norm": float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))),
            "own_logprob": float((again.logprob - scores.logprob.detach()).abs().max()),
            "own_kl": float((again.kl - scores.kl.detach()).abs().max()), "simpop": simpop.__file__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=BEFORE_ROWS, help="the revision or tree to compare against")
    parser.add_argument("--repeats", type=int, default=2, help="child runs per tree (the best counts)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return
    with tempfile.TemporaryDirectory(prefix="simpop-sim-score-") as folder, tree(args.baseline) as baseline:
        path = Path(folder) / "turns.pt"
        turns = record(path)
        print(f"one co-trained simulator's scoring pass (forward, reference and backward) on {turns} recorded turns; "
              f"baseline {args.baseline} at {baseline} vs checkout {CHECKOUT}; load average before: "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        runs: dict[str, list[dict]] = {"baseline": [], "checkout": []}
        for _ in range(args.repeats):
            for name, folder_ in (("baseline", baseline), ("checkout", CHECKOUT)):
                runs[name].append(run_child(folder_, __file__, ["--child", str(path)]))
                print(f"  {name}: {runs[name][-1]['seconds']:.1f} s", flush=True)
    old, new = (min(runs[n], key=lambda r: r["seconds"]) for n in ("baseline", "checkout"))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'tree':<9} {'rows':>5} {'s':>7} {'ratio':>6}")
    print(f"{'baseline':<9} {old['rows']:5d} {old['seconds']:7.1f}")
    print(f"{'checkout':<9} {new['rows']:5d} {new['seconds']:7.1f} {old['seconds'] / new['seconds']:5.2f}x")
    logprob = max(abs(a - b) for a, b in zip(old["logprob"], new["logprob"], strict=True))
    kl = max(abs(a - b) for a, b in zip(old["kl"], new["kl"], strict=True))
    print(f"largest difference per dialogue, checkout vs baseline: log-prob {logprob:.2e}, KL {kl:.2e}; gradient norm "
          f"{old['grad_norm']:.6g} vs {new['grad_norm']:.6g}")
    for name, r in (("baseline", old), ("checkout", new)):
        print(f"{name} vs itself in micro-batches of half the tokens (its rounding): log-prob {r['own_logprob']:.2e}, "
              f"KL {r['own_kl']:.2e}")


if __name__ == "__main__":
    main()
