"""export_policy / load_exported: LoRA merged and adapter folders, full fine-tunes, act policies, atomic writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from simpop.agents.export import MANIFEST, export_policy, load_exported, read_manifest
from simpop.agents.policy import ActPolicy


class TinyActor(nn.Module):
    """A torch policy of no simpop class (like PPO's actor-critic): rebuilt from ``init_args``."""

    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.head = nn.Linear(obs_dim, n_actions)

    def act_batch(self, observations, slots):
        with torch.no_grad():
            return self.head(torch.as_tensor(np.asarray(observations, dtype=np.float32))).argmax(-1).tolist()


def _trained_act_policy() -> ActPolicy:
    policy = ActPolicy(obs_dim=5, n_actions=3, hidden_size=7, seed=1)
    with torch.no_grad():
        policy.net[-1].weight.normal_(generator=torch.Generator().manual_seed(0))  # not the initial weights
    return policy


def _leftovers(parent, keep: set[str]) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name not in keep)


def test_act_policy_round_trip(tmp_path):
    policy = _trained_act_policy()
    out = export_policy(policy, tmp_path / "final", step=7, metadata={"env": "simpop/PersuasionAct-v0"})
    assert out == (tmp_path / "final").absolute()
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, "policy.pt"])
    manifest = read_manifest(out)
    assert manifest["kind"] == "act-mlp" and manifest["hf_model"] is False
    assert "not a Hugging Face model" in manifest["note"]
    assert (manifest["init_args"], manifest["step"], manifest["env"]) == (
        {"obs_dim": 5, "n_actions": 3, "hidden_size": 7}, 7, "simpop/PersuasionAct-v0")
    assert manifest["class"] == "simpop.agents.policy:ActPolicy"
    loaded = load_exported(out)
    assert isinstance(loaded, ActPolicy)
    original, restored = policy.state_dict(), loaded.state_dict()
    assert original.keys() == restored.keys() and all(torch.equal(original[k], restored[k]) for k in original)
    obs = np.random.default_rng(0).normal(size=(16, 5))
    for p in (loaded, policy):
        p.reset_batch([None] * 16, [np.random.default_rng(3)] * 16)
    assert loaded.act_batch(list(obs), list(range(16))) == policy.act_batch(list(obs), list(range(16)))
    # policy.pt is a plain state_dict: loadable without simpop's loader
    plain = torch.load(out / "policy.pt", weights_only=True)
    assert all(torch.equal(plain[k], original[k]) for k in original)


def test_other_torch_modules_need_init_args_to_load(tmp_path):
    module = TinyActor(4, 2)
    out = export_policy(module, tmp_path / "with", init_args={"obs_dim": 4, "n_actions": 2})
    assert read_manifest(out)["class"] == f"{__name__}:TinyActor"
    loaded = load_exported(out)
    assert isinstance(loaded, TinyActor) and torch.equal(loaded.head.weight, module.head.weight)
    bare = export_policy(module, tmp_path / "without")
    with pytest.raises(ValueError, match="exported without init_args; build it yourself"):
        load_exported(bare)


