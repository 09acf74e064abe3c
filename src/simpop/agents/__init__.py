"""simpop.agents: model backends behind one interface (see :mod:`simpop.agents.base`).

Backends are named by a *spec* string, used by the CLI and simulator specs:

- ``smollm2``: the embedded SmolLM2-135M-Instruct, in process (:class:`TransformersBackend`).
- ``transformers:<path or embedded name>``: a local HF model folder, in process.
- ``openai:<base_url>#<model>``: an OpenAI-compatible server, e.g.
  ``openai:http://127.0.0.1:8000/v1#smollm2`` (:class:`OpenAIBackend`; ``simpop serve`` runs one).
- ``vllm:<base_url>#<model>``: a running vLLM server, token-in/token-out (:class:`VLLMBackend`);
  ``vllm:<model folder or embedded name>`` launches one for this process (``make vllm-env`` on CPU).

Backend modules are imported only when a spec needs them, so ``import simpop.agents`` stays light.
"""

from __future__ import annotations

from typing import Any

from simpop.agents.base import Backend, Chat, Generation, Message, SamplingParams, TokenBackend

__all__ = ["Backend", "Chat", "Generation", "Message", "SamplingParams", "TokenBackend", "load_backend"]


def load_backend(spec: str, **kwargs: Any) -> Backend:
    """Build the backend named by ``spec``; ``kwargs`` go to its constructor.

    Args:
        spec: ``"smollm2"``, ``"transformers:<path>"``, ``"openai:<base_url>#<model>"``,
            ``"vllm:<base_url>#<model>"`` or ``"vllm:<model folder or embedded name>"``.
        **kwargs: Constructor options, e.g. ``dtype="bfloat16"`` (transformers) or ``max_concurrency=16``
            (openai).
    """
    from simpop.agents.embedded import EMBEDDED_MODELS

    kind, _, target = spec.partition(":")
    if spec in EMBEDDED_MODELS:
        kind, target = "transformers", spec
    if kind == "transformers" and target:
        from simpop.agents.transformers_backend import TransformersBackend

        return TransformersBackend(target, **kwargs)
    if kind == "openai" and "#" in target:
        from simpop.agents.openai_backend import OpenAIBackend

        base_url, _, model = target.rpartition("#")
        return OpenAIBackend(base_url, model, **kwargs)
    if kind == "vllm" and target:
        from simpop.agents.vllm_backend import load_vllm_backend

        return load_vllm_backend(target, **kwargs)
    raise ValueError(
        f"unknown backend spec {spec!r}; use one of {sorted(EMBEDDED_MODELS)}, 'transformers:<path>', "
        "'openai:<base_url>#<model>' (e.g. openai:http://127.0.0.1:8000/v1#smollm2), 'vllm:<base_url>#<model>' "
        "or 'vllm:<model folder>'"
    )
