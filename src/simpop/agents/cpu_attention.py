"""Decoding attention for grouped-query models on a CPU.

When a decoding step has no attention mask (no padding), transformers' SDPA attention asks torch for
grouped-query attention (``enable_gqa=True``); torch's CPU kernels run that 5-8x slower in bfloat16
than the equivalent call on a packed query (the query heads of each key/value head laid out as query
positions), which transformers already uses whenever a mask is present. :func:`pack_decode_queries`
makes a CPU model take the packed path for every decoding step.
"""

from __future__ import annotations

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

NAME = "simpop_cpu_sdpa"
#: Attend to every position (broadcast over batch, heads and keys); CPU only, like the whole module.
_ALL_POSITIONS = torch.ones((1, 1, 1, 1), dtype=torch.bool)


def packed_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention, with an all-true mask on unmasked grouped-query decoding steps."""
    if attention_mask is None and query.shape[2] == 1 and getattr(module, "num_key_value_groups", 1) > 1:
        attention_mask = _ALL_POSITIONS
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def pack_decode_queries(model: transformers.PreTrainedModel) -> None:
    """Route ``model``'s attention through :func:`packed_sdpa` if it runs SDPA on a CPU (its masks stay
    those of SDPA: without a registered mask function transformers would build none, ignoring padding)."""
    if model.device.type == "cpu" and model.config._attn_implementation == "sdpa":
        transformers.AttentionInterface.register(NAME, packed_sdpa)
        transformers.AttentionMaskInterface.register(NAME, sdpa_mask)
        model.set_attn_implementation(NAME)
