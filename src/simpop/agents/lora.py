"""One LoRA adapter on a trainable backend: the object trainable policies and simulators share.

A :class:`LoRAAdapter` names one adapter on a :class:`~simpop.agents.base.TrainableBackend` (K adapters on
one base model hold K trained models in the memory of one). It activates itself before use, exposes its
parameters and its weights (for checkpoints), copies itself under a new name (checkpoint-pool snapshots)
and gives the base model with adapters off (the KL reference).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from simpop.agents.base import TrainableBackend


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
        import peft

        weights = peft.get_peft_model_state_dict(self.backend.model, adapter_name=self.name)
        return {k: v.detach().cpu().clone() for k, v in weights.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load weights saved by :meth:`state_dict`; keys that do not fit this adapter are an error."""
        import peft

        result = peft.set_peft_model_state_dict(self.backend.model, state, adapter_name=self.name)
        if result.unexpected_keys:
            raise ValueError(f"weights do not fit adapter {self.name!r}: {result.unexpected_keys[:3]}")

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
