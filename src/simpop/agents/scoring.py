"""Token log-probabilities with gradient, the backend's training-side view (:class:`Scoring`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


#: Padded tokens per micro-batch of :meth:`TransformersBackend.token_logprobs` (default); above it, a pass with
#: gradients checkpoints its layers. SmolLM2 in float32 keeps ~1.8 MB a token for backward: ~1.9 GB at most.
TOKEN_BUDGET = 1024
#: Vocabulary columns per tile of the chunked log-prob (a [4096, tile] buffer: 128 MB in float32).
_VOCAB_TILE = 8192


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Row indices grouped so that each group's padded size (rows x its longest) stays within ``budget``
    tokens: filled longest rows first, a row longer than ``budget`` in a group of its own; indices ascend
    within a group (one group is the rows in their order)."""
    groups: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(index)
        else:
            groups.append([index])
    return [sorted(group) for group in groups]


@dataclass
class TokenScores:
    """Per-token scores of padded sequences; index ``[b, t]`` scores token ``t`` of sequence ``b``.

    Attributes:
        logprobs: ``log p(seq[t] | seq[:t])``, float32, shape ``[B, T]`` (0 where ``mask`` is 0).
        entropies: Entropy of the next-token distribution that produced token ``t``, shape ``[B, T]``
            (values without gradient).
        mask: 1.0 for scored tokens (not the first token, not padding, selected by the caller's mask).
    """

    logprobs: torch.Tensor
    entropies: torch.Tensor
    mask: torch.Tensor


