"""The one interface every model sits behind: batched chat generation.

A backend turns chats (lists of ``{"role", "content"}`` messages) or exact prompt token ids into
generations. Rollouts of trainable seats use :meth:`Backend.generate_ids` so that token ids stay
exactly as generated (no re-tokenisation of the history); everything else can use
:meth:`Backend.generate`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]
Chat = list[Message]


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings for one batched call.

    Attributes:
        max_new_tokens: Upper bound on generated tokens per sample.
        temperature: 0 means greedy decoding (the mode-collapsed setting); > 0 samples.
        top_p: Nucleus sampling mass (1.0 disables it).
        stop: Strings that end a generation; the stop string is not included in the text.
        seed: Seed for this call's sampling; the same seed and inputs give the same outputs.
        logprobs: Also return the log-probability of every generated token.
        json_schema: If set, a JSON schema every completion must follow (structured output): an
            in-process backend constrains decoding to it, an HTTP backend sends it as the OpenAI
            ``response_format``. The completion may still end early (``max_new_tokens``, a stop
            string). Not part of the hash (a dict is unhashable); part of equality.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    json_schema: dict[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.json_schema is not None:
            if not isinstance(self.json_schema, dict):
                raise ValueError(f"json_schema must be a JSON schema (a dict), got {type(self.json_schema).__name__}")
            try:
                json.dumps(self.json_schema)
            except (TypeError, ValueError) as error:
                raise ValueError(f"json_schema must be JSON-serialisable: {error}") from None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Generation:
    """One generated completion.

    Attributes:
        text: The decoded completion (without a trailing stop string).
        token_ids: Completion token ids exactly as generated (empty if the backend cannot say).
        prompt_ids: The prompt's token ids as the model saw them (empty if unknown).
        logprobs: Per-token log-probabilities of ``token_ids`` when requested, else None.
        finish_reason: ``"stop"`` (end of turn or a stop string) or ``"length"``.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    finish_reason: str = "stop"


@runtime_checkable
class Backend(Protocol):
    """Batched chat generation. ``name`` identifies the model (used in simulator specs and logs).

    A backend that honours :attr:`SamplingParams.json_schema` (constrained decoding, or a server's
    structured output) sets ``supports_json_schema = True`` (see :func:`supports_json_schema`); others
    ignore the field, so callers that ask for JSON still parse what comes back.
    """

    name: str

    def generate(self, chats: list[Chat], params: SamplingParams) -> list[Generation]:
        """Generate one completion for each chat, in one batched call where the engine allows."""
        ...


def supports_json_schema(backend: Any) -> bool:
    """Whether ``backend`` constrains its output to :attr:`SamplingParams.json_schema`."""
    return bool(getattr(backend, "supports_json_schema", False))


@runtime_checkable
class TokenBackend(Backend, Protocol):
    """A backend that exposes its tokenizer, for token-in/token-out multi-turn rollouts."""

    def encode_chat(self, chat: Chat, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``chat`` rendered with the model's chat template."""
        ...

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Generate from exact prompt token ids (no re-tokenisation)."""
        ...


@runtime_checkable
class TrainableBackend(TokenBackend, Protocol):
    """An in-process model that training updates: per-token log-probs with gradient and LoRA adapters.

    Generation may move to another engine (vLLM, a server) while training stays here: trainers and
    trainable simulators need only this protocol.
    """

    model: Any

    def token_logprobs(self, sequences: list[list[int]], masks: list[list[int]], temperature: float = 1.0) -> Any:
        """Per-token log-probs (with gradient) and entropies (values) of the masked tokens (``TokenScores``)."""
        ...

    def parameters(self, adapter: str | None = None) -> list[Any]:
        """Trainable parameters (of one adapter, if named)."""
        ...

    @property
    def adapter_names(self) -> list[str]:
        """The LoRA adapters on the model."""
        ...

    @property
    def active_adapter(self) -> str | None:
        """The adapter generation and scoring use now."""
        ...

    def add_adapter(self, name: str, r: int = 8, alpha: int = 16, target_modules: Sequence[str] = ...,
                    dropout: float = 0.0) -> None:
        """Add a LoRA adapter (on ``target_modules``, default the backend's) and make it active."""
        ...

    def set_adapter(self, name: str) -> None:
        """Make an adapter active."""
        ...

    def disabled_adapters(self) -> AbstractContextManager[None]:
        """The base model with adapters off."""
        ...


class ScoringUnsupported(RuntimeError):
    """A backend (or the server behind it) cannot give the log-probability of a fixed reply."""
