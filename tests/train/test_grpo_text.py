"""Text GRPO on the one-layer ``tiny_model`` (tiny lengths): parameters move, loss is logged, masks hold."""

from __future__ import annotations

import math

import numpy as np
import torch

import simpop
from simpop.agents.policy import LLMPolicy, ModelConfig
from simpop.envs.persuasion.simulators import native_text
from simpop.train.grpo import Batch, GRPOConfig, GRPOTrainer

ENV = "simpop/Persuasion-v0"
ENV_KWARGS = {"max_turns": 2}


def _trainer(model_path, lora: bool, prefix_cache: bool = True, **config) -> GRPOTrainer:
    from simpop.agents.transformers_backend import TransformersBackend

    cfg = GRPOConfig(group_size=2, scenarios_per_update=1, max_new_tokens=4, seed=3, **config)
    model = ModelConfig(lora=lora, lora_r=4, lora_alpha=8, prefix_cache=prefix_cache)
    backend = TransformersBackend(model_path, trainable=not model.lora, prefix_cache=model.prefix_cache)
    # A short system prompt keeps sequences (and the test) small.
    policy = LLMPolicy(backend, cfg.sampling(), lora=model.lora, lora_r=model.lora_r, lora_alpha=model.lora_alpha,
                       adapter=model.adapter, system_prompt="Ask for a donation.")
    assert (policy.adapter == "policy") == lora and (policy.lora is not None) == lora
    return GRPOTrainer(ENV, policy, native_text(simpop.make(ENV, **ENV_KWARGS)), cfg, env_kwargs=ENV_KWARGS)


def _with_signal(batch: Batch) -> Batch:
    """The same rollouts with advantages +1 / -1, so that one update must move the weights."""
    return Batch(batch.trajectories, np.array([1.0, -1.0]), batch.stats)


def test_full_finetune_update_changes_parameters_and_masks_simulator_tokens(tiny_model):
    trainer = _trainer(tiny_model, lora=False)
    batch = trainer.collect()
    t = batch.trajectories[0]
    assert t.policy_turns == 2 and 0 < t.policy_tokens <= 8 and len(t.token_ids) == len(t.mask)
    # Between the two policy turns sit template and simulator tokens (mask 0).
    first_end = t.mask.index(1) + t.mask[t.mask.index(1):].index(0)
    assert t.mask.index(1, first_end) - first_end > 3

    hidden: list[torch.Tensor] = []  # the final hidden states, which the LM head reads

    def keep(module, args, out):
        out.retain_grad()
        hidden.append(out)

    hook = trainer.policy.backend.model.model.norm.register_forward_hook(keep)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics = trainer.update(_with_signal(batch))
    hook.remove()
    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert metrics["policy_entropy"] > 0
    assert metrics["policy_tokens"] == sum(x.policy_tokens for x in batch.trajectories)
    assert any(not torch.equal(b, p) for b, p in zip(before, trainer.policy.parameters()))
    # Proof of masking: the hidden states that predict non-policy tokens receive exactly zero gradient.
    (out,) = hidden
    for row, trajectory in enumerate(batch.trajectories):
        predicts = torch.tensor(trajectory.mask[1:], dtype=torch.bool)  # hidden[t] predicts token t+1
        grad = out.grad[row, :len(predicts)]
        assert torch.all(grad[~predicts] == 0) and torch.any(grad[predicts] != 0)


def test_masked_positions_do_not_change_the_loss(tiny_model):
    trainer = _trainer(tiny_model, lora=True)
    batch = _with_signal(trainer.collect())
    units = trainer._text_units(batch)
    baseline = [trainer._forward(u)[0].detach() for u in units]
    # Garbage log-probs at masked positions, and extra simulator tokens after the last policy turn.
    for t in batch.trajectories:
        t.logprobs = [lp if m else 123.0 for lp, m in zip(t.logprobs, t.mask)]
        t.token_ids = t.token_ids + [17, 4242, 9]
        t.mask = t.mask + [0, 0, 0]
    perturbed = [trainer._forward(u)[0].detach() for u in trainer._text_units(batch)]
    for a, b, t in zip(baseline[0], perturbed[0], batch.trajectories):
        n = len(t.mask) - 3
        assert torch.equal(a[:n], b[:n]) and torch.all(b[n:] == 0)


def test_lora_with_kl_trains_only_the_adapter(tiny_model):
    trainer = _trainer(tiny_model, lora=True, kl_coef=0.1, epochs=2, lr=1e-2)  # a random model's KL needs a step
    base = {n: p.detach().clone() for n, p in trainer.policy.backend.model.named_parameters() if "lora_" not in n}
    adapter = [p.detach().clone() for p in trainer.policy.parameters()]
    metrics = trainer.update(_with_signal(trainer.collect()))
    assert all(torch.equal(base[n], p) for n, p in trainer.policy.backend.model.named_parameters() if n in base)
    assert any(not torch.equal(a, p) for a, p in zip(adapter, trainer.policy.parameters()))
    assert metrics["kl"] > 0 and math.isfinite(metrics["loss"])  # the 2nd epoch moved away from the base
    state = trainer.state_dict()
    assert set(state["policy"]) and all("lora_" in k for k in state["policy"])


def test_prefix_cache_collects_the_uncached_rollouts_across_lora_updates(tiny_model):
    runs = {}
    for cached in (True, False):
        trainer = _trainer(tiny_model, lora=True, prefix_cache=cached)
        first = trainer.collect()
        trainer.update(_with_signal(first))
        runs[cached] = (first, trainer.collect(), trainer.policy.backend)
    for stage in (0, 1):  # before and after a weight update
        assert ([t.token_ids for t in runs[True][stage].trajectories]
                == [t.token_ids for t in runs[False][stage].trajectories])
    assert runs[True][2].prefix_hits > 0 and runs[False][2].prefix_hits == 0
