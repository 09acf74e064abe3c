"""GPU check of simpop's torch path (no vLLM): the embedded SmolLM2 on a CUDA device, side by side with the same
machine's CPU, in one run.

1. Scoring: ``token_logprobs`` of the same dialogues on CUDA (float32, bfloat16) against the CPU in float32: the
   largest |difference| of a token's log-probability, and of the gradients a LoRA adapter gets from them.
2. Generation: one batch of 8 chats, 64 new tokens, greedy, on CUDA and on the CPU: tokens/s and their ratio, and
   how many greedy completions agree token for token.
3. Training as a user runs it: ``simpop train cotrain`` on simpop/Persuasion-v0 with a population of two co-trained
   LoRA simulators (``trainable:smollm2``) and a LoRA policy, in a child process each: 2 updates where CUDA is
   visible (the backend's default device then), 1 update with CUDA hidden; seconds per update side by side, finite
   losses and a checkpoint checked.

Run from the repository root on a machine with an NVIDIA GPU: ``python benchmarks/gpu_torch_check.py``; it exits
non-zero when a check fails. ``benchmarks/gpu_check.sh`` runs it first.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from simpop.agents.base import SamplingParams
from simpop.agents.transformers_backend import TransformersBackend

CHATS = [[{"role": "system", "content": "You are raising money for Save the Children."},
          {"role": "user", "content": text}] for text in (
    "Hi, how are you today?", "What is this charity about?", "I am not sure I can give anything.",
    "Tell me why I should donate.", "How much do people usually give?", "I gave to a charity last year.",
    "Is my money going to reach the children?", "I only have two dollars.")]


def scoring(cpu: TransformersBackend) -> None:
    """Log-probabilities and LoRA gradients on CUDA against the CPU's float32 reference."""
    sequences = [cpu.encode_chat(chat) for chat in CHATS]
    masks = [[0] * 8 + [1] * (len(s) - 8) for s in sequences]

    def scored(backend: TransformersBackend) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        if "check" not in backend.adapter_names:
            torch.manual_seed(0)  # the same LoRA initialisation on both devices
            backend.add_adapter("check", r=8, alpha=16)
        params = dict(zip((n for n, _ in backend.model.named_parameters() if "lora_" in n and ".check." in n),
                          backend.parameters("check")))
        for p in params.values():
            p.grad = None
        scores = backend.token_logprobs(sequences, masks)
        (scores.logprobs * scores.mask).sum().backward()
        grads = {n: p.grad.detach().float().cpu() for n, p in params.items() if p.grad is not None}
        return scores.logprobs.detach().float().cpu(), scores.mask.cpu().bool(), grads

    reference, mask, reference_grads = scored(cpu)
    assert reference_grads, "no LoRA gradient on the CPU"
    for dtype, tolerance in (("float32", 1e-3), ("bfloat16", 0.5)):
        logprobs, gpu_mask, grads = scored(TransformersBackend("smollm2", dtype=dtype, device="cuda"))
        assert torch.equal(mask, gpu_mask)
        worst = float((logprobs - reference)[mask].abs().max())
        scale = max(float(g.abs().max()) for g in reference_grads.values())
        grad_worst = max(float((grads[n] - g).abs().max()) for n, g in reference_grads.items()) / scale
        print(f"scoring {dtype} on CUDA vs float32 on CPU: {int(mask.sum())} tokens, max |d log p| {worst:.2e}; "
              f"LoRA gradients max |d| / max |g| {grad_worst:.2e}")
        assert worst < tolerance and grad_worst < tolerance * 10, (dtype, worst, grad_worst)


def generation(cpu: TransformersBackend, gpu: TransformersBackend) -> None:
    """Greedy tokens/s of one batch on each device, side by side."""
    params = SamplingParams(max_new_tokens=64, temperature=0.0)
    results = {}
    for name, backend in (("cuda", gpu), ("cpu", cpu)):
        backend.generate(CHATS[:2], SamplingParams(max_new_tokens=4))  # warm-up
        start = time.perf_counter()
        generations = backend.generate(CHATS, params)
        seconds = time.perf_counter() - start
        tokens = sum(len(g.token_ids) for g in generations)
        results[name] = (tokens / seconds, [g.token_ids for g in generations])
    same = sum(a == b for a, b in zip(results["cuda"][1], results["cpu"][1]))
    print(f"generation, batch of 8, greedy: CUDA {results['cuda'][0]:.0f} tok/s, CPU ({os.cpu_count()} cores) "
          f"{results['cpu'][0]:.0f} tok/s, ratio {results['cuda'][0] / results['cpu'][0]:.1f}x; "
          f"{same}/8 completions equal token for token")


def cotrain(updates: int, cuda: bool) -> float:
    """``simpop train cotrain`` in a child process; the policy's rollout + update seconds per update (the metrics'
    ``rollout_s`` + ``update_s``), printed with the child's wall time (setup and simulator updates included)."""
    out = Path(tempfile.mkdtemp(prefix="gpu-check-cotrain-"))
    env = {**os.environ, **({} if cuda else {"CUDA_VISIBLE_DEVICES": ""})}
    command = [sys.executable, "-c", "import sys; from simpop.cli import main; sys.exit(main(sys.argv[1:]))",
               "train", "cotrain", "--env", "simpop/Persuasion-v0", "--env-arg", "max_turns=2",
               "--simulator", "trainable:smollm2?temperature=1.0", "--population-size", "2",
               "--group-size", "4", "--scenarios-per-update", "2", "--max-new-tokens", "32",
               "--updates", str(updates), "--out", str(out), "--no-progress", "--no-export", "--seed", "0"]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    wall = time.perf_counter() - start
    train = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r.get("kind") == "train"]
    assert [r["step"] for r in train] == list(range(1, updates + 1)), train
    assert all(math.isfinite(r[k]) for r in train for k in ("loss", "sim_loss")), train
    assert any((out / "checkpoints").glob("*.pt")), "no checkpoint written"
    per_update = sum(r["rollout_s"] + r["update_s"] for r in train) / updates
    print(f"simpop train cotrain on {'CUDA' if cuda else 'CPU'}: {updates} update(s) in {wall:.0f} s wall; losses "
          f"{[round(r['loss'], 4) for r in train]}, simulator losses {[round(r['sim_loss'], 4) for r in train]}; "
          f"policy rollout + update {per_update:.1f} s/update")
    return per_update


def main() -> None:
    assert torch.cuda.is_available(), "no CUDA device visible to torch"
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores")
    cpu = TransformersBackend("smollm2", dtype="float32", device="cpu")
    scoring(cpu)
    generation(TransformersBackend("smollm2", dtype="float32", device="cpu"),
               TransformersBackend("smollm2", dtype="float32", device="cuda"))
    on_gpu, on_cpu = cotrain(2, cuda=True), cotrain(1, cuda=False)
    print(f"cotrain policy rollout + update per update, CPU / CUDA: {on_cpu / on_gpu:.1f}x")
    print("TORCH CHECK OK")


if __name__ == "__main__":
    main()
