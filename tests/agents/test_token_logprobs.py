"""Chunked, micro-batched ``token_logprobs`` equals the straightforward full-logits computation it replaced."""

from __future__ import annotations

import platform

import pytest
import torch

from simpop.agents.process_tuning import fix_mmap_threshold
from simpop.agents.scoring import micro_batches
from simpop.agents.transformers_backend import TransformersBackend

PROMPTS = ["Say hello to the new neighbours.", "What is the capital of France?", "Count to five."]
REPLIES = ["Hello, and welcome!", "Paris.", "One, two, three, four, five."]


def test_micro_batches_cover_every_row_once_within_the_budget():
    lengths = [5, 40, 12, 12, 3, 100, 7]
    groups = micro_batches(lengths, budget=36)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        longest = max(lengths[i] for i in group)
        assert len(group) * longest <= 36 or len(group) == 1
    assert [5] in groups and [1] in groups  # longer than the budget: alone
    assert micro_batches(lengths, budget=10_000) == [list(range(len(lengths)))]  # one group: the rows in order


def test_fix_mmap_threshold_applies_exactly_on_glibc():
    assert fix_mmap_threshold() is (platform.libc_ver()[0] == "glibc")


def full_logits_reference(backend, sequences, masks, temperature):
    """The former algorithm: full-vocabulary logits at every position, one padded pass, entropy with graph."""
    width = max(map(len, sequences))
    input_ids = torch.full((len(sequences), width), backend.pad_token_id, dtype=torch.long)
    valid = torch.zeros((len(sequences), width), dtype=torch.long)
    user_mask = torch.zeros((len(sequences), width))
    for row, (sequence, mask) in enumerate(zip(sequences, masks)):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        valid[row, : len(sequence)] = 1
        user_mask[row, : len(mask)] = torch.tensor(mask, dtype=torch.float)
    logits = backend.model(input_ids=input_ids, attention_mask=valid).logits[:, :-1].float() / temperature
    log_probs = logits.log_softmax(-1)
    token_logprobs = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropies = -(log_probs.exp() * log_probs).sum(-1)
    mask = valid[:, 1:].float() * user_mask[:, 1:]
    pad = torch.zeros((len(sequences), 1))
    return (torch.cat([pad, token_logprobs * mask], 1), torch.cat([pad, entropies * mask], 1),
            torch.cat([pad, mask], 1))


def _batch(backend):
    sequences, masks = [], []
    for prompt, reply in zip(PROMPTS, REPLIES):
        prompt_ids = backend.encode_chat([{"role": "user", "content": prompt}])
        reply_ids = backend.tokenizer(reply, add_special_tokens=False)["input_ids"] + backend.eos_token_ids[:1]
        sequences.append(prompt_ids + reply_ids)
        masks.append([0] * len(prompt_ids) + [1] * len(reply_ids))
    masks[2][-3] = 0  # a hole inside a completion (another seat's token)
    return sequences, masks


def assert_gradients_close(got, want):
    """Equal up to float32 summation order (relative to the gradient's scale)."""
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3 * float(want.abs().max()))


def _gradients(backend, parameters, scores, weights):
    for p in parameters:
        p.grad = None
    (scores * weights).sum().backward()
    return [p.grad.clone() for p in parameters]


