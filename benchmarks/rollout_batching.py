"""Rollout batching: 16 P4G text dialogues at once vs one at a time, same backend, same seeds.

Both runs use the :class:`~simpop.train.rollout.RolloutEngine` with the embedded SmolLM2 in both seats
(the policy through token-in/token-out prompts, the persuadee as a frozen greedy
:class:`~simpop.simulators.llm.LLMSimulator`); only ``n_envs`` differs (16 vs 1). Decoding is greedy
on both seats so that the two runs do the same work (the token counts are printed to check).

Prints the speed-up (sequential wall time / batched wall time; target >= 4x), the share of the
batched rollout's time spent outside model calls (env steps, prompt bookkeeping; target <= 5%), and,
to explain the first figure, how much batching speeds up reading prompts alone: on a CPU prompt
reading is compute-bound, so batching mostly speeds up the token-by-token decoding. With
``--prefix-cache`` (the default) the backend keeps each seat's KV cache between turns, so a turn only
reads the tokens added since that seat's last call; ``--no-prefix-cache`` re-reads whole dialogues.
"""

from __future__ import annotations

import argparse
import time

from simpop.agents.base import SamplingParams
from simpop.agents.transformers_backend import TransformersBackend
from simpop.simulators.llm import LLMSimulator
from simpop.train.grpo import LLMPolicy
from simpop.train.rollout import RolloutEngine, RolloutStats, Trajectory

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


def prefill_speedup(backend: TransformersBackend, prompts: list[list[int]]) -> float:
    """How much faster one batched call reads ``prompts`` than one call per prompt (1 new token each)."""
    params = SamplingParams(max_new_tokens=1)
    start = time.perf_counter()
    for prompt in prompts:
        backend.generate_ids([prompt], params)
    one_by_one = time.perf_counter() - start
    start = time.perf_counter()
    backend.generate_ids(prompts, params)
    return one_by_one / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dialogues", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=3, help="persuader turns per dialogue")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="tokens per turn (both seats)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=True,
                        help="reuse each seat's KV cache across turns (both modes)")
    args = parser.parse_args()

    backend = TransformersBackend(dtype=args.dtype, threads=args.threads, prefix_cache=args.prefix_cache)
    backend.generate([[{"role": "user", "content": "Hi"}]], SamplingParams(max_new_tokens=2))  # warm-up
    print(f"{args.dialogues} dialogues of <= {args.max_turns} exchanges, <= {args.max_new_tokens} tokens per "
          f"turn, {backend.name} {args.dtype} on {backend.device}, prefix cache "
          f"{'on' if args.prefix_cache else 'off'}")
    print(f"{'mode':>10} | {'wall s':>7} | {'model s':>7} | {'outside':>7} | {'policy tok':>10} | "
          f"{'user turns':>10} | {'calls':>5} | {'policy tok/s':>12}")
    results = {}
    for label, n_envs in (("batched", args.dialogues), ("sequential", 1)):
        backend.clear_prefix_cache()  # each mode starts cold
        stats, trajectories = run(backend, n_envs, args)
        replies = sum(len(t.actions[t.user_seat]) for t in trajectories)
        results[label] = stats
        print(f"{label:>10} | {stats.total_s:7.1f} | {stats.model_s:7.1f} | {stats.outside_model_frac:7.2%} | "
              f"{stats.policy_tokens:10d} | {replies:10d} | {stats.policy_calls + stats.simulator_calls:5d} | "
              f"{stats.policy_tokens / stats.total_s:12.1f}")
    if args.prefix_cache:
        print(f"prefix cache (both modes): {backend.prefix_hits} hits, {backend.prefix_misses} misses, "
              f"{backend.prefix_reused_tokens} prompt tokens not re-read")
    batched, sequential = results["batched"], results["sequential"]
    speedup = sequential.total_s / batched.total_s
    token_speedup = (batched.policy_tokens / batched.total_s) / (sequential.policy_tokens / sequential.total_s)
    print(f"speed-up (wall time, sequential / batched): {speedup:.2f}x  (target >= 4x: "
          f"{'met' if speedup >= 4 else 'NOT met'}); per policy token: {token_speedup:.2f}x")
    print(f"time outside model calls (batched): {batched.outside_model_frac:.2%}  (target <= 5%: "
          f"{'met' if batched.outside_model_frac <= 0.05 else 'NOT met'})")
    # Reading a prompt is compute-bound and gains little from batching, which caps the speed-up on a
    # CPU when every turn re-reads the whole dialogue (no prefix cache).
    backend.prefix_cache = False  # measure reading the whole prompts
    prompts = [t.token_ids for t in trajectories]
    print(f"for reference, reading the {len(prompts)} final policy prompts (mean "
          f"{sum(map(len, prompts)) / len(prompts):.0f} tokens): batched {prefill_speedup(backend, prompts):.2f}x "
          f"faster than one by one")


if __name__ == "__main__":
    main()
