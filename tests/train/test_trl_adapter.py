"""TRL's GRPOTrainer trains through simpop's rollout_func (the one-layer ``tiny_model``, tiny lengths)."""

from __future__ import annotations


import simpop
from simpop.envs.persuasion.simulators import native_text
from simpop.train.trl_adapter import env_reward, make_rollout_func, scenario_dataset

ENV, KWARGS = "simpop/Persuasion-v0", {"max_turns": 2}

def test_trl_grpo_two_steps_through_the_adapter(tmp_path, monkeypatch, tiny_model):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    from simpop.agents.transformers_backend import TransformersBackend

    backend = TransformersBackend(tiny_model, trainable=True)
    rollout = make_rollout_func(ENV, native_text(simpop.make(ENV, **KWARGS)), backend, env_kwargs=KWARGS,
                                max_new_tokens=4, system_prompt="Ask for a donation.")
    outputs = []

    def spy(prompts, trainer):
        outputs.append((prompts, rollout(prompts, trainer)))
        return outputs[-1][1]

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, max_steps=2,
                      logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", bf16=False,
                      disable_tqdm=True)
    trainer = GRPOTrainer(model=backend.model, processing_class=backend.tokenizer, reward_funcs=env_reward,
                          train_dataset=scenario_dataset(ENV, n=4, env_kwargs=KWARGS), rollout_func=spy, args=args)
    trainer.train()
    assert trainer.state.global_step == 2 and len(outputs) == 2
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all("frac_reward_zero_std" in h and "entropy" in h for h in logs)
    for (prompts, out), log in zip(outputs, logs):
        assert prompts[0] == prompts[1] and prompts[0] in simpop.make(ENV, **KWARGS).scenario_ids()
        assert all(len(c) == len(m) == len(lp) for c, m, lp in zip(out["completion_ids"], out["env_mask"],
                                                                  out["logprobs"]))
        # Completions include the simulator's turn, but TRL counts (and trains on) policy tokens only.
        assert all(len(c) > sum(m) for c, m in zip(out["completion_ids"], out["env_mask"]))
        assert log["completions/mean_length"] == sum(map(sum, out["env_mask"])) / 2 <= 8
        assert log["reward"] == sum(out["env_reward"]) / 2