@pytest.fixture(scope="module")
def lora_backend(one_torch_thread, tiny_model):
    backend = TransformersBackend(tiny_model, dtype="float32")
    backend.add_adapter("first", r=4, alpha=8)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # LoRA B starts at zero (no gradient for A): give both factors weight
        for p in backend.parameters("first"):
            p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    return backend


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_lora_logprobs_entropies_and_gradients_match_the_full_logits_reference(lora_backend, temperature):
    backend = lora_backend
    sequences, masks = _batch(backend)
    params = backend.parameters("first")
    weights = torch.randn(len(sequences), max(map(len, sequences)), generator=torch.Generator().manual_seed(1))
    logprobs, entropies, mask = full_logits_reference(backend, sequences, masks, temperature)
    expected = _gradients(backend, params, logprobs, weights)
    # One micro-batch, one row per (checkpointed) micro-batch, and one checkpointed micro-batch.
    for budget, checkpoint_tokens in ((10_000, None), (1, None), (10_000, 0)):
        backend.checkpoint_tokens = checkpoint_tokens
        try:
            scores = backend.token_logprobs(sequences, masks, temperature=temperature, token_budget=budget)
        finally:
            backend.checkpoint_tokens = None
        assert torch.equal(scores.mask, mask) and not scores.entropies.requires_grad
        torch.testing.assert_close(scores.logprobs, logprobs, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(scores.entropies, entropies.detach(), rtol=1e-4, atol=1e-4)
        for got, want in zip(_gradients(backend, params, scores.logprobs, weights), expected, strict=True):
            assert_gradients_close(got, want)
    with torch.no_grad(), backend.disabled_adapters():
        base = backend.token_logprobs(sequences, masks, temperature=temperature, token_budget=1)
        reference = full_logits_reference(backend, sequences, masks, temperature)[0]
    torch.testing.assert_close(base.logprobs, reference, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(base.logprobs, logprobs.detach())  # the adapter matters


def test_full_finetune_gradients_reach_the_tied_head_and_match(one_torch_thread):
    backend = TransformersBackend("smollm2", dtype="float32", trainable=True)
    sequences, masks = _batch(backend)
    head = backend.model.get_output_embeddings().weight
    layer = backend.model.model.layers[-1].mlp.down_proj.weight
    weights = torch.randn(len(sequences), max(map(len, sequences)), generator=torch.Generator().manual_seed(2))
    expected = _gradients(backend, [head, layer], full_logits_reference(backend, sequences, masks, 0.7)[0], weights)
    scores = backend.token_logprobs(sequences, masks, temperature=0.7, token_budget=1)
    got = _gradients(backend, [head, layer], scores.logprobs, weights)
    for g, want in zip(got, expected, strict=True):
        assert_gradients_close(g, want)


def test_backward_after_switching_adapters_is_an_error(lora_backend):
    backend = lora_backend
    sequences, masks = _batch(backend)
    if "second" not in backend.adapter_names:  # the module's backend: another test may have added it
        backend.add_adapter("second", r=4, alpha=8)
    backend.set_adapter("first")
    scores = backend.token_logprobs(sequences, masks, token_budget=1)  # checkpointed micro-batches
    backend.set_adapter("second")
    with pytest.raises(RuntimeError, match="call backward before switching adapters"):
        scores.logprobs.sum().backward()
    backend.set_adapter("first")


def test_checkpoint_tokens_sets_the_checkpointing_threshold_apart_from_the_budget(lora_backend):
    """Below the micro-batch budget a pass checkpoints only when ``checkpoint_tokens`` says so (its backward then
    recomputes the layers, hence the adapter check)."""
    backend = lora_backend
    sequences, masks = _batch(backend)
    if "second" not in backend.adapter_names:
        backend.add_adapter("second", r=4, alpha=8)
    for checkpoint_tokens, recomputes in ((None, False), (0, True)):
        backend.checkpoint_tokens = checkpoint_tokens
        backend.set_adapter("first")
        scores = backend.token_logprobs(sequences, masks, token_budget=10_000)
        backend.set_adapter("second")
        if recomputes:
            with pytest.raises(RuntimeError, match="call backward before switching adapters"):
                scores.logprobs.sum().backward()
        else:
            scores.logprobs.sum().backward()  # kept activations: nothing is recomputed
    backend.checkpoint_tokens = None
    backend.set_adapter("first")
    with pytest.raises(ValueError, match="checkpoint_tokens must be >= 0"):
        TransformersBackend("smollm2", checkpoint_tokens=-1)
