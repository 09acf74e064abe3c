"""In-process Hugging Face model: batched generation, token log-probs with gradient, LoRA adapters.

``TransformersBackend()`` loads the embedded SmolLM2-135M-Instruct (see :mod:`simpop.agents.embedded`);
``TransformersBackend("/path/to/hf-folder")`` loads any local causal LM. One instance holds one base
model and, for population co-training, any number of LoRA adapters on it::

    backend = TransformersBackend(dtype="bfloat16")
    gens = backend.generate([[{"role": "user", "content": "Hi"}]], SamplingParams(max_new_tokens=16))
    backend.add_adapter("sim0"); backend.add_adapter("sim1")   # the newest adapter is active
    backend.set_adapter("sim0")
    scores = backend.token_logprobs([g.prompt_ids + g.token_ids for g in gens])  # with gradient
    with torch.no_grad(), backend.disabled_adapters():
        reference = backend.token_logprobs(...)                 # the base model, for a KL anchor

An instance is not thread-safe: call it from one thread (``simpop serve`` funnels requests into one
worker thread).

With ``SamplingParams(json_schema=...)`` every row is decoded under the schema (:mod:`simpop.agents.json_mask`).
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from simpop.agents.base import Chat, Generation, SamplingParams
from simpop.agents.chat import check_chat
from simpop.agents.embedded import EMBEDDED_MODELS, embedded_model_path
from simpop.agents.json_mask import JSONSchemaMask, SchemaGrammars
from simpop.agents.lora import Adapters
from simpop.agents.process_tuning import dense_input, fix_mmap_threshold, resolve_dtype
from simpop.agents.scoring import TOKEN_BUDGET, Scoring
from simpop.agents.scoring import TokenScores as TokenScores  # what token_logprobs returns, where users look for it

if TYPE_CHECKING:
    import torch

    from simpop.agents.kv_buffer import LayerCache

#: Prompts of one call that all begin with at least this many equal tokens read them once; a row's uncached tokens
#: beyond the batch's common length are read alone first when they are at least this many (fewer are padded).
_MIN_SHARED_PREFIX = 16


def _import_torch_transformers():
    try:
        import torch
        import transformers
    except ImportError as error:
        raise ImportError(f"TransformersBackend needs {error.name}: pip install simpop[llm]") from error
    if not sys.stderr.isatty():  # "Loading weights" bars would fill logs with carriage-return fragments
        transformers.utils.logging.disable_progress_bar()
    return torch, transformers


class _StopWhenSet:
    """A transformers stopping criterion: every row is done once ``event`` is set."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        import torch

        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


def row_generator(seed: int | None, index: int, device: torch.device) -> torch.Generator:
    """The generator row ``index`` of a sampling call seeded ``seed`` draws with (``seed`` None: seeded from torch's
    global generator)."""
    import numpy as np
    import torch

    if seed is None:
        return torch.Generator(device).manual_seed(int(torch.randint(2**62, ()).item()))
    return torch.Generator(device).manual_seed(int(np.random.SeedSequence([seed, index]).generate_state(1)[0]))


class RowSampler:
    """The last logits processor of a sampling call: each row draws its next token from the softmax of its scores
    with its own generator (the exponential race: the argmax of ``p / E``, ``E ~ Exp(1)`` per token, is a draw from
    ``p``), and the scores returned leave only that token for ``generate()``'s argmax. :attr:`logprobs` holds each
    step's log-probabilities of the drawn tokens."""

    def __init__(self, generators: list[torch.Generator]) -> None:
        self.generators = generators
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        import torch

        logprobs = scores.float().log_softmax(-1)
        races = torch.stack([torch.empty(scores.shape[-1], dtype=torch.float64, device=scores.device)
                             .exponential_(generator=generator) for generator in self.generators])
        drawn = (logprobs - races.clamp_(min=1e-300).log()).argmax(-1, keepdim=True)  # a masked token stays -inf
        self.logprobs.append(logprobs.gather(-1, drawn).squeeze(-1))
        return torch.full_like(scores, float("-inf")).scatter_(-1, drawn, 0.0)


