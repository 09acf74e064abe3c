"""Generated tokens per second of the embedded SmolLM2 (TransformersBackend): batch 1 vs 8, fp32 vs bf16.

Batching is what the rollout engine and ``simpop serve`` rely on: one call for every pending turn. Also
prints the time to load the model from the conversion cache.
"""

from __future__ import annotations

import argparse
import time

from simpop.agents.base import SamplingParams
from simpop.agents.embedded import embedded_model_path
from simpop.agents.transformers_backend import TransformersBackend

PROMPT = "Tell me a long story about a lighthouse keeper and a storm."


def tokens_per_second(backend: TransformersBackend, batch: int, new_tokens: int) -> float:
    """Generated tokens per second of one batched call (sampling, so rows differ and rarely stop early)."""
    chats = [[{"role": "user", "content": f"{PROMPT} ({i})"}] for i in range(batch)]
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=0)
    start = time.perf_counter()
    generations = backend.generate(chats, params)
    return sum(len(g.token_ids) for g in generations) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args()

    import transformers  # noqa: F401 (imported up front so that "load" below times the weights only)

    start = time.perf_counter()
    embedded_model_path()  # converts on first use
    print(f"embedded model ready in {time.perf_counter() - start:.1f} s (conversion happens once per cache)")
    for dtype in ("float32", "bfloat16"):
        start = time.perf_counter()
        backend = TransformersBackend(dtype=dtype, threads=args.threads)
        load_s = time.perf_counter() - start
        tokens_per_second(backend, 1, 4)  # warm-up
        single = tokens_per_second(backend, 1, args.new_tokens)
        batched = tokens_per_second(backend, 8, args.new_tokens)
        print(
            f"{dtype:8s}: load {load_s:.2f} s | batch 1: {single:6.1f} tok/s | batch 8: {batched:6.1f} tok/s "
            f"| batch 8 / batch 1 = {batched / single:.1f}x"
        )


if __name__ == "__main__":
    main()
