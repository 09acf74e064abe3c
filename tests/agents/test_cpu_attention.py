"""Packed decoding attention: the same outputs as transformers' SDPA, padding and all."""

from __future__ import annotations

import torch
import transformers

from simpop.agents.cpu_attention import NAME, pack_decode_queries


def _logits(model, ids, mask):
    """Logits of a prefill over ``ids[:, :-2]`` then two one-token decoding steps."""
    with torch.no_grad():
        out = model(input_ids=ids[:, :-2], attention_mask=mask[:, :-2], use_cache=True)
        logits = [out.logits]
        for end in (-1, None):
            position = ids.shape[1] + (end or 0) - 1
            out = model(input_ids=ids[:, position:end or None], attention_mask=mask[:, :end],
                        cache=out.past_key_values, use_cache=True)
            logits.append(out.logits)
    return torch.cat(logits, dim=1)


def test_packed_decoding_equals_sdpa_with_and_without_padding():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    model = transformers.LlamaForCausalLM(config).eval()
    assert model.config._attn_implementation == "sdpa"
    ids = torch.randint(1, 50, (2, 9))
    padded = torch.ones_like(ids)
    padded[1, :4] = 0  # left padding: row 1 is 5 tokens long
    expected = {name: _logits(model, ids, mask) for name, mask in (("padded", padded), ("full", torch.ones_like(ids)))}
    pack_decode_queries(model)
    assert model.config._attn_implementation == NAME
    for name, mask in (("padded", padded), ("full", torch.ones_like(ids))):
        got = _logits(model, ids, mask)
        real = mask.bool()  # padded positions' outputs are meaningless in both
        assert torch.allclose(got[real], expected[name][real], atol=1e-5), name
    # Padding matters: the padded row's real tokens see a different past than the unpadded row's.
    assert not torch.allclose(expected["padded"][1, -1], expected["full"][1, -1], atol=1e-3)
