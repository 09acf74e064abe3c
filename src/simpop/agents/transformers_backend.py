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

**Structured output.** With ``SamplingParams(json_schema=...)`` every row of the batch is decoded under
the schema with `llguidance <https://github.com/guidance-ai/llguidance>`_ (the grammar engine of vLLM's
``guidance`` structured-output backend): a logits processor masks, per row and step, the tokens that
cannot continue a valid document, so a completion that ends at end-of-turn is valid JSON for the schema
(one cut by ``max_new_tokens`` or a stop string is a valid prefix). ``benchmarks/verbalized_parse.py``
compares it with xgrammar, lm-format-enforcer and outlines. It composes with left padding, the prefix
cache and the CPU attention path: it reads only the last sampled token of each row and touches nothing
but the next-token scores.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from simpop.agents.base import Chat, Generation, SamplingParams
from simpop.agents.chat import check_chat
from simpop.agents.embedded import EMBEDDED_MODELS, embedded_model_path

if TYPE_CHECKING:
    import torch

    from simpop.agents.kv_buffer import LayerCache

#: Weights dtypes; ``auto`` resolves with :func:`resolve_dtype`.
DTYPES = ("auto", "float32", "bfloat16")
#: Padded tokens per micro-batch of :meth:`TransformersBackend.token_logprobs` (default); above it, a pass with
#: gradients checkpoints its layers. SmolLM2 in float32 keeps ~1.8 MB a token for backward: ~1.9 GB at most.
TOKEN_BUDGET = 1024


def cpu_dtype() -> Literal["float32", "bfloat16"]:
    """``"bfloat16"`` when this CPU has bf16 instructions (AVX512-BF16 or AMX, read from ``/proc/cpuinfo``;
    PEFT keeps LoRA adapters in float32 either way), else ``"float32"``."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no way to tell, so the exact one
        return "float32"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def resolve_dtype(dtype: str, device: str | None = None) -> Literal["float32", "bfloat16"]:
    """``dtype`` itself, or for ``"auto"``: ``"bfloat16"`` on a CUDA GPU (``device``, default: CUDA when
    available) and on CPUs with native bf16 matmul (:func:`cpu_dtype`), ``"float32"`` on other CPUs
    (there bf16 runs ~1.8x slower than float32)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if dtype != "auto":
        return "float32" if dtype == "float32" else "bfloat16"
    import torch

    on_gpu = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    return "bfloat16" if on_gpu else cpu_dtype()

#: Attention and MLP projections of Llama-style models (SmolLM2, Qwen, Llama, Mistral).
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MANIFEST = "simpop_backend.json"
#: Prompts of one call that all begin with at least this many equal tokens read them once.
_MIN_SHARED_PREFIX = 16
#: Vocabulary columns per tile of the chunked log-prob (a [4096, tile] buffer: 128 MB in float32).
_VOCAB_TILE = 8192


#: glibc's ``mallopt`` parameter number of ``M_MMAP_THRESHOLD``.
_M_MMAP_THRESHOLD = -3


def fix_mmap_threshold(size: int = 128 * 1024) -> bool:
    """Have glibc serve every allocation above ``size`` bytes by its own ``mmap``, returned when freed.

    By default glibc raises this threshold each time a large block is freed (up to 32 MB); from then on
    the activations of a training step come from its heaps, which keep freed memory resident. Measured
    on one LoRA scoring step of 2 x 969 tokens: peak RSS 1.8 GB above the model's with the moving
    threshold, 0.19 GB with a fixed one, at no measured time cost. Process-wide; a no-op (False) where
    the C library is not glibc.
    """
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, size))
    except (OSError, AttributeError):
        return False


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


def _import_torch_transformers():
    try:
        import torch
        import transformers
    except ImportError as error:
        raise ImportError(f"TransformersBackend needs {error.name}: pip install simpop[llm]") from error
    if not sys.stderr.isatty():  # "Loading weights" bars would fill logs with carriage-return fragments
        transformers.utils.logging.disable_progress_bar()
    return torch, transformers


def _dense_input(module, args: tuple) -> tuple:
    """Forward pre-hook: the module's first input with row-major strides.

    ``generate()`` feeds the LM head the last position of every row, a slice of the hidden states;
    torch's linear on such a strided batch copies the head's weight once per row (150x slower for
    16 rows on a CPU), and in bfloat16 even a one-row slice that counts as contiguous is 15x slower.
    """
    import torch

    tensor = args[0]
    strides, step = [], 1
    for size in reversed(tensor.shape):
        strides.append(step)
        step *= size
    if tensor.stride() != tuple(reversed(strides)):
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    return (tensor, *args[1:])


