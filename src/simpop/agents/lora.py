"""LoRA adapters: the in-process backend's side (:class:`Adapters`), and one adapter as trainable policies and
simulators share it (:class:`LoRAAdapter`).

:class:`Adapters` adds, switches and disables the adapters of a
:class:`~simpop.agents.transformers_backend.TransformersBackend` and saves and loads them (or its full weights). A
:class:`LoRAAdapter` names one adapter on a :class:`~simpop.agents.base.TrainableBackend` (K adapters on
one base model hold K trained models in the memory of one). It activates itself before use, exposes its
parameters and its weights (for checkpoints), copies itself under a new name (checkpoint-pool snapshots)
and gives the base model with adapters off (the KL reference).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simpop.agents.base import TrainableBackend

if TYPE_CHECKING:
    import torch


#: Attention and MLP projections of Llama-style models (SmolLM2, Qwen, Llama, Mistral).
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MANIFEST = "simpop_backend.json"


class Adapters:
    """The LoRA adapters of a :class:`~simpop.agents.transformers_backend.TransformersBackend`, and its weights on
    disk."""

    _adapters_disabled = False  # within disabled_adapters(): another model for the prefix cache

    def parameters(self: Any, adapter: str | None = None) -> list[torch.nn.Parameter]:
        """Trainable parameters: those with ``requires_grad`` or, with ``adapter``, that adapter's weights."""
        if adapter is None:
            return [p for p in self.model.parameters() if p.requires_grad]
        self._check_adapter(adapter)
        return [p for name, p in self.model.named_parameters() if "lora_" in name and f".{adapter}." in name]

    @property
    def adapter_names(self: Any) -> list[str]:
        """Names of the LoRA adapters on this model, in the order they were added."""
        return list(self.model.peft_config) if self._is_peft() else []

    @property
    def active_adapter(self: Any) -> str | None:
        return self.model.active_adapter if self._is_peft() else None

    def add_adapter(self: Any, name: str, r: int = 8, alpha: int = 16,
                    target_modules: Sequence[str] = DEFAULT_LORA_TARGETS, dropout: float = 0.0) -> None:
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
        config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(target_modules), lora_dropout=dropout,
                                 task_type="CAUSAL_LM")
        if self._is_peft():
            self.model.add_adapter(name, config)
        else:
            self.model = peft.get_peft_model(self.model, config, adapter_name=name)
        self.set_adapter(name)

    def set_adapter(self: Any, name: str) -> None:
        """Make adapter ``name`` active: used by generation and scoring, the only trainable one."""
        self._check_adapter(name)
        self.model.set_adapter(name)

    @contextlib.contextmanager
    def disabled_adapters(self: Any) -> Iterator[None]:
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

    def _is_peft(self: Any) -> bool:
        peft = sys.modules.get("peft")  # a model is a PeftModel only once peft was imported (peft is optional here)
        return peft is not None and isinstance(self.model, peft.PeftModel)

    def _check_adapter(self: Any, name: str) -> None:
        if name not in self.adapter_names:
            raise KeyError(f"no adapter {name!r}; adapters: {self.adapter_names} (add one with add_adapter)")

    def save(self: Any, path: str | Path) -> None:
        """Save the adapters (if any) or else the full weights with the tokenizer, to folder ``path``.

        A full-weight save is a plain HF model folder: ``TransformersBackend(path)`` loads it, and so
        does TRL. An adapter save holds one sub-folder per adapter; :meth:`load` restores them onto a
        backend of the same base model.
        """
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
                save_file(adapter_weights(self.model, name), folder / "adapter_model.safetensors")
            manifest = {"kind": "adapters", "base": self.name, "adapters": self.adapter_names,
                        "active": self.active_adapter}
        (path / _MANIFEST).write_text(json.dumps(manifest, indent=2))

    def load(self: Any, path: str | Path) -> None:
        """Restore a :meth:`save`: adapters are added (or overwritten) by name; full weights replace
        the base model's."""
        import peft
        from safetensors.torch import load_file

        path = Path(path)
        if not (path / _MANIFEST).is_file():
            raise FileNotFoundError(f"{path} holds no {_MANIFEST}: it was not written by TransformersBackend.save")
        manifest = json.loads((path / _MANIFEST).read_text())
        if manifest["kind"] == "adapters":
            for name in manifest["adapters"]:
                folder = path / "adapters" / name
                if name not in self.adapter_names:
                    config = peft.LoraConfig.from_pretrained(folder)
                    self.add_adapter(name, config.r, config.lora_alpha, sorted(config.target_modules),
                                     config.lora_dropout)
                load_adapter_weights(self.model, name, load_file(folder / "adapter_model.safetensors",
                                                                 device=str(self.device)), f" in {path}")
            self.set_adapter(manifest["active"])
            return
        if self._is_peft():
            raise ValueError("cannot load full weights into a backend with adapters; load them into a fresh backend")
        state: dict[str, torch.Tensor] = {}
        for file in sorted(path.glob("*.safetensors")):
            state.update(load_file(file, device=str(self.device)))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # Tied weights (e.g. lm_head = embed_tokens) are saved once and filled through their twin.
        parameters = dict(self.model.named_parameters(remove_duplicate=False))
        loaded = {id(parameters[name]) for name in state if name in parameters}
        untied_missing = [name for name in missing if name not in parameters or id(parameters[name]) not in loaded]
        if unexpected or untied_missing:
            raise ValueError(f"weights in {path} do not fit this model: missing {untied_missing[:3]}, unexpected "
                             f"{unexpected[:3]}")


