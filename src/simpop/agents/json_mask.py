"""Structured output of the in-process backend: with ``SamplingParams(json_schema=...)`` every row of the batch is
decoded under the schema with `llguidance <https://github.com/guidance-ai/llguidance>`_ (the grammar engine of vLLM's
``guidance`` structured-output backend): a logits processor masks, per row and step, the tokens that
cannot continue a valid document, so a completion that ends at end-of-turn is valid JSON for the schema
(one cut by ``max_new_tokens`` or a stop string is a valid prefix). ``benchmarks/verbalized_parse.py``
compares it with xgrammar, lm-format-enforcer and outlines. It composes with left padding, the prefix
cache and the CPU attention path: it reads only the last sampled token of each row and touches nothing
but the next-token scores.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from llguidance._lib import JsonCompileOptions


#: JSON layout of constrained completions: no free whitespace (a small model fills it with newlines),
#: and the separators of ``json.dumps``, the layout models see most.
_JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class JSONSchemaMask:
    """A ``generate()`` logits processor: each row may only continue a JSON document valid for a schema.

    One llguidance matcher per row follows that row's sampled tokens; at each step the scores of tokens
    it rejects become ``-inf`` (end-of-turn is allowed exactly when the document is complete, and then
    only end-of-turn). A row whose matcher failed (generation appended padding to a row that a stop
    string ended) is left unmasked: ``generate()`` discards its tokens. Good for one ``generate()`` call.

    Args:
        tokenizer: llguidance's view of the model's tokenizer.
        grammar: llguidance grammar (``LLMatcher.grammar_from_json_schema``).
        rows: Batch rows.
        vocab_size: Width of the model's scores.
    """

    def __init__(self, tokenizer, grammar: str, rows: int, vocab_size: int) -> None:
        import llguidance
        import llguidance.torch
        import torch

        self._fill = llguidance.torch.fill_next_token_bitmask
        self.matchers = [llguidance.LLMatcher(tokenizer, grammar, log_level=0) for _ in range(rows)]
        if self.matchers[0].is_error():
            raise ValueError(f"json_schema cannot be used: {self.matchers[0].get_error()}")
        self.vocab_size = vocab_size
        self.bitmask = torch.full(llguidance.torch.get_bitmask_shape(rows, vocab_size), -1, dtype=torch.int32)
        self._bits = torch.arange(32, dtype=torch.int32)
        self._started = False

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._started:  # every row's last token was sampled under this mask: the matcher follows it
            for matcher, token in zip(self.matchers, input_ids[:, -1].tolist()):
                if not (matcher.is_stopped() or matcher.is_error()):
                    matcher.consume_token(token)
        self._started = True
        for row, matcher in enumerate(self.matchers):
            if matcher.is_error():
                self.bitmask[row] = -1
            else:  # a complete document (a stopped matcher) allows end-of-turn only
                self._fill(matcher, self.bitmask, row)
        allowed = (self.bitmask.unsqueeze(-1) >> self._bits) & 1  # [rows, words, 32], little-endian bits
        allowed = allowed.view(len(self.matchers), -1)[:, : scores.shape[-1]].to(scores.device, non_blocking=True)
        return scores.masked_fill(allowed == 0, float("-inf"))

    @property
    def errors(self) -> list[str]:
        """The matchers' errors (empty when every row followed the schema)."""
        return [m.get_error() for m in self.matchers if m.is_error()]


class SchemaGrammars:
    """The llguidance tokenizer and grammars of a :class:`~simpop.agents.transformers_backend.TransformersBackend`."""

    def _llg(self):
        """llguidance's tokenizer for this model (built once, ~0.3 s)."""
        if self._llg_tokenizer is None:
            try:
                import llguidance.hf
            except ImportError as error:
                raise ImportError("json_schema (constrained decoding) needs llguidance: pip install simpop[llm]") \
                    from error
            self._llg_tokenizer = llguidance.hf.from_tokenizer(
                self.tokenizer, n_vocab=self.vocab_size,
                eos_token=self.eos_token_ids if len(self.eos_token_ids) > 1 else self.eos_token_ids[0])
        return self._llg_tokenizer

    def _grammar(self: Any, schema: dict) -> str:
        """The llguidance grammar of ``schema`` (validated; the last 32 are kept)."""
        import llguidance

        key = json.dumps(schema, sort_keys=True)
        if key not in self._grammars:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_LAYOUT)
            failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self._llg())
            if failed:
                raise ValueError(f"json_schema cannot be used for constrained decoding: {messages[0]}")
            self._grammars[key] = grammar
            while len(self._grammars) > 32:
                self._grammars.popitem(last=False)
        self._grammars.move_to_end(key)
        return self._grammars[key]
