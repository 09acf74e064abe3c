"""Atomic training checkpoints and the random-number state they carry (written by the run loop, read by
``simpop eval`` for ``run:`` policies).

A checkpoint is one ``torch.save`` file ``run_dir/checkpoints/step_<k>.pt`` holding whatever the
trainer's ``state_dict()`` returns (policy, optimiser, update counter, ...) plus the Python, NumPy and
torch global RNG states. It is written to a temporary file in the same folder, fsynced, then renamed
over the final name (``os.replace`` is atomic on one filesystem), so a run killed at any moment leaves
either the previous checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

_NAME = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    """The global Python, NumPy and torch RNG states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(run_dir: str | Path, step: int, state: dict[str, Any], keep: int | None = 3) -> Path:
    """Atomically write ``state`` (plus the global RNG states) as the checkpoint of ``step``.

    Args:
        run_dir: The run folder; checkpoints go to ``run_dir/checkpoints``.
        step: The number of completed updates this state reflects.
        state: A ``torch.save``-able dict (tensors, numbers, strings, lists, dicts).
        keep: How many of the newest checkpoints to keep (older ones are deleted); None keeps all.

    Returns:
        The checkpoint's path.
    """
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:07d}.pt"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"step": int(step), "state": state, "rng": rng_state()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(folder)  # make the rename itself durable
    if keep is not None:
        for old in _all(folder)[:-keep]:
            old.unlink(missing_ok=True)
    return path


def load(path: str | Path, restore_rng: bool = True) -> tuple[int, dict[str, Any]]:
    """Read a checkpoint: ``(step, state)``; also restores the global RNG states unless told not to.

    Checkpoints hold NumPy RNG state, so they are read as full pickles: load only checkpoints you trust.
    """
    payload = torch.load(Path(path), map_location="cpu", weights_only=False)
    if restore_rng:
        set_rng_state(payload["rng"])
    return int(payload["step"]), payload["state"]


def latest(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint in ``run_dir`` (temporary files are ignored), or None."""
    folder = checkpoint_dir(run_dir)
    found = _all(folder) if folder.is_dir() else []
    return found[-1] if found else None


def by_step(run_dir: str | Path) -> dict[int, Path]:
    """Step -> complete checkpoint file of ``run_dir`` (empty when it has none)."""
    folder = checkpoint_dir(run_dir)
    return {int(_NAME.match(p.name).group(1)): p for p in _all(folder)} if folder.is_dir() else {}


def _all(folder: Path) -> list[Path]:
    """Checkpoints in ``folder``, oldest first."""
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