def _cached_length(cache: LayerCache | None) -> int:
    return 0 if cache is None else cache[0][0].shape[1]


#: JSON layout of constrained completions: no free whitespace (a small model fills it with newlines),
#: and the separators of ``json.dumps``, the layout models see most.
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


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


class _StopWhenSet:
    """A transformers stopping criterion: every row is done once ``event`` is set."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        import torch

        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool, device=input_ids.device)


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


class TransformersBackend:
    """A local causal LM behind the :class:`~simpop.agents.base.TokenBackend` protocol.

    Args:
        model: An embedded model name (``"smollm2"``) or a local HF model folder.
        dtype: ``"float32"``, ``"bfloat16"`` (faster on GPUs and CPUs with bf16 matmul; fp32 for exactness)
            or ``"auto"`` (:func:`resolve_dtype`); :attr:`dtype` holds the resolved one.
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
        prefix_cache_size: Most sequences held by the prefix cache (least recently used go first).
        token_budget: Padded tokens per micro-batch of :meth:`token_logprobs` (peak scoring memory grows with it).
        checkpoint_tokens: A pass with gradients of more padded tokens than this checkpoints its layers (default:
            ``token_budget``; 0: every pass with gradients, the least memory for one more forward pass).
    """

    def __init__(
        self,
        model: str | Path = "smollm2",
        dtype: str = "float32",
        threads: int | None = None,
        trainable: bool = False,
        device: str | None = None,
        prefix_cache: bool = False,
        prefix_cache_size: int = 64,
        token_budget: int = TOKEN_BUDGET,
        checkpoint_tokens: int | None = None,
    ) -> None:
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
                raise FileNotFoundError(
                    f"{path} is not a local HF model folder (no config.json); pass a folder or one of "
                    f"{sorted(EMBEDDED_MODELS)}"
                )
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
        self.model.get_output_embeddings().register_forward_pre_hook(_dense_input)
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_token_ids: list[int] = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        pad = self.tokenizer.pad_token_id
        self.pad_token_id: int = self.eos_token_ids[0] if pad is None else pad
        self.vocab_size: int = self.model.get_input_embeddings().num_embeddings
        if prefix_cache_size < 1:
            raise ValueError(f"prefix_cache_size must be >= 1, got {prefix_cache_size}")
        self.prefix_cache, self.prefix_cache_size = prefix_cache, prefix_cache_size
        #: (view, token ids) -> per-layer (key, value) of exactly those tokens, shape [heads, len, dim].
        self._prefixes: OrderedDict[tuple[tuple, tuple[int, ...]], LayerCache] = OrderedDict()
        self._prefix_weights: tuple | None = None
        self._adapters_disabled = False
        self.prefix_hits = self.prefix_misses = self.prefix_reused_tokens = 0
        self._llg_tokenizer = None
        self._grammars: OrderedDict[str, str] = OrderedDict()
        #: While set, a running :meth:`generate_ids` stops at its next token (a server whose clients left, or
        #: that is shutting down, sets it; the caller clears it before the next call).
        self.stop_event = threading.Event()

    #: Honours ``SamplingParams.json_schema`` (constrained decoding, see the module docstring).
    supports_json_schema = True

    # ----------------------------------------------------------------------------------- generation

    def encode_chat(self, chat: Chat, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``chat`` rendered with the model's chat template."""
        check_chat(chat)
        return list(
            self.tokenizer.apply_chat_template(
                chat, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
            )
        )

    def generate(self, chats: list[Chat], params: SamplingParams) -> list[Generation]:
        """One completion per chat, in one batched call."""
        return self.generate_ids([self.encode_chat(chat) for chat in chats], params)

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One completion per prompt (exact token ids), in one left-padded ``model.generate`` call.

        Sampling is seeded with ``params.seed`` (the global torch RNG is left untouched), so the same
        seed and inputs give the same outputs. Generation stops per sample at an end-of-turn token or
        a stop string; the returned ``token_ids`` keep the end-of-turn token and the token that
        completed a stop string, while ``text`` ends before the stop string. With ``prefix_cache``, a
        prompt's longest cached start is not read again (the outputs are those of a full read up to
        floating-point rounding). With ``params.json_schema``, every row is decoded under the schema
        (module docstring); log-probs are then those of the constrained distribution.
        """
        torch, transformers = _import_torch_transformers()
        from simpop.agents.kv_buffer import batched_cache, cache_argument

        self._check_prompts(prompts, params)
        cached = self._lookup_prefixes(prompts)
        reuse = [_cached_length(kv) for kv in cached]
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
        # top_k=0: plain temperature / nucleus sampling, not a top-k default from the model or transformers.
        sampling: dict[str, Any] = (
            {"do_sample": False}
            if params.greedy
            else {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
        )
        processors = transformers.LogitsProcessorList()
        if params.json_schema is not None:
            processors.append(JSONSchemaMask(self._llg(), self._grammar(params.json_schema), len(prompts),
                                             self.vocab_size))
            if not params.greedy and params.top_p < 1:
                # generate() runs its own warpers before ours; nucleus filtering must see the masked
                # scores, or it could keep only tokens the schema forbids.
                processors.append(transformers.TopPLogitsWarper(params.top_p))
                sampling["top_p"] = 1.0
        config = transformers.GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            **sampling,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            stop_strings=list(params.stop) or None,
            output_scores=params.logprobs,
            return_dict_in_generate=True,
        )
        rng_devices = [self.device] if self.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=rng_devices, enabled=params.seed is not None):
            if params.seed is not None:
                torch.manual_seed(params.seed)
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
        if params.logprobs:
            # Scores are the processed ones (after temperature / top-p), i.e. the sampling distribution.
            # One step at a time: stacking every step's full-vocabulary scores would double the memory.
            chosen = out.sequences[:, width:]
            step_logprobs = torch.stack(
                [
                    scores.float().log_softmax(-1).gather(-1, chosen[:, step, None]).squeeze(-1)
                    for step, scores in enumerate(out.scores)
                ],
                dim=1,
            ).tolist()
        generations = [
            self._finish(prompt, tokens, None if step_logprobs is None else step_logprobs[row], params.stop)
            for row, (prompt, tokens) in enumerate(zip(prompts, new_tokens))
        ]
        if self.prefix_cache:
            self._store_prefixes(generations, getattr(out, cache_argument(self.model)), attention_mask, width)
        return generations

    # ---------------------------------------------------------------------------- structured output

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

    def _grammar(self, schema: dict) -> str:
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

    # ------------------------------------------------------------------------------ prefix KV cache

    def clear_prefix_cache(self) -> None:
        """Drop every cached prefix (weights changes are detected on their own; this frees memory)."""
        self._prefixes.clear()

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
        if not self.prefix_cache:
            return [None] * len(prompts)
        state = self._weights_state()
        if state != self._prefix_weights:
            self._prefixes.clear()
            self._prefix_weights = state
        view = self._view()
        found = [self._longest_prefix(view, prompt) for prompt in prompts]
        shared = min(len(os.path.commonprefix(prompts)), min(map(len, prompts)) - 1)
        if len(prompts) > 1 and shared >= _MIN_SHARED_PREFIX and any(_cached_length(kv) < shared for kv in found):
            self._read_prefix(view, prompts[0][:shared])
            found = [self._longest_prefix(view, prompt) for prompt in prompts]
        for kv in found:
            self.prefix_hits += kv is not None
            self.prefix_misses += kv is None
            self.prefix_reused_tokens += _cached_length(kv)
        return found

    def _longest_prefix(self, view: tuple, prompt: list[int]) -> LayerCache | None:
        """Keys and values of the longest start of ``prompt`` that a cached sequence of ``view`` begins with."""
        best, length = None, 0
        for key in self._prefixes:
            if key[0] == view:
                common = min(len(os.path.commonprefix([key[1], tuple(prompt)])), len(prompt) - 1)
                if common > length:
                    best, length = key, common
        if best is None:
            return None
        self._prefixes.move_to_end(best)
        return [(keys[:, :length], values[:, :length]) for keys, values in self._prefixes[best]]

    def _read_prefix(self, view: tuple, tokens: list[int]) -> None:
        """Run the model over ``tokens`` alone and cache their keys and values."""
        torch, _ = _import_torch_transformers()
        from simpop.agents.kv_buffer import cache_argument

        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([tokens], device=self.device), use_cache=True, logits_to_keep=1)
        cache = getattr(out, cache_argument(self.model))
        self._remember(view, tokens, [(layer.keys[0].clone(), layer.values[0].clone()) for layer in cache.layers])

    def _remember(self, view: tuple, tokens: Sequence[int], kv: LayerCache) -> None:
        key = (view, tuple(tokens))
        self._prefixes[key] = kv
        self._prefixes.move_to_end(key)
        while len(self._prefixes) > self.prefix_cache_size:
            self._prefixes.popitem(last=False)

    def _store_prefixes(self, generations: list[Generation], cache, attention_mask, width: int) -> None:
        """Cache the keys and values of each row's prompt + completion, but its last token (never read)."""
        torch, _ = _import_torch_transformers()
        view = self._view()
        for row, generation in enumerate(generations):
            # This row's cache columns: the prompt's masked-in ones, then the completion but its last token.
            columns = attention_mask[row].nonzero().squeeze(-1).tolist()
            columns += range(width, width + len(generation.token_ids) - 1)
            index = torch.tensor(columns, dtype=torch.long, device=self.device)
            kv = [(layer.keys[row, :, index].clone(), layer.values[row, :, index].clone()) for layer in cache.layers]
            self._remember(view, generation.prompt_ids + generation.token_ids[:-1], kv)

    def _finish(
        self, prompt: list[int], tokens: list[int], logprobs: list[float] | None, stop: Sequence[str]
    ) -> Generation:
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
        return Generation(
            text=text,
            token_ids=tokens[:end],
            prompt_ids=list(prompt),
            logprobs=None if logprobs is None else logprobs[:end],
            finish_reason=finish_reason,
        )

    def _check_prompts(self, prompts: list[list[int]], params: SamplingParams) -> None:
        if not prompts:
            raise ValueError("prompts is empty; pass at least one prompt (a list of token ids)")
        limit = self.model.config.max_position_embeddings
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {index} is empty; encode a chat with encode_chat() first")
            if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt):
                raise ValueError(
                    f"prompt {index} holds values that are not token ids in [0, {self.vocab_size})"
                )
            if len(prompt) + params.max_new_tokens > limit:
                raise ValueError(
                    f"prompt {index} has {len(prompt)} tokens; with max_new_tokens={params.max_new_tokens} "
                    f"it exceeds the model's context of {limit} tokens: shorten the history"
                )

    # ------------------------------------------------------------------------------------- training

    def token_logprobs(
        self,
        sequences: list[list[int]],
        masks: list[list[int]] | None = None,
        temperature: float = 1.0,
        token_budget: int | None = None,
    ) -> TokenScores:
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
        torch, _ = _import_torch_transformers()
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
    def _checkpointed_layers(self, enabled: bool) -> Iterator[None]:
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
        self, sequences: list[list[int]], positions: list[list[int]], temperature: float, checkpointed: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs (with graph) and entropies (values) of tokens ``positions[r]`` of ``sequences[r]``,
        flattened row by row, in one right-padded forward pass."""
        torch, _ = _import_torch_transformers()
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

    def _check_view(self, view: tuple, grad: torch.Tensor) -> None:
        if self._view() != view:
            raise RuntimeError(f"token_logprobs ran with adapter view {view} but its backward (which recomputes "
                               f"the layers) runs with {self._view()}: call backward before switching adapters")

    def parameters(self, adapter: str | None = None) -> list[torch.nn.Parameter]:
        """Trainable parameters: those with ``requires_grad`` or, with ``adapter``, that adapter's weights."""
        if adapter is None:
            return [p for p in self.model.parameters() if p.requires_grad]
        self._check_adapter(adapter)
        return [p for name, p in self.model.named_parameters() if "lora_" in name and f".{adapter}." in name]

    # --------------------------------------------------------------------------------------- LoRA

    @property
    def adapter_names(self) -> list[str]:
        """Names of the LoRA adapters on this model, in the order they were added."""
        return list(self.model.peft_config) if self._is_peft() else []

    @property
    def active_adapter(self) -> str | None:
        return self.model.active_adapter if self._is_peft() else None

    def add_adapter(
        self,
        name: str,
        r: int = 8,
        alpha: int = 16,
        target_modules: Sequence[str] = DEFAULT_LORA_TARGETS,
        dropout: float = 0.0,
    ) -> None:
        """Add a LoRA adapter and make it the active (and only trainable) one.

        The base weights are frozen from then on; K adapters on one base hold K simulators in the
        memory of one model.
        """
        try:
            import peft
        except ImportError as error:
            raise ImportError("LoRA adapters need peft: pip install simpop[llm]") from error
        if not name or "." in name:
            raise ValueError(f"adapter name must be non-empty and without '.', got {name!r}")
        if name in self.adapter_names:
            raise ValueError(f"adapter {name!r} already exists; adapters: {self.adapter_names}")
        config = peft.LoraConfig(
            r=r,
            lora_alpha=alpha,
            target_modules=list(target_modules),
            lora_dropout=dropout,
            task_type="CAUSAL_LM",
        )
        if self._is_peft():
            self.model.add_adapter(name, config)
        else:
            self.model = peft.get_peft_model(self.model, config, adapter_name=name)
        self.set_adapter(name)

    def set_adapter(self, name: str) -> None:
        """Make adapter ``name`` active: used by generation and scoring, the only trainable one."""
        self._check_adapter(name)
        self.model.set_adapter(name)

    @contextlib.contextmanager
    def disabled_adapters(self) -> Iterator[None]:
        """Run the base model without any adapter (the reference for a KL anchor).

        Without adapters this changes nothing: the model already is the base model (a full fine-tune
        needs a separate backend as its reference).
        """
        if not self._is_peft():
            yield
            return
        self._adapters_disabled = True  # a different model for the prefix cache
        try:
            with self.model.disable_adapter():
                yield
        finally:
            self._adapters_disabled = False

    def _is_peft(self) -> bool:
        peft = sys.modules.get("peft")  # a model is a PeftModel only once peft was imported (peft is optional here)
        return peft is not None and isinstance(self.model, peft.PeftModel)

    def _check_adapter(self, name: str) -> None:
        if name not in self.adapter_names:
            raise KeyError(f"no adapter {name!r}; adapters: {self.adapter_names} (add one with add_adapter)")

    # ---------------------------------------------------------------------------------- save / load

    def save(self, path: str | Path) -> None:
        """Save the adapters (if any) or else the full weights with the tokenizer, to folder ``path``.

        A full-weight save is a plain HF model folder: ``TransformersBackend(path)`` loads it, and so
        does TRL. An adapter save holds one sub-folder per adapter; :meth:`load` restores them onto a
        backend of the same base model.
        """
        import peft
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if not self._is_peft():
            self.model.save_pretrained(path)
            self.tokenizer.save_pretrained(path)
            manifest: dict[str, Any] = {"kind": "full", "base": self.name}
        else:
            for name in self.adapter_names:
                folder = path / "adapters" / name
                folder.mkdir(parents=True, exist_ok=True)
                self.model.peft_config[name].save_pretrained(folder)
                weights = peft.get_peft_model_state_dict(self.model, adapter_name=name)
                save_file(
                    {k: v.detach().contiguous().cpu() for k, v in weights.items()},
                    folder / "adapter_model.safetensors",
                )
            manifest = {
                "kind": "adapters",
                "base": self.name,
                "adapters": self.adapter_names,
                "active": self.active_adapter,
            }
        (path / _MANIFEST).write_text(json.dumps(manifest, indent=2))

    def load(self, path: str | Path) -> None:
        """Restore a :meth:`save`: adapters are added (or overwritten) by name; full weights replace
        the base model's."""
        torch, _ = _import_torch_transformers()
        import peft
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / _MANIFEST).is_file():
            raise FileNotFoundError(
                f"{path} holds no {_MANIFEST}: it was not written by TransformersBackend.save"
            )
        manifest = json.loads((path / _MANIFEST).read_text())
        if manifest["kind"] == "adapters":
            for name in manifest["adapters"]:
                folder = path / "adapters" / name
                if name not in self.adapter_names:
                    config = peft.LoraConfig.from_pretrained(folder)
                    self.add_adapter(
                        name, config.r, config.lora_alpha, sorted(config.target_modules), config.lora_dropout
                    )
                weights = load_file(folder / "adapter_model.safetensors", device=str(self.device))
                result = peft.set_peft_model_state_dict(self.model, weights, adapter_name=name)
                if result.unexpected_keys:
                    raise ValueError(
                        f"adapter {name!r} in {path} does not fit this model: {result.unexpected_keys[:3]}"
                    )
            self.set_adapter(manifest["active"])
            return
        if self._is_peft():
            raise ValueError(
                "cannot load full weights into a backend with adapters; load them into a fresh backend"
            )
        state: dict[str, torch.Tensor] = {}
        for file in sorted(path.glob("*.safetensors")):
            state.update(load_file(file, device=str(self.device)))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # Tied weights (e.g. lm_head = embed_tokens) are saved once and filled through their twin.
        parameters = dict(self.model.named_parameters(remove_duplicate=False))
        loaded = {id(parameters[name]) for name in state if name in parameters}
        untied_missing = [
            name for name in missing if name not in parameters or id(parameters[name]) not in loaded
        ]
        if unexpected or untied_missing:
            raise ValueError(
                f"weights in {path} do not fit this model: "
                f"missing {untied_missing[:3]}, unexpected {unexpected[:3]}"
            )
