"""Rollout batching: 16 P4G text dialogues at once vs one at a time, same backend, same seeds.

Both runs use the :class:`~simpop.rollout.RolloutEngine` with the embedded SmolLM2 in both seats
(the policy through token-in/token-out prompts, the persuadee as a frozen greedy
:class:`~simpop.simulators.llm.LLMSimulator`); only ``n_envs`` differs (16 vs 1). Decoding is greedy
on both seats so that the two runs do the same work (the token counts are printed to check).

For each weights dtype (float32 and bfloat16 by default, side by side) it prints the speed-up
(sequential wall time / batched wall time; target >= 4x), the share of the batched rollout's time
spent outside model calls (env steps, prompt bookkeeping; target <= 5%), and where the model time
goes: reading prompts (forward passes over more than one new token per row) vs decoding (one token
per row per pass). Batching speeds up decoding many times over, but reading a prompt is
compute-bound on a CPU, so the prompt-reading share of a rollout bounds the speed-up. With
``--prefix-cache`` (the default) the backend keeps each seat's KV cache between turns, so a turn only
reads the tokens added since that seat's last call; ``--no-prefix-cache`` re-reads whole dialogues.
Dialogues have the env's own length (10 exchanges; ~7 minutes for both dtypes on 2 cores): shorter
ones (``--max-turns 3``) gain less, as reading each dialogue's first prompts is more of their work.
"""

from __future__ import annotations

import argparse
import time

from simpop.agents.base import SamplingParams
from simpop.agents.transformers_backend import TransformersBackend
from simpop.envs.persuasion.env import PersuasionEnv
from simpop.simulators.llm import LLMSimulator
from simpop.agents.policy import LLMPolicy
from simpop.rollout import RolloutEngine, RolloutStats, Trajectory

ENV = "simpop/Persuasion-v0"


def run(backend: TransformersBackend, n_envs: int, args: argparse.Namespace) -> tuple[RolloutStats, list[Trajectory]]:
    """One collection of ``args.dialogues`` dialogues: (engine stats, trajectories)."""
    policy = LLMPolicy(backend, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0))
    simulator = LLMSimulator(backend, SamplingParams(max_new_tokens=args.max_new_tokens))
    engine = RolloutEngine(ENV, policy, simulator, n_envs=n_envs, env_kwargs={"max_turns": args.max_turns})
    # Distinct scenarios: with greedy decoding, dialogues of one scenario would be identical and the
    # simulator would answer them once, which is not the work a sampled GRPO group needs.
    trajectories = engine.collect(args.dialogues, group_size=1, seed=args.seed)
    return engine.stats, trajectories


class ModelTimer:
    """Wall time of the backend model's forward passes, split into prompt reading and decoding."""

    def __init__(self, backend: TransformersBackend) -> None:
        self.reading = self.decoding = 0.0
        forward = backend.model.forward

        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = forward(*args, **kwargs)
            elapsed = time.perf_counter() - start
            if kwargs["input_ids"].shape[1] > 1:
                self.reading += elapsed
            else:
                self.decoding += elapsed
            return out

        backend.model.forward = timed

    def reset(self) -> None:
        self.reading = self.decoding = 0.0


def measure(dtype: str, args: argparse.Namespace) -> float:
    """Both modes with ``dtype`` weights; prints their rows and returns the speed-up."""
    backend = TransformersBackend(dtype=dtype, threads=args.threads, prefix_cache=args.prefix_cache)
    backend.generate([[{"role": "user", "content": "Hi"}]], SamplingParams(max_new_tokens=2))  # warm-up
    timer = ModelTimer(backend)
    results = {}
    for label, n_envs in (("batched", args.dialogues), ("sequential", 1)):
        backend.clear_prefix_cache()  # each mode starts cold
        timer.reset()
        stats, trajectories = run(backend, n_envs, args)
        replies = sum(len(t.actions[t.user_seat]) for t in trajectories)
        results[label] = stats
        print(f"{dtype:>8} | {label:>10} | {stats.total_s:7.1f} | {timer.reading:7.1f} | {timer.decoding:7.1f} | "
              f"{stats.outside_model_frac:7.2%} | {stats.policy_tokens:10d} | {replies:10d} | "
              f"{stats.policy_calls + stats.simulator_calls:5d}")
    batched, sequential = results["batched"], results["sequential"]
    wall = sequential.total_s / batched.total_s
    per_token = (batched.policy_tokens / batched.total_s) / (sequential.policy_tokens / sequential.total_s)
    # Greedy decoding in bfloat16 may take a different path in a padded batch than alone (rounding), so
    # the two runs can generate different token counts; the verdict uses the lower of the two ratios.
    speedup = min(wall, per_token)
    print(f"{dtype:>8} | speed-up (sequential / batched): {wall:.2f}x wall time, {per_token:.2f}x per policy token "
          f"(target >= 4x: {'met' if speedup >= 4 else 'NOT met'}); time outside model calls (batched): "
          f"{batched.outside_model_frac:.2%}  (target <= 5%: {'met' if batched.outside_model_frac <= 0.05 else 'NOT met'})")
    if args.prefix_cache:
        print(f"{dtype:>8} | prefix cache (both modes): {backend.prefix_hits} hits, {backend.prefix_misses} misses, "
              f"{backend.prefix_reused_tokens} prompt tokens not re-read")
    return speedup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dialogues", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=PersuasionEnv().max_turns,
                        help="persuader turns per dialogue (default: the env's own, as in P4G)")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="tokens per turn (both seats)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=("float32", "bfloat16"))
    parser.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                        help="reuse each seat's KV cache across turns (both modes)")
    args = parser.parse_args()

    print(f"{args.dialogues} dialogues of <= {args.max_turns} exchanges, <= {args.max_new_tokens} tokens per "
          f"turn, smollm2, prefix cache {'on' if args.prefix_cache else 'off'}")
    print(f"{'dtype':>8} | {'mode':>10} | {'wall s':>7} | {'read s':>7} | {'decode s':>7} | {'outside':>7} | "
          f"{'policy tok':>10} | {'user turns':>10} | {'calls':>5}")
    speedups = {dtype: measure(dtype, args) for dtype in args.dtype}
    print("speed-ups: " + ", ".join(f"{dtype} {value:.2f}x" for dtype, value in speedups.items()))


if __name__ == "__main__":
    main()
