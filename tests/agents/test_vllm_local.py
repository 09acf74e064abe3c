"""The in-process vLLM mode (:class:`~simpop.agents.vllm_backend.LocalVLLM`) on a real engine.

simpop's own environment cannot hold vLLM's pins, so the engine runs in the vLLM environment (``make vllm-env``,
which also takes what ``import simpop`` needs) on this checkout's sources; torch scores its answers here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch


SRC = Path(__file__).resolve().parents[2] / "src"

CHILD = '''
import json, sys


def main():
    sys.path.insert(0, sys.argv[1])
    from simpop.agents.base import SamplingParams
    from simpop.agents.vllm_backend import LocalVLLM

    llm = LocalVLLM(sys.argv[2], dtype="float32", max_model_len=512, max_lora_rank=8, optimization_level=0)  # eager
    prompt = json.loads(sys.argv[3])
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3, logprobs=True)
    out = {}
    for name, lora in (("base", None), ("adapter", ("probe", sys.argv[4]))):
        (g,) = llm.generate_ids([prompt], params, lora=lora)
        out[name] = {"token_ids": g.token_ids, "prompt_ids": g.prompt_ids, "logprobs": g.logprobs}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":  # vLLM's engine starts worker processes by spawning
    main()
'''


def test_local_vllm_generates_from_exact_ids_with_and_without_a_lora_adapter(tmp_path, vllm_python):
    from simpop.agents.lora import LoRAAdapter
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.agents.vllm_backend import write_adapter
    backend = TransformersBackend("smollm2", dtype="float32")
    adapter = LoRAAdapter(backend, "probe", r=4, alpha=8)
    torch.manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter: B is zero at initialisation
        for name, weight in backend.model.named_parameters():
            if "lora_B" in name and ".probe." in name:
                weight.normal_(0.0, 0.02)
    folder = write_adapter(backend.model, "probe", tmp_path / "probe")
    prompt = backend.encode_chat([{"role": "user", "content": "Would you give to a children's charity?"}])
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([vllm_python, str(script), str(SRC), str(backend.path), json.dumps(prompt), str(folder)],
                          capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])

    def torch_logprobs(generated: list[int], with_adapter: bool) -> torch.Tensor:
        sequence, mask = prompt + generated, [0] * len(prompt) + [1] * len(generated)
        with torch.no_grad():
            if with_adapter:
                adapter.activate()
                return backend.token_logprobs([sequence], [mask]).logprobs[0, len(prompt):]
            with adapter.disabled():
                return backend.token_logprobs([sequence], [mask]).logprobs[0, len(prompt):]

    for name, with_adapter in (("base", False), ("adapter", True)):
        g = out[name]
        assert g["prompt_ids"] == prompt and len(g["logprobs"]) == len(g["token_ids"]) > 0
        # vLLM's sampling log-probs are torch's for the same weights: exact ids in, the same model answering.
        gap = (torch.tensor(g["logprobs"]) - torch_logprobs(g["token_ids"], with_adapter)).abs().mean()
        assert gap < 1e-3, (name, float(gap))
    # ... and the adapter is really applied: its tokens score differently under the base model.
    tokens = out["adapter"]["token_ids"]
    assert (torch_logprobs(tokens, True) - torch_logprobs(tokens, False)).abs().mean() > 0.01
