"""The in-process backend's KV caches: within one ``generate`` call, and across calls.

Within a call: transformers' default cache grows each layer by concatenation, so every decoding step copies the
whole cache once per layer; for a batch of dialogues on a CPU that copy costs more than the model's matrix products.
:func:`batched_cache` allocates each layer's keys and values once, for the call's final length, and a step writes
only its new position. Rows may start from cached prefixes, held right-aligned in the first ``past`` positions.

Across calls: :class:`PrefixCache` keeps the keys and values of generated sequences, so that a later prompt that
extends one (the next turn of a dialogue) reads only its new tokens.

Imported lazily by :class:`~simpop.agents.transformers_backend.TransformersBackend` (needs transformers).
"""

from __future__ import annotations

import inspect
import os
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch
import transformers
from transformers.cache_utils import DynamicLayer

#: Keys and values of one sequence, per layer, each of shape ``[kv_heads, tokens, head_dim]``.
LayerCache = list[tuple[torch.Tensor, torch.Tensor]]


class BufferedLayer(DynamicLayer):
    """A :class:`DynamicLayer` whose ``keys``/``values`` are views of buffers of ``capacity`` positions.

    Appending writes in place; appending past the capacity, or after transformers replaced the views
    (``crop``, ``batch_select_indices``), moves the cache to a new buffer first, so every
    :class:`DynamicLayer` operation keeps working.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Allocate the layer's buffers for the dtype and device of the first states it sees."""
        self.device = key_states.device
        self._allocate(key_states[:, :, :0], value_states[:, :, :0])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append new key/value states in place (the buffer grows geometrically when full); returns the layer's keys
        and values so far.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self.capacity:
            self.capacity = max(2 * self.capacity, end)  # grow geometrically: few moves
        if not self._is_view(self.keys, self._keys) or end > self._keys.shape[-2]:
            self._allocate(self.keys, self.values)
        self._keys[:, :, start:end] = key_states
        self._values[:, :, start:end] = value_states
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def _allocate(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """New buffers of ``capacity`` positions (or more, to hold them) that start with ``keys``/``values``."""
        length = keys.shape[-2]
        capacity = max(self.capacity, length)
        self._keys = keys.new_empty((*keys.shape[:2], capacity, keys.shape[3]))
        self._values = values.new_empty((*values.shape[:2], capacity, values.shape[3]))
        self._keys[:, :, :length] = keys
        self._values[:, :, :length] = values
        self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]

    @staticmethod
    def _is_view(view: torch.Tensor, buffer: torch.Tensor | None) -> bool:
        return (
            buffer is not None
            and view.data_ptr() == buffer.data_ptr()
            and view.shape[:2] == buffer.shape[:2]
            and view.stride() == buffer.stride()
        )


def cache_argument(model) -> str:
    """The name transformers gives ``model``'s KV cache, as a ``forward``/``generate`` argument and an output field:
    ``cache`` from transformers 5.24, ``past_key_values`` before (GPU images and vLLM 0.32's pin have older ones).
    ``model`` may be PEFT-wrapped."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def batched_cache(
    config, prefixes: list[LayerCache | None], past: int, capacity: int
) -> transformers.DynamicCache | None:
    """The cache a ``generate`` call of ``len(prefixes)`` rows starts from, with room for ``capacity``
    positions.

    Row ``r`` holds ``prefixes[r]`` (or nothing) right-aligned in positions ``[0, past)``, zeros before
    it (the caller's attention mask excludes them). Models with layers other than plain full attention
    (sliding windows, ...) get transformers' own layers holding the same prefixes, or None without
    prefixes (``generate`` then builds its own cache).
    """
    rows = [_padded_layer(prefixes, index, past) for index in range(len(_first(prefixes)))] if any(prefixes) else []
    cache = transformers.DynamicCache(config=config)
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return transformers.DynamicCache(rows, config=config) if rows else None
    cache.layers = [BufferedLayer(capacity) for _ in cache.layers]
    for layer, (keys, values) in zip(cache.layers, rows):
        layer.update(keys, values)
    return cache


def _first(prefixes: list[LayerCache | None]) -> LayerCache:
    return next(kv for kv in prefixes if kv)


def _padded_layer(prefixes: list[LayerCache | None], index: int, past: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``index``'s keys and values of every row, right-aligned in ``past`` positions."""
    key0, value0 = _first(prefixes)[index]
    keys = key0.new_zeros((len(prefixes), key0.shape[0], past, key0.shape[2]))
    values = value0.new_zeros((len(prefixes), value0.shape[0], past, value0.shape[2]))
    for row, kv in enumerate(prefixes):
        if kv:
            length = kv[index][0].shape[1]
            keys[row, :, past - length:] = kv[index][0]
            values[row, :, past - length:] = kv[index][1]
    return keys, values


class PrefixCache:
    """Keys and values of token sequences, per model ``view`` (an adapter, or the base), least recently used first.

    A sequence that extends a cached one of its view replaces it (the longer one serves every prompt the shorter
    did), so a dialogue holds one entry, its latest turn; beyond ``size`` entries or ``max_bytes`` bytes the least
    recently used go (a dialogue that ended is not used again). :meth:`check` drops everything when what the keys
    and values depend on (the weights) changed.
    """

    def __init__(self, size: int = 64, max_bytes: int = 2**30) -> None:
        if size < 1 or max_bytes < 1:
            raise ValueError(f"a prefix cache needs size >= 1 and max_bytes >= 1, got {size} and {max_bytes}")
        self.size, self.max_bytes = size, max_bytes
        self.entries: OrderedDict[tuple[Hashable, tuple[int, ...]], LayerCache] = OrderedDict()
        self.bytes = 0
        self._weights: Hashable = None

    def clear(self) -> None:
        """Drop every entry (the model's weights changed, or the caller frees the memory)."""
        self.entries.clear()
        self.bytes = 0

    def check(self, weights: Hashable) -> None:
        """Drop every entry if ``weights`` (a fingerprint of the model's weights) differs from the last one seen."""
        if weights != self._weights:
            self.clear()
            self._weights = weights

    def longest(self, view: Hashable, prompt: Sequence[int]) -> LayerCache | None:
        """Keys and values of the longest start of ``prompt`` (all but its last token at most) that a cached
        sequence of ``view`` begins with."""
        best, length = None, 0
        for key in self.entries:
            if key[0] == view:
                common = min(len(os.path.commonprefix([key[1], tuple(prompt)])), len(prompt) - 1)
                if common > length:
                    best, length = key, common
        if best is None:
            return None
        self.entries.move_to_end(best)
        return [(keys[:, :length], values[:, :length]) for keys, values in self.entries[best]]

    def remember(self, view: Hashable, tokens: Sequence[int], kv: LayerCache) -> None:
        """Keep ``kv``, the keys and values of exactly ``tokens``."""
        key = (view, tuple(tokens))
        for old in [k for k in self.entries if k[0] == view and key[1][: len(k[1])] == k[1]]:
            self._drop(old)
        self.entries[key] = kv
        self.bytes += sum(keys.nbytes + values.nbytes for keys, values in kv)
        while len(self.entries) > 1 and (len(self.entries) > self.size or self.bytes > self.max_bytes):
            self._drop(next(iter(self.entries)))

    def _drop(self, key: tuple[Hashable, tuple[int, ...]]) -> None:
        self.bytes -= sum(keys.nbytes + values.nbytes for keys, values in self.entries.pop(key))


def cached_length(kv: LayerCache | None) -> int:
    """Tokens held by ``kv`` (0 for None)."""
    return 0 if kv is None else kv[0][0].shape[1]
