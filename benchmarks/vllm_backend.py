"""simpop's vLLM backend vs raw requests to the same vLLM server, vs the transformers backend, and multi-turn
token-in/token-out vs re-rendered chat; every ratio measured side by side in one run.

1. **Client overhead.** The same ``--prompts`` token-id prompts (P4G-like chats, greedy, ``--max-new-tokens``)
   through :meth:`VLLMBackend.generate_ids` and through bare concurrent ``httpx`` POSTs of the identical
   ``/v1/completions`` payloads (vLLM's own serving path with no simpop code). Target: simpop >= 0.8x raw.
2. **Engines.** The same prompts through the in-process :class:`TransformersBackend` (batched, one call),
   measured first, before the server starts (with ``--url`` a resident server may slow it).
3. **Multi-turn.** ``--dialogues`` dialogues of ``--turns`` turns with fixed user replies: token-in/token-out
   (each prompt = the previous prompt + the generated ids + the template's closing + the new message, as the
   rollout engine builds them) vs re-rendered chat (the whole history to ``/v1/chat/completions`` each turn, as
   an OpenAI client does). Prints wall time, prompt tokens, vLLM prefix-cache hits (``/metrics``), tokens
   re-read (prompt tokens not served from the cache) and prompts whose re-rendered ids differ from the ids
   the policy actually generated (drift: the training data would then not be what was sampled).
4. **LoRA layers.** Section 1's prompts through simpop on a second server started without ``--enable-lora``
   (what ``simpop eval --sim-generator vllm:launch`` starts: its frozen members use no adapter), after the
   first (with LoRA serving, as a training server runs) has stopped: two idle engines would share the cores.

Starts a vLLM server on the embedded SmolLM2 (``make vllm-env`` first; ~40-100 s on 2 cores) or uses
``--url http://HOST:PORT`` (a server started with ``simpop serve --engine vllm``). Run:
``.venv/bin/python benchmarks/vllm_backend.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import time

from simpop.agents.base import SamplingParams
from simpop.agents.embedded import embedded_model_path
from simpop.agents.vllm_backend import VLLMBackend
from simpop.agents.vllm_server import VLLMServer

TOPICS = ["a children's charity", "clean water", "animal shelters", "disaster relief", "cancer research",
          "school meals", "reforestation", "refugee support"]
USER_REPLIES = ["I'm not sure, tell me more.", "How much of my money reaches them?", "Maybe a little. Why now?",
                "Alright, what would you suggest?", "I need to think about it."]


def chats(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": "You persuade people to donate to Save the Children."},
             {"role": "user", "content": f"Hi! I usually give to {TOPICS[i % len(TOPICS)]}. Why should I give to "
                                         f"your cause instead? (conversation {i})"}] for i in range(n)]


def raw_generate(backend: VLLMBackend, payloads: list[dict]) -> list[dict]:
    """The same payloads as bare concurrent POSTs (no retries, no parsing into Generation objects)."""
    import httpx

    async def go() -> list[dict]:
        async with httpx.AsyncClient(timeout=600) as client:
            responses = await asyncio.gather(*(client.post(f"{backend.base_url}/completions", json=p)
                                               for p in payloads))
        return [r.json() for r in responses]

    return asyncio.run(go())


def best_of(repeats: int, fn):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def multi_turn(backend: VLLMBackend, args: argparse.Namespace, token_in_out: bool) -> dict[str, float]:
    """Run the dialogues one turn at a time (all dialogues batched per turn); counters from ``/metrics``."""
    from simpop.agents.policy import ChatDelta

    delta = ChatDelta(backend)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0, logprobs=token_in_out)
    histories = chats(args.dialogues)
    ledgers = [delta.first_prompt(chat) for chat in histories]
    before = backend.prefix_cache_counters()
    drift = 0
    start = time.perf_counter()
    for turn in range(args.turns):
        if token_in_out:
            generations = backend.generate_ids(ledgers, params)
        else:
            generations = backend.generate(histories, params)
        for i, g in enumerate(generations):
            reply = USER_REPLIES[(turn + i) % len(USER_REPLIES)]
            histories[i] = histories[i] + [{"role": "assistant", "content": g.text}, {"role": "user", "content": reply}]
            if token_in_out:
                ledgers[i] = ledgers[i] + g.token_ids + delta.close_reply(g.token_ids) + delta.messages(
                    [{"role": "user", "content": reply}])
            else:  # what the policy generated vs how the server re-renders it next turn
                rendered = backend.encode_chat(histories[i][:-1], add_generation_prompt=False)
                drift += g.token_ids[:len(g.token_ids) - 1] != rendered[len(g.prompt_ids):][:len(g.token_ids) - 1]
    wall = time.perf_counter() - start
    after = backend.prefix_cache_counters()
    queries, hits = after["queries"] - before["queries"], after["hits"] - before["hits"]
    return {"wall_s": wall, "prompt_tokens": queries, "cache_hits": hits, "reread": queries - hits,
            "drifted_turns": float(drift)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="", help="a running vLLM server (default: start one)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--dialogues", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    # The transformers baseline runs first, with no vLLM server resident (its idle engine still takes CPU).
    from simpop.agents.transformers_backend import TransformersBackend

    local = TransformersBackend("smollm2", dtype=args.dtype)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    prompts = [local.encode_chat(chat) for chat in chats(args.prompts)]
    local.generate_ids(prompts[:2], params)
    hf_s, hf = best_of(1, functools.partial(local.generate_ids, prompts, params))
    hf_tokens = sum(len(g.token_ids) for g in hf)
    del local

    server = None
    if args.url:
        base_url = args.url.rstrip("/") + ("" if args.url.rstrip("/").endswith("/v1") else "/v1")
        served = VLLMBackend(base_url, "?").served_models()
        name = next(m["id"] for m in served if not m.get("parent"))
    else:
        start = time.perf_counter()
        server = VLLMServer("smollm2", dtype=args.dtype).start()
        print(f"vLLM server started in {time.perf_counter() - start:.1f} s ({args.dtype})")
        base_url, name = server.base_url, server.served_name
    try:
        backend = VLLMBackend(base_url, name, tokenizer=embedded_model_path())
        payloads = [backend.completion_payload(p, params, i) for i, p in enumerate(prompts)]
        backend.generate_ids(prompts[:2], params)  # warm-up
        raw_s, raw = best_of(args.repeats, lambda: raw_generate(backend, payloads))
        ours_s, ours = best_of(args.repeats, lambda: backend.generate_ids(prompts, params))
        raw_tokens = sum(len(r["choices"][0]["token_ids"]) for r in raw)
        our_tokens = sum(len(g.token_ids) for g in ours)
        print(f"\n1. {args.prompts} prompts x <= {args.max_new_tokens} new tokens, greedy, best of {args.repeats}")
        print(f"   raw HTTP to vLLM   {raw_s:7.2f} s  {raw_tokens / raw_s:7.1f} tok/s  ({raw_tokens} tokens)")
        print(f"   simpop VLLMBackend {ours_s:7.2f} s  {our_tokens / ours_s:7.1f} tok/s  ({our_tokens} tokens)")
        print(f"   simpop / raw throughput: {(our_tokens / ours_s) / (raw_tokens / raw_s):.2f}x (target >= 0.8x)")
        print(f"2. transformers (in process, batched) {hf_s:7.2f} s  {hf_tokens / hf_s:7.1f} tok/s "
              f"({hf_tokens} tokens)")
        print(f"   vLLM backend / transformers throughput: {(our_tokens / ours_s) / (hf_tokens / hf_s):.2f}x")

        print(f"3. multi-turn: {args.dialogues} dialogues x {args.turns} turns")
        for label, token_in_out in (("token-in/token-out", True), ("re-rendered chat", False)):
            backend.reset_prefix_cache()
            m = multi_turn(backend, args, token_in_out)
            hit_rate = m["cache_hits"] / m["prompt_tokens"] if m["prompt_tokens"] else 0.0
            print(f"   {label:19s} {m['wall_s']:6.2f} s  prompt tokens {m['prompt_tokens']:6.0f}  cache hits "
                  f"{m['cache_hits']:6.0f} ({hit_rate:.0%})  re-read {m['reread']:6.0f}  drifted turns "
                  f"{m['drifted_turns']:.0f}")
    finally:
        if server is not None:
            server.stop()
    if server is not None:
        with VLLMServer("smollm2", dtype=args.dtype, enable_lora=False) as plain:
            backend = VLLMBackend(plain.base_url, plain.served_name, tokenizer=embedded_model_path())
            backend.generate_ids(prompts[:2], params)  # warm-up
            plain_s, plain_out = best_of(args.repeats, lambda: backend.generate_ids(prompts, params))
        plain_tokens = sum(len(g.token_ids) for g in plain_out)
        same = [g.token_ids for g in plain_out] == [g.token_ids for g in ours]
        ratio = (plain_tokens / plain_s) / (our_tokens / ours_s)
        print(f"4. without LoRA layers {plain_s:7.2f} s  {plain_tokens / plain_s:7.1f} tok/s  ({plain_tokens} tokens); "
              f"throughput vs section 1's LoRA-serving server: {ratio:.2f}x; same tokens: {'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