class Scoring:
    """Scoring of a :class:`~simpop.agents.transformers_backend.TransformersBackend`: :meth:`token_logprobs`."""

    def token_logprobs(self: Any, sequences: list[list[int]], masks: list[list[int]] | None = None,
                       temperature: float = 1.0, token_budget: int | None = None) -> TokenScores:
        """Log-probabilities and entropies of the masked tokens of ``sequences``, micro-batched.

        Runs under the caller's autograd mode: gradients flow to trainable weights (the active LoRA
        adapter, or all weights when ``trainable=True``) through the log-probs; entropies are values
        only (no graph). Wrap in ``torch.no_grad()`` for old-policy or reference passes.

        Memory: the LM head runs only at scored positions, through TRL's chunked linear log-prob
        (``trl.kernels.ChunkedLogProbFunction``: vocabulary tiles folded into a running log-sum-exp,
        recomputed tile by tile in backward), so no ``[tokens, vocabulary]`` logits exist. Rows are
        scored in micro-batches of at most ``token_budget`` padded tokens (longest first; a longer row
        alone). With gradients and more than ``checkpoint_tokens`` padded tokens in all, every decoder layer
        is checkpointed (transformers' activation checkpointing: only each layer's input is kept, and a
        layer's activations are recomputed in backward, one layer of one micro-batch at a time; one
        more forward pass), so the kept activations shrink ~25x (SmolLM2: ~1.8 MB a token without,
        ~70 KB with). Run ``backward`` before switching adapters: the recompute must see the same
        adapter (checked: an error otherwise).

        Args:
            sequences: Full token id sequences (prompt + completion, or a whole multi-turn dialogue).
            masks: Optional per-token 0/1 masks, same lengths as ``sequences``; 1 marks tokens to score
                (e.g. the trained seat's tokens), 0 tokens to ignore (prompt, other seat).
            temperature: Score under logits / temperature, the distribution that sampled
                (``generate_ids`` log-probs at temperature T match ``token_logprobs(..., temperature=T)``).
            token_budget: Padded tokens per micro-batch (default: the backend's ``token_budget``).
        """
        import torch

        if not sequences or any(len(s) < 2 for s in sequences):
            raise ValueError("token_logprobs needs at least one sequence, each of at least 2 tokens")
        if masks is not None and [len(m) for m in masks] != [len(s) for s in sequences]:
            raise ValueError("masks must have one 0/1 entry per token of the matching sequence")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        budget = self.token_budget if token_budget is None else token_budget
        if budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {budget}")
        # Token 0 has no prediction; [b, t] scores token t of sequence b.
        positions = [[t for t in range(1, len(s)) if masks is None or masks[row][t]] for row, s in enumerate(sequences)]
        groups = [g for g in micro_batches([len(s) for s in sequences], budget) if any(positions[i] for i in g)]
        padded = sum(len(g) * max(len(sequences[i]) for i in g) for g in groups)
        threshold = budget if self.checkpoint_tokens is None else self.checkpoint_tokens
        checkpointed = torch.is_grad_enabled() and padded > threshold
        with self._checkpointed_layers(checkpointed):
            parts = [self._score_rows([sequences[i] for i in g], [positions[i] for i in g], temperature, checkpointed)
                     for g in groups]
        rows = torch.tensor([i for g in groups for i in g for _ in positions[i]], dtype=torch.long, device=self.device)
        columns = torch.tensor([t for g in groups for i in g for t in positions[i]], dtype=torch.long,
                               device=self.device)
        shape = (len(sequences), max(map(len, sequences)))
        zeros = torch.zeros(shape, device=self.device)
        if not parts:  # nothing to score
            return TokenScores(logprobs=zeros, entropies=zeros.clone(), mask=zeros.clone())
        return TokenScores(
            logprobs=zeros.index_put((rows, columns), torch.cat([p[0] for p in parts]).float()),
            entropies=zeros.index_put((rows, columns), torch.cat([p[1] for p in parts]).float()),
            mask=zeros.index_put((rows, columns), torch.ones(len(rows), device=self.device)),
        )

    @contextlib.contextmanager
    def _checkpointed_layers(self: Any, enabled: bool) -> Iterator[None]:
        """Within: transformers' activation checkpointing of every decoder layer (``enabled``)."""
        if not enabled:
            yield
            return
        model = self.model.get_base_model() if self._is_peft() else self.model
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable({"use_reentrant": False})
        # Layers checkpoint only while their own training flag is set: set just that flag, so that their
        # submodules stay in eval mode (no dropout) and scoring sees the model that generates.
        flagged = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
        for module in flagged:
            module.training = True
        try:
            yield
        finally:
            for module in flagged:
                module.training = False

    def _score_rows(
        self: Any, sequences: list[list[int]], positions: list[list[int]], temperature: float, checkpointed: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs (with graph) and entropies (values) of tokens ``positions[r]`` of ``sequences[r]``,
        flattened row by row, in one right-padded forward pass."""
        import torch
        from trl.kernels import ChunkedLogProbFunction

        width = max(map(len, sequences))
        input_ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)
        valid = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, sequence in enumerate(sequences):  # right padding: positions start at 0 for every row
            input_ids[row, : len(sequence)] = torch.tensor(sequence)
            valid[row, : len(sequence)] = 1
        input_ids, valid = input_ids.to(self.device), valid.to(self.device)
        model = self.model.get_base_model() if self._is_peft() else self.model  # LoRA layers sit inside it
        hidden = model.base_model(input_ids=input_ids, attention_mask=valid, use_cache=False).last_hidden_state
        if checkpointed:  # backward recomputes the layers: with the adapter view of this forward only
            hidden.register_hook(functools.partial(self._check_view, self._view()))
        rows = torch.tensor([r for r, p in enumerate(positions) for _ in p], dtype=torch.long, device=self.device)
        columns = torch.tensor([t for p in positions for t in p], dtype=torch.long, device=self.device)
        head = model.get_output_embeddings()
        config = model.config.get_text_config()
        logprobs, entropies, *_ = ChunkedLogProbFunction.apply(
            hidden[rows, columns - 1], head.weight, head.bias, input_ids[rows, columns], temperature, _VOCAB_TILE,
            getattr(config, "final_logit_softcapping", None), getattr(config, "logit_scale", None) or 1.0,
            ("entropy",),
        )
        return logprobs, entropies.detach()

    def _check_view(self: Any, view: tuple, grad: torch.Tensor) -> None:
        if self._view() != view:
            raise RuntimeError(f"token_logprobs ran with adapter view {view} but its backward (which recomputes "
                               f"the layers) runs with {self._view()}: call backward before switching adapters")
