"""The preallocated generation cache: same keys, values and tokens as transformers' own cache."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from simpop.agents.kv_buffer import BufferedLayer, PrefixCache, batched_cache, cache_argument, cached_length

SIZES = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=50, max_position_embeddings=128)


def test_buffered_layer_writes_in_place_and_matches_a_dynamic_layer():
    buffered, dynamic = BufferedLayer(capacity=6), DynamicLayer()
    chunks = [torch.randn(2, 3, n, 4) for n in (3, 2, 1, 4)]  # the last one overflows the capacity
    pointers = []
    for chunk in chunks:
        keys, values = buffered.update(chunk, -chunk)
        expected_keys, expected_values = dynamic.update(chunk, -chunk)
        assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
        pointers.append(keys.data_ptr())
    assert pointers[0] == pointers[1] == pointers[2] != pointers[3]  # moved only when full
    assert buffered.get_seq_length() == 10 and buffered.capacity == 12  # grew geometrically
    for layer in (buffered, dynamic):  # transformers' own edits of the views still compose with update
        layer.crop(-3)
        layer.batch_select_indices(torch.tensor([1]))
    extra = torch.randn(1, 3, 2, 4)
    assert torch.equal(buffered.update(extra, extra)[0], dynamic.update(extra, extra)[0])
    assert buffered.keys.shape == (1, 3, 9, 4)


@pytest.mark.parametrize("model_class, config_class", [
    (transformers.LlamaForCausalLM, transformers.LlamaConfig),
    (transformers.MistralForCausalLM, transformers.MistralConfig),  # sliding window: transformers' layers
])
def test_generation_from_a_batched_cache_equals_a_full_read(model_class, config_class):
    torch.manual_seed(0)
    config = config_class(**SIZES, **({"sliding_window": 64} if config_class is transformers.MistralConfig else {}))
    model = model_class(config).eval()
    name = cache_argument(model)  # `cache` from transformers 5.24, `past_key_values` before
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    reuse = [4, 2]  # each row's first tokens come from a cached prefix
    settings = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        prefixes = []
        for prompt, n in zip(prompts, reuse):
            out = model(input_ids=torch.tensor([prompt[:n]]), use_cache=True)
            prefixes.append([(layer.keys[0], layer.values[0]) for layer in getattr(out, name).layers])
        past, suffix = max(reuse), max(len(p) - n for p, n in zip(prompts, reuse))
        ids = torch.zeros((2, past + suffix), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (prompt, n) in enumerate(zip(prompts, reuse)):  # [pad][prefix][pad][suffix]
            ids[row, past - n : past], ids[row, past + suffix - len(prompt) + n :] = (
                torch.tensor(prompt[:n]), torch.tensor(prompt[n:]))
            mask[row, past - n : past] = mask[row, past + suffix - len(prompt) + n :] = 1
        cache = batched_cache(config, prefixes, past, past + suffix + 5)
        layer_type = BufferedLayer if config_class is transformers.LlamaConfig else DynamicSlidingWindowLayer
        assert all(type(layer) is layer_type for layer in cache.layers)
        cached = model.generate(input_ids=ids, attention_mask=mask, **{name: cache}, **settings)[:, past + suffix:]
        for row, prompt in enumerate(prompts):
            full = model.generate(input_ids=torch.tensor([prompt]), **settings)[0, len(prompt):]
            assert cached[row].tolist() == full.tolist()
    no_prefix = batched_cache(config, [None, None], 0, 8)  # sliding windows: transformers builds its own
    assert (no_prefix is None) == (layer_type is DynamicSlidingWindowLayer)


def test_cache_argument_names_the_installed_transformers_cache_and_the_name_before_5_24():
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` (arguments and outputs); GPU images and vLLM 0.32's
    pin have older versions, where passing ``cache=`` to ``generate`` is an error (seen on a GPU machine)."""
    import peft

    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES))
    name = cache_argument(model)
    out = model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    assert getattr(out, name) is not None and name in {"cache", "past_key_values"}
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert cache_argument(wrapped) == name  # read through a PEFT wrapper's *args/**kwargs forward

    class Older(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=None):
            raise NotImplementedError

    assert cache_argument(Older()) == "past_key_values"


def test_prefix_cache_keeps_one_entry_per_dialogue_within_its_memory_bound():
    def kv(tokens: int):  # 64 bytes a token
        return [(torch.zeros(2, tokens, 4), torch.zeros(2, tokens, 4))]

    cache = PrefixCache(size=8, max_bytes=64 * 20)
    cache.remember("a", [1, 2, 3], kv(3))
    cache.remember("a", [1, 2, 3, 4, 5], kv(5))  # the dialogue's next turn replaces its entry
    cache.remember("b", [1, 2, 3], kv(3))  # another view (adapter) keeps its own
    assert list(cache.entries) == [("a", (1, 2, 3, 4, 5)), ("b", (1, 2, 3))] and cache.bytes == 64 * 8
    assert cached_length(cache.longest("a", [1, 2, 3, 9])) == 3 and cache.longest("a", [7, 1]) is None
    assert cached_length(cache.longest("a", [1, 2, 3, 4, 5])) == 4  # the prompt's last token is always read
    cache.remember("a", [7] * 14, kv(14))  # past the memory bound: the least recently used goes
    assert list(cache.entries) == [("a", (1, 2, 3, 4, 5)), ("a", (7,) * 14)] and cache.bytes == 64 * 19
    cache.check("weights 1")
    cache.check("weights 1")
    assert not cache.entries and cache.bytes == 0  # dropped once, when the weights changed
    with pytest.raises(ValueError, match="size >= 1 and max_bytes >= 1"):
        PrefixCache(size=0)
