"""LoRAAdapter: one named adapter on a shared trainable backend (the one-layer ``tiny_model``: plumbing)."""

from __future__ import annotations

import pytest
import torch

from simpop.agents.base import SamplingParams, TrainableBackend
from simpop.agents.lora import LoRAAdapter
from simpop.agents.transformers_backend import TransformersBackend

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HELLO = [{"role": "user", "content": "Say hello."}]
PARAMS = SamplingParams(max_new_tokens=6)


def _push_away(adapter: LoRAAdapter, generation) -> None:
    """Two SGD steps lowering the likelihood of ``generation`` under ``adapter`` (so that its greedy reply changes)."""
    adapter.activate()
    optimizer = torch.optim.SGD(adapter.parameters(), lr=0.5)
    sequence = [generation.prompt_ids + generation.token_ids]
    mask = [[0] * len(generation.prompt_ids) + [1] * len(generation.token_ids)]
    for _ in range(2):
        optimizer.zero_grad()
        adapter.backend.token_logprobs(sequence, mask).logprobs.sum().backward()
        optimizer.step()


def test_adapter_trains_copies_saves_and_disables(one_torch_thread, tiny_model):
    backend = TransformersBackend(tiny_model)
    assert isinstance(backend, TrainableBackend)
    base = backend.generate([HELLO], PARAMS)[0]
    policy = LoRAAdapter(backend, "policy", r=4, alpha=8)
    sim = LoRAAdapter(backend, "sim0")
    assert backend.adapter_names == ["policy", "sim0"] and backend.model.peft_config["policy"].r == 4
    assert LoRAAdapter(backend, "sim0").parameters() == sim.parameters()  # an existing adapter is reused
    assert not {id(p) for p in policy.parameters()} & {id(p) for p in sim.parameters()}

    _push_away(sim, base)
    trained = backend.generate([HELLO], PARAMS)[0]
    assert backend.active_adapter == "sim0" and trained.token_ids != base.token_ids
    with sim.disabled():  # the KL reference: the base model, every adapter off
        assert backend.generate([HELLO], PARAMS)[0].token_ids == base.token_ids
    policy.activate()
    assert backend.generate([HELLO], PARAMS)[0].token_ids == base.token_ids  # untouched by sim0's training

    # A copy holds the current weights, is frozen, and leaves the active adapter as it was.
    frozen = sim.copy("sim0_s0")
    assert backend.active_adapter == "policy" and list(sim.copies()) == ["sim0_s0"]
    assert all(not p.requires_grad for p in frozen.parameters())
    assert all(torch.equal(a, b) for a, b in zip(frozen.state_dict().values(), sim.state_dict().values()))
    frozen.activate()
    assert backend.generate([HELLO], PARAMS)[0].token_ids == trained.token_ids
    _push_away(sim, trained)  # later training does not move the copy
    frozen.activate()
    assert backend.generate([HELLO], PARAMS)[0].token_ids == trained.token_ids

    # state_dict / load_state_dict: detached CPU copies that restore the weights exactly.
    saved = sim.state_dict()
    assert saved and all(not v.requires_grad and v.device.type == "cpu" for v in saved.values())
    spare = LoRAAdapter(backend, "spare", r=4, alpha=8).state_dict()  # same shapes as policy's, other weights
    assert not all(torch.equal(spare[k], v) for k, v in policy.state_dict().items())
    policy.load_state_dict(spare)
    assert all(torch.equal(spare[k], v) for k, v in policy.state_dict().items())
    fresh = LoRAAdapter(backend, "sim1")
    fresh.load_state_dict(frozen.state_dict())
    fresh.activate()
    assert backend.generate([HELLO], PARAMS)[0].token_ids == trained.token_ids
    with pytest.raises(ValueError, match="do not fit adapter 'sim1'"):
        fresh.load_state_dict({"base_model.model.nowhere.lora_A.weight": torch.zeros(1)})