class TransformersBackend(Scoring, Adapters, SchemaGrammars):
    """A local causal LM behind the :class:`~simpop.agents.base.TokenBackend` protocol: generation here, scoring
    (:class:`~simpop.agents.scoring.Scoring`), LoRA adapters and saving (:class:`~simpop.agents.lora.Adapters`) and
    JSON-schema grammars (:class:`~simpop.agents.json_mask.SchemaGrammars`) from its parts.

    Args:
        model: An embedded model name (``"smollm2"``) or a local HF model folder.
        dtype: ``"float32"``, ``"bfloat16"`` (faster on GPUs and CPUs with bf16 matmul; fp32 for exactness)
            or ``"auto"`` (:func:`~simpop.agents.process_tuning.resolve_dtype`); :attr:`dtype` holds the resolved one.
        threads: If set, ``torch.set_num_threads(threads)`` (process-wide).
        trainable: Leave the base weights trainable (full fine-tuning). LoRA adapters are trainable
            either way, and adding one freezes the base weights.
        device: Torch device; default ``"cuda"`` when available, else ``"cpu"``.
        prefix_cache: Keep the KV cache of each generated sequence (prompt + completion) so that a later
            prompt that extends it exactly (the next turn of a token-in/token-out dialogue) only reads
            its new tokens. Sequences are kept per active adapter (and for the base with adapters
            disabled), so a policy and simulators on one base model keep theirs; the whole cache is
            dropped whenever any weight or the model changes (in-place updates bump parameter version
            counters, so optimizer steps are seen).
        prefix_cache_size: Most sequences held by the prefix cache (least recently used go first; a sequence that
            extends a cached one replaces it, so a dialogue holds one).
        prefix_cache_mb: Most memory the prefix cache's keys and values take, in MiB (least recently used go first).
        token_budget: Padded tokens per micro-batch of :meth:`token_logprobs` (peak scoring memory grows with it).
        checkpoint_tokens: A pass with gradients of more padded tokens than this checkpoints its layers (default:
            ``token_budget``; 0: every pass with gradients, the least memory for one more forward pass).
    """

    def __init__(self, model: str | Path = "smollm2", dtype: str = "float32", threads: int | None = None,
                 trainable: bool = False, device: str | None = None, prefix_cache: bool = False,
                 prefix_cache_size: int = 64, prefix_cache_mb: float = 1024.0, token_budget: int = TOKEN_BUDGET,
                 checkpoint_tokens: int | None = None) -> None:
        torch, transformers = _import_torch_transformers()
        fix_mmap_threshold()  # training steps' freed activations go back to the system (see there)
        dtype = resolve_dtype(dtype, device)
        if token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {token_budget}")
        if checkpoint_tokens is not None and checkpoint_tokens < 0:
            raise ValueError(f"checkpoint_tokens must be >= 0, got {checkpoint_tokens}")
        self.token_budget = token_budget
        self.checkpoint_tokens = checkpoint_tokens
        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        if str(model) in EMBEDDED_MODELS:
            path, self.name = embedded_model_path(str(model)), str(model)
        else:
            path = Path(model).expanduser()
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"{path} is not a local HF model folder (no config.json); pass a folder or "
                                        f"one of {sorted(EMBEDDED_MODELS)}")
            self.name = path.name
        self.path = path
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()  # eval: no dropout, so sampling and scoring see one model
        from simpop.agents.cpu_attention import pack_decode_queries

        pack_decode_queries(self.model)
        self.model.requires_grad_(trainable)
        self.model.get_output_embeddings().register_forward_pre_hook(dense_input)
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_token_ids: list[int] = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        pad = self.tokenizer.pad_token_id
        self.pad_token_id: int = self.eos_token_ids[0] if pad is None else pad
        self.vocab_size: int = self.model.get_input_embeddings().num_embeddings
        if prefix_cache_size < 1 or prefix_cache_mb <= 0:
            raise ValueError(f"prefix_cache_size must be >= 1 and prefix_cache_mb > 0, got {prefix_cache_size} and "
                             f"{prefix_cache_mb}")
        from simpop.agents.kv_buffer import PrefixCache

        self.prefix_cache = prefix_cache
        self.prefixes = PrefixCache(prefix_cache_size, int(prefix_cache_mb * 2**20))
        self.prefix_hits = self.prefix_misses = self.prefix_reused_tokens = 0
        self._llg_tokenizer = None
        self._grammars: OrderedDict[str, str] = OrderedDict()
        #: While set, a running :meth:`generate_ids` stops at its next token (a server whose clients left, or
        #: that is shutting down, sets it; the caller clears it before the next call).
        self.stop_event = threading.Event()

    #: Honours ``SamplingParams.json_schema`` (constrained decoding, :mod:`simpop.agents.json_mask`).
    supports_json_schema = True
    #: Draws each row of a sampling call with a generator of its own (``row_seeds``; :meth:`generate_ids`).
    samples_rows_apart = True

    def encode_chat(self, chat: Chat, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``chat`` rendered with the model's chat template."""
        check_chat(chat)
        return list(self.tokenizer.apply_chat_template(chat, add_generation_prompt=add_generation_prompt,
                                                       tokenize=True, return_dict=False))

    def generate(self, chats: list[Chat], params: SamplingParams,
                 row_seeds: Sequence[tuple[int | None, int]] | None = None) -> list[Generation]:
        """One completion per chat, in one batched call (``row_seeds``: see :meth:`generate_ids`)."""
        return self.generate_ids([self.encode_chat(chat) for chat in chats], params, row_seeds)

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams,
                     row_seeds: Sequence[tuple[int | None, int]] | None = None) -> list[Generation]:
        """One completion per prompt (exact token ids), in one left-padded ``model.generate`` call.

        Sampling draws each row with a generator of its own (:func:`row_generator`), seeded with ``params.seed``
        and the row's index, so the same seed and inputs give the same outputs, and a row's draw does not depend
        on the other rows. ``row_seeds`` gives each row the ``(seed, index)`` it draws as instead: the rows of
        several seeded calls sampled in one batch (``simpop serve``'s) each give what their own call would.
        Generation stops per sample at an end-of-turn token or
        a stop string; the returned ``token_ids`` keep the end-of-turn token and the token that
        completed a stop string, while ``text`` ends before the stop string. With ``prefix_cache``, a
        prompt's longest cached start is not read again (the outputs are those of a full read up to
        floating-point rounding). With ``params.json_schema``, every row is decoded under the schema
        (module docstring); log-probs are then those of the constrained distribution.
        """
        torch, transformers = _import_torch_transformers()
        from simpop.agents.kv_buffer import batched_cache, cache_argument, cached_length

        self._check_prompts(prompts, params)
        cached = self._even_out(prompts, self._lookup_prefixes(prompts))
        reuse = [cached_length(kv) for kv in cached]
        past = max(reuse)
        suffix = max(len(prompt) - reused for prompt, reused in zip(prompts, reuse))
        # Row layout: [pad][cached prefix][pad][new suffix]; padding is masked out and positions come
        # from the attention mask's running count, so every real token keeps its position.
        width = past + suffix
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, (prompt, reused) in enumerate(zip(prompts, reuse)):
            input_ids[row, past - reused : past] = torch.tensor(prompt[:reused], dtype=torch.long)
            input_ids[row, width - len(prompt) + reused :] = torch.tensor(prompt[reused:])
            attention_mask[row, past - reused : past] = 1
            attention_mask[row, width - len(prompt) + reused :] = 1
        cache = batched_cache(self.model.config, cached, past, width + params.max_new_tokens)
        # generate() decodes greedily; a sampling call draws in its last processor, per row (plain temperature and
        # nucleus sampling, after the schema's mask: no top-k or other default from the model or transformers).
        processors = transformers.LogitsProcessorList()
        if params.json_schema is not None:
            processors.append(JSONSchemaMask(self._llg(), self._grammar(params.json_schema), len(prompts),
                                             self.vocab_size))
        sampler = None
        if not params.greedy:
            processors.append(transformers.TemperatureLogitsWarper(params.temperature))
            if params.top_p < 1:
                processors.append(transformers.TopPLogitsWarper(params.top_p))
            rows = [(params.seed, row) for row in range(len(prompts))] if row_seeds is None else list(row_seeds)
            if len(rows) != len(prompts):
                raise ValueError(f"row_seeds needs one (seed, index) per prompt, got {len(rows)} for {len(prompts)}")
            sampler = RowSampler([row_generator(seed, index, self.device) for seed, index in rows])
            processors.append(sampler)
        config = transformers.GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=False,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            stop_strings=list(params.stop) or None,
            output_scores=params.logprobs and sampler is None,
            return_dict_in_generate=True,
        )
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=config,
                tokenizer=self.tokenizer,  # needed by transformers' per-sample stop-string criterion
                logits_processor=processors,
                stopping_criteria=transformers.StoppingCriteriaList([_StopWhenSet(self.stop_event)]),
                **({cache_argument(self.model): cache} if cache is not None else {}),
            )
        new_tokens = out.sequences[:, width:].tolist()
        step_logprobs = None
        if params.logprobs and sampler is not None:
            step_logprobs = torch.stack(sampler.logprobs, dim=1).tolist()
        elif params.logprobs:
            # Scores are the processed ones (after the schema's mask). One step at a time: stacking every step's
            # full-vocabulary scores would double the memory.
            chosen = out.sequences[:, width:]
            step_logprobs = torch.stack([scores.float().log_softmax(-1).gather(-1, chosen[:, step, None]).squeeze(-1)
                                         for step, scores in enumerate(out.scores)], dim=1).tolist()
        generations = [
            self._finish(prompt, tokens, None if step_logprobs is None else step_logprobs[row], params.stop)
            for row, (prompt, tokens) in enumerate(zip(prompts, new_tokens))
        ]
        if self.prefix_cache:
            self._store_prefixes(generations, getattr(out, cache_argument(self.model)), attention_mask, width)
        return generations

    def clear_prefix_cache(self) -> None:
        """Drop every cached prefix (weights changes are detected on their own; this frees memory)."""
        self.prefixes.clear()

    def _weights_state(self) -> tuple:
        """What every cached key and value depends on: the model object and every parameter's in-place
        version counter (optimizer steps, ``load`` copies)."""
        parameters = list(self.model.parameters())
        return id(self.model), len(parameters), sum(p._version for p in parameters)

    def _view(self) -> tuple:
        """Which model of this backend generates: the active adapter, or the base with adapters disabled.
        Cached sequences are kept per view, so alternating adapters (a policy and its simulators on
        one base model) do not evict each other."""
        return self.active_adapter, self._adapters_disabled

    def _lookup_prefixes(self, prompts: list[list[int]]) -> list[LayerCache | None]:
        """Per prompt, the cache of its longest prefix held by any cached sequence of the current view
        (at least one token of the prompt stays to read); prompts of one call that share a long prefix
        read it once."""
        from simpop.agents.kv_buffer import cached_length

        if not self.prefix_cache:
            return [None] * len(prompts)
        self.prefixes.check(self._weights_state())
        view = self._view()
        found = [self.prefixes.longest(view, prompt) for prompt in prompts]
        shared = min(len(os.path.commonprefix(prompts)), min(map(len, prompts)) - 1)
        if len(prompts) > 1 and shared >= _MIN_SHARED_PREFIX and any(cached_length(kv) < shared for kv in found):
            self._read_prefix(view, prompts[0][:shared])
            found = [self.prefixes.longest(view, prompt) for prompt in prompts]
        for kv in found:
            self.prefix_hits += kv is not None
            self.prefix_misses += kv is None
            self.prefix_reused_tokens += cached_length(kv)
        return found

    def _even_out(self, prompts: list[list[int]], cached: list[LayerCache | None]) -> list[LayerCache | None]:
        """Rows' caches with each row's uncached tokens beyond the batch's common length read alone first.

        The batched read pads every row to the longest uncached part, and a padded position costs as much as a
        real one: a new dialogue's first prompt beside later turns' short deltas would make every row read the
        whole prompt's length. So a row whose uncached part exceeds the rest's (the rows within
        ``_MIN_SHARED_PREFIX`` of the shortest) reads its excess alone, and the batch reads what remains, evenly.
        """
        from simpop.agents.kv_buffer import cached_length

        if len(prompts) < 2:
            return cached
        uncached = [len(prompt) - cached_length(kv) for prompt, kv in zip(prompts, cached)]
        even = max(n for n in uncached if n < min(uncached) + _MIN_SHARED_PREFIX)
        return [kv if n <= even else self._read_alone(prompt[:-even], kv)
                for prompt, kv, n in zip(prompts, cached, uncached)]

    def _read_alone(self, tokens: list[int], prefix: LayerCache | None) -> LayerCache:
        """Keys and values of ``tokens`` read as one row after ``prefix`` (the keys and values of their start)."""
        torch, _ = _import_torch_transformers()
        from simpop.agents.kv_buffer import batched_cache, cache_argument, cached_length

        start = cached_length(prefix)
        cache = batched_cache(self.model.config, [prefix], start, len(tokens)) if prefix else None
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([tokens[start:]], device=self.device), use_cache=True,
                             logits_to_keep=1, **({cache_argument(self.model): cache} if cache is not None else {}))
        return [(layer.keys[0], layer.values[0]) for layer in getattr(out, cache_argument(self.model)).layers]

    def _read_prefix(self, view: tuple, tokens: list[int]) -> None:
        """Run the model over ``tokens`` alone and cache their keys and values."""
        self.prefixes.remember(view, tokens, [(keys.clone(), values.clone())
                                              for keys, values in self._read_alone(tokens, None)])

    def _store_prefixes(self, generations: list[Generation], cache, attention_mask, width: int) -> None:
        """Cache the keys and values of each row's prompt + completion, but its last token (never read)."""
        torch, _ = _import_torch_transformers()
        view = self._view()
        for row, generation in enumerate(generations):
            # This row's cache columns: the prompt's masked-in ones, then the completion but its last token.
            columns = attention_mask[row].nonzero().squeeze(-1).tolist()
            columns += range(width, width + len(generation.token_ids) - 1)
            index = torch.tensor(columns, dtype=torch.long, device=self.device)
            kv = [(layer.keys[row, :, index], layer.values[row, :, index]) for layer in cache.layers]  # copies
            self.prefixes.remember(view, generation.prompt_ids + generation.token_ids[:-1], kv)

    def _finish(self, prompt: list[int], tokens: list[int], logprobs: list[float] | None,
                stop: Sequence[str]) -> Generation:
        """Trim padding after end-of-turn and anything after a stop string."""
        end, finish_reason = len(tokens), "length"
        for index, token in enumerate(tokens):
            if token in self.eos_token_ids:
                end, finish_reason = index + 1, "stop"
                break
        text = self.tokenizer.decode(tokens[:end], skip_special_tokens=True)
        if stop and any(s in text for s in stop):
            # The shortest prefix whose text contains a stop string: the tokens the model "said".
            for length in range(1, end + 1):
                prefix = self.tokenizer.decode(tokens[:length], skip_special_tokens=True)
                cut = min((prefix.find(s) for s in stop if s in prefix), default=-1)
                if cut >= 0:
                    end, text, finish_reason = length, prefix[:cut], "stop"
                    break
        return Generation(text=text, token_ids=tokens[:end], prompt_ids=list(prompt),
                          logprobs=None if logprobs is None else logprobs[:end], finish_reason=finish_reason)

    def _check_prompts(self, prompts: list[list[int]], params: SamplingParams) -> None:
        if not prompts:
            raise ValueError("prompts is empty; pass at least one prompt (a list of token ids)")
        limit = self.model.config.max_position_embeddings
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {index} is empty; encode a chat with encode_chat() first")
            if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt):
                raise ValueError(f"prompt {index} holds values that are not token ids in [0, {self.vocab_size})")
            if len(prompt) + params.max_new_tokens > limit:
                raise ValueError(f"prompt {index} has {len(prompt)} tokens; with max_new_tokens={params.max_new_tokens} "
                                 f"it exceeds the model's context of {limit} tokens: shorten the history")
