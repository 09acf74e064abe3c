"""Optimiser state kept on disk between steps, so that many adapters' optimisers do not all sit in memory.

Co-training K LoRA simulators and a policy on one base model keeps K + 1 Adam states (two tensors per trained
weight each) and K + 1 sets of gradients alive for the whole run, though only one of them is used at a time.
:class:`OffloadedOptimizer` wraps a torch optimiser: its state is read from a file right before each step and
written back (then dropped from memory) right after, and the gradients are freed after the step. The state
read back is the state written, so training is bit for bit what it would be without the offload; the cost is
one write and one read of the state per step (two float32 copies of the trained weights: ~40 MB for a rank-16
LoRA adapter of SmolLM2-135M), small next to an LLM step. ``benchmarks/memory.py`` (cases ``cotrain`` and
``cotrain_offload``) measures the peak both ways.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import torch

from simpop.files import atomic_path


class OffloadedOptimizer:
    """``optimizer`` with its state in a file of ``folder`` between steps (a private temporary folder by default).

    It offers what the trainers use of a torch optimiser: ``zero_grad``, ``step``, ``state_dict``,
    ``load_state_dict`` and ``param_groups``. ``state_dict`` reads the state back (a checkpoint holds it all).

    Args:
        optimizer: Any torch optimiser (its state must be tensors and plain values, as Adam's is).
        folder: Where the state file goes; None: a temporary folder removed with this object.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, folder: str | Path | None = None):
        self.optimizer = optimizer
        if folder is None:
            folder = tempfile.mkdtemp(prefix="simpop-optimizer-")
            weakref.finalize(self, shutil.rmtree, folder, True)
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.path = Path(folder) / f"state-{id(self):x}.pt"
        self._params = [p for group in optimizer.param_groups for p in group["params"]]
        self._offload()  # a state loaded or built before wrapping leaves memory too

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimiser's parameter groups (learning rates and the like; schedulers set them here)."""
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimiser's ``zero_grad`` (the state stays on disk)."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """Read the state, step, write the state back; the state and the gradients leave memory."""
        self._load()
        try:
            self.optimizer.step()
        finally:
            self._offload()
            self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimiser's whole state dict, read back from the file (the file stays as it was)."""
        self._load()
        state = self.optimizer.state_dict()
        self.optimizer.state.clear()  # still on disk, unchanged
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load ``state`` (from :meth:`state_dict` or a torch optimiser's) and write it to the file, out of memory."""
        self.optimizer.load_state_dict(state)
        self._offload()

    def _load(self) -> None:
        if self.path.exists():
            for param, saved in zip(self._params, torch.load(self.path, weights_only=True), strict=True):
                if saved:
                    self.optimizer.state[param] = saved

    def _offload(self) -> None:
        states = [dict(self.optimizer.state.get(p, {})) for p in self._params]
        if any(states):
            with atomic_path(self.path) as tmp:
                torch.save(states, tmp)
        self.optimizer.state.clear()