def adapter_weights(model: Any, name: str) -> dict[str, Any]:
    """Adapter ``name``'s weights on PEFT ``model`` (detached contiguous CPU copies)."""
    import peft

    weights = peft.get_peft_model_state_dict(model, adapter_name=name)
    return {k: v.detach().contiguous().cpu().clone() for k, v in weights.items()}


def load_adapter_weights(model: Any, name: str, weights: dict[str, Any], where: str = "") -> None:
    """Load ``weights`` into adapter ``name`` on PEFT ``model``; keys that do not fit it are an error."""
    import peft

    result = peft.set_peft_model_state_dict(model, weights, adapter_name=name)
    if result.unexpected_keys:
        raise ValueError(f"weights{where} do not fit adapter {name!r}: {result.unexpected_keys[:3]}")





class LoRAAdapter:
    """Adapter ``name`` on ``backend``, added if it does not exist yet.

    Args:
        backend: The shared base model.
        name: The adapter's name (unique on the backend; no ``.``).
        r: LoRA rank.
        alpha: LoRA scaling numerator (the update is scaled by ``alpha / r``).
        target_modules: Module names to adapt (None: the backend's default).
    """

    def __init__(self, backend: TrainableBackend, name: str, r: int = 8, alpha: int = 16,
                 target_modules: Sequence[str] | None = None):
        self.backend, self.name = backend, name
        if name not in backend.adapter_names:
            if target_modules is None:
                backend.add_adapter(name, r=r, alpha=alpha)
            else:
                backend.add_adapter(name, r=r, alpha=alpha, target_modules=list(target_modules))

    def activate(self) -> None:
        """Make this adapter the one generation and scoring use (and the only trainable one)."""
        self.backend.set_adapter(self.name)

    def parameters(self) -> list[Any]:
        """The adapter's trainable parameters (what the optimiser updates)."""
        return self.backend.parameters(self.name)

    def disabled(self) -> AbstractContextManager[None]:
        """The base model with every adapter off (the reference of a KL anchor)."""
        return self.backend.disabled_adapters()

    def state_dict(self) -> dict[str, Any]:
        """The adapter's weights (detached CPU copies)."""
        return adapter_weights(self.backend.model, self.name)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load weights saved by :meth:`state_dict`; keys that do not fit this adapter are an error."""
        load_adapter_weights(self.backend.model, self.name, state)

    def copy(self, name: str, trainable: bool = False) -> LoRAAdapter:
        """A new adapter ``name`` with this one's configuration and current weights (frozen by default)."""
        config = self.backend.model.peft_config[self.name]
        active = self.backend.active_adapter
        clone = LoRAAdapter(self.backend, name, r=config.r, alpha=config.lora_alpha,
                            target_modules=sorted(config.target_modules))
        clone.load_state_dict(self.state_dict())
        for p in clone.parameters():
            p.requires_grad_(trainable)
        if active is not None:
            self.backend.set_adapter(active)
        return clone

    def copies(self) -> Iterator[str]:
        """Names of this adapter's copies on the backend (``<name>_s<n>``)."""
        return (n for n in self.backend.adapter_names if n.startswith(f"{self.name}_s"))