def test_refusals(tmp_path):
    with pytest.raises(TypeError, match="cannot export a dict"):
        export_policy({}, tmp_path / "x")
    with pytest.raises(ValueError, match="not a simpop export"):
        read_manifest(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        export_policy(_trained_act_policy(), tmp_path / "taken")
    assert (tmp_path / "taken" / "mine.txt").read_text() == "keep me"
    future = tmp_path / "future"
    future.mkdir()
    (future / MANIFEST).write_text(json.dumps({"format": "simpop-export", "format_version": 99}))
    with pytest.raises(ValueError, match="upgrade simpop"):
        load_exported(future)


def test_overwrite_replaces_a_complete_export(tmp_path):
    first = export_policy(ActPolicy(5, 3, 7, seed=1), tmp_path / "final", step=1)
    export_policy(_trained_act_policy(), tmp_path / "final", step=2, overwrite=True)
    assert read_manifest(first)["step"] == 2 and _leftovers(tmp_path, {"final"}) == []


def test_a_failure_mid_write_leaves_no_partial_folder(tmp_path, monkeypatch):
    def half_written(obj, path, *args, **kwargs):
        open(path, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", half_written)
    with pytest.raises(OSError, match="disk full"):
        export_policy(_trained_act_policy(), tmp_path / "final")
    assert _leftovers(tmp_path, set()) == []  # neither final/ nor the temporary folder

    monkeypatch.undo()
    kept = export_policy(ActPolicy(5, 3, 7, seed=1), tmp_path / "final", step=1)
    before = (kept / "policy.pt").read_bytes()
    monkeypatch.setattr(torch, "save", half_written)
    with pytest.raises(OSError, match="disk full"):
        export_policy(_trained_act_policy(), tmp_path / "final", step=2, overwrite=True)
    assert (kept / "policy.pt").read_bytes() == before and read_manifest(kept)["step"] == 1  # the old export stays
    assert _leftovers(tmp_path, {"final"}) == []


# ------------------------------------------------------------------- an HF model (the one-layer tiny Llama)
HELLO = [{"role": "user", "content": "Would you give to a children's charity?"}]


@pytest.fixture(scope="module")
def lora_policy(one_torch_thread, tiny_model):
    """A LoRA LLMPolicy on an HF model (export is plumbing: the tiny Llama does), trained two SGD steps, sharing its base with a simulator's
    adapter (which must not leak into the export)."""
    from simpop.agents.base import SamplingParams
    from simpop.agents.policy import LLMPolicy
    from simpop.agents.transformers_backend import TransformersBackend

    backend = TransformersBackend(tiny_model)
    backend.add_adapter("sim0", r=4, alpha=8)
    with torch.no_grad():
        for p in backend.parameters("sim0"):
            p.add_(0.05)  # a very different simulator adapter
    policy = LLMPolicy(backend, SamplingParams(max_new_tokens=8, temperature=0.7, logprobs=True), lora=True,
                       lora_r=4, lora_alpha=8)
    generation = policy.generate_ids([backend.encode_chat(HELLO)], policy.sampling)[0]
    sequence = [generation.prompt_ids + generation.token_ids]
    mask = [[0] * len(generation.prompt_ids) + [1] * len(generation.token_ids)]
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    for _ in range(2):
        optimizer.zero_grad()
        policy.score(sequence, mask).logprobs.sum().backward()
        optimizer.step()
    return policy


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def _live(policy, ids) -> torch.Tensor:
    policy.lora.activate()
    return _logits(policy.backend.model, ids)


def test_lora_policy_exports_a_merged_hf_model(lora_policy, tmp_path):
    from transformers import AutoModelForCausalLM

    from simpop.agents.transformers_backend import TransformersBackend

    backend = lora_policy.backend
    ids = backend.encode_chat(HELLO)
    live = _live(lora_policy, ids)
    with backend.disabled_adapters():
        base = _logits(backend.model, ids)
    assert (live - base).abs().max() > 0.05  # the adapter was trained: the test can tell merged from base
    weights = lora_policy.state_dict()
    backend.set_adapter("sim0")

    out = export_policy(lora_policy, tmp_path / "final", step=2)

    # the live model is untouched: still adapters (not merged), same weights, same active adapter
    assert backend.active_adapter == "sim0" and backend.adapter_names == ["sim0", "policy"]
    assert all(torch.equal(weights[k], v) for k, v in lora_policy.state_dict().items())
    assert torch.allclose(_live(lora_policy, ids), live, atol=0, rtol=0)

    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", MANIFEST} <= files
    assert not any(name.startswith("adapter_") for name in files)
    manifest = read_manifest(out)
    assert (manifest["kind"], manifest["merged"], manifest["adapter"], manifest["step"]) == (
        "merged", True, "policy", 2)
    assert manifest["base_model"] == str(backend.path) and manifest["sampling"]["temperature"] == 0.7

    exported = AutoModelForCausalLM.from_pretrained(out)
    assert not any("lora" in name for name, _ in exported.named_parameters())
    # Merging W + BA rounds differently from applying BA on the side: equal up to float32 round-off, which grows
    # with the activations through the layers, so it is bounded relative to the logits' scale (a fixed atol of 1e-3
    # failed once, at 1.2e-3 on logits of scale ~25); still 20x below the adapter's effect checked above.
    atol = 1e-4 * float(live.abs().max())
    torch.testing.assert_close(_logits(exported, ids), live, rtol=1e-4, atol=atol)
    reloaded = load_exported(out)  # simpop's own loader: an LLMPolicy on a TransformersBackend
    assert isinstance(reloaded.backend, TransformersBackend) and reloaded.sampling == lora_policy.sampling
    assert reloaded.backend.encode_chat(HELLO) == ids  # the tokenizer and its chat template came along
    torch.testing.assert_close(_logits(reloaded.backend.model, ids), live, rtol=1e-4, atol=atol)


def test_lora_policy_exports_a_peft_adapter_with_its_base(lora_policy, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    backend = lora_policy.backend
    ids = backend.encode_chat(HELLO)
    live = _live(lora_policy, ids)
    out = export_policy(lora_policy, tmp_path / "adapter", merge=False)
    files = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", MANIFEST} <= files
    assert "model.safetensors" not in files
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(backend.path) and config["r"] == 4
    assert read_manifest(out)["kind"] == "adapter" and read_manifest(out)["base_model"] == str(backend.path)

    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(backend.path), out)
    assert (_logits(peft_model, ids) - live).abs().max() < 1e-5
    assert (_logits(AutoModelForCausalLM.from_pretrained(out), ids) - live).abs().max() < 1e-5  # base from config
    reloaded = load_exported(out)  # base + adapter, still a (trainable) LoRA policy
    assert reloaded.adapter == "policy" and reloaded.backend.adapter_names == ["policy"]
    assert all(torch.equal(v, lora_policy.state_dict()[k]) for k, v in reloaded.state_dict().items())


def test_full_fine_tune_exports_its_weights(tmp_path, one_torch_thread, tiny_model):
    from transformers import AutoModelForCausalLM

    from simpop.agents.policy import LLMPolicy
    from simpop.agents.transformers_backend import TransformersBackend

    policy = LLMPolicy(TransformersBackend(tiny_model, trainable=True))
    with torch.no_grad():
        policy.backend.model.model.layers[0].mlp.down_proj.weight.mul_(1.5)  # "trained"
    ids = policy.backend.encode_chat(HELLO)
    live = _logits(policy.backend.model, ids)
    out = export_policy(policy, tmp_path / "full", merge=True)  # nothing to merge
    assert read_manifest(out)["kind"] == "full" and read_manifest(out)["adapter"] is None
    assert (_logits(AutoModelForCausalLM.from_pretrained(out), ids) - live).abs().max() < 1e-5
