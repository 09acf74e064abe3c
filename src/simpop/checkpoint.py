"""Atomic training checkpoints and the random-number state they carry (written by the run loop, read by
``simpop eval`` for ``run:`` policies).

A checkpoint is one ``torch.save`` file ``run_dir/checkpoints/step_<k>.pt`` holding whatever the
trainer's ``state_dict()`` returns (policy, optimiser, update counter, ...) plus the Python, NumPy and
torch global RNG states. It is written to a temporary file in the same folder, fsynced, then renamed
over the final name (``os.replace`` is atomic on one filesystem), so a run killed at any moment leaves
either the previous checkpoint or the new one, never a torn file. Its SHA-256 goes beside it, in
``step_<k>.pt.sha256`` (``sha256sum -c`` format), written before the rename.

Disks still fail and files get copied half-way: :func:`load` checks the checksum (checkpoints written
before checksums existed are only checked by reading them) and raises :class:`CheckpointError` naming
the file for a truncated, empty or garbled one. :func:`load_latest`, which resumed runs use, falls back
to the newest intact checkpoint with a warning naming each bad file, and moves bad files aside
(``step_<k>.pt.corrupt``) so that :func:`latest` and :func:`by_step` no longer offer them. Temporary files
left by a killed save are removed by the next save or resume.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simpop.files import atomic_path, write_atomically
from simpop.user_input import error_line

log = logging.getLogger(__name__)

_NAME = re.compile(r"^step_(\d+)\.pt$")
#: Temporary files of :func:`save` (a killed save leaves one behind).
_TEMPORARY = re.compile(r"^\.step_\d+\.pt\..*\.tmp$")
_CHECKSUM = ".sha256"


class CheckpointError(ValueError):
    """A checkpoint file is unreadable: truncated, empty, garbled or failing its checksum (names the file)."""


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Where a run folder keeps its checkpoints (``RUN_DIR/checkpoints``)."""
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
    remove_leftovers(run_dir)
    path = folder / f"step_{step:07d}.pt"
    with atomic_path(path) as tmp:
        torch.save({"step": int(step), "state": state, "rng": rng_state()}, tmp)
        write_atomically(_checksum_path(path), f"{_sha256(tmp)}  {path.name}\n")
    if keep is not None:
        for old in _all(folder)[:-keep]:
            old.unlink(missing_ok=True)
            _checksum_path(old).unlink(missing_ok=True)
    return path


def load(path: str | Path, restore_rng: bool = True) -> tuple[int, dict[str, Any]]:
    """Read a checkpoint: ``(step, state)``; also restores the global RNG states unless told not to.

    Checkpoints hold NumPy RNG state, so they are read as full pickles: load only checkpoints you trust.

    Raises:
        CheckpointError: the file is missing, fails its checksum or is not a checkpoint (the message names it).
    """
    path = Path(path)
    verify(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated zip, bad pickle, empty file: each library error type differs
        raise CheckpointError(f"checkpoint {path} is unreadable ({type(e).__name__}: {error_line(e)})") from None
    if not isinstance(payload, dict) or not {"step", "state", "rng"} <= payload.keys():
        raise CheckpointError(f"checkpoint {path} is not a simpop checkpoint (no step/state/rng entries)")
    if restore_rng:
        set_rng_state(payload["rng"])
    return int(payload["step"]), payload["state"]


def verify(path: str | Path) -> None:
    """Check ``path`` against the checksum saved with it (nothing to check for a checkpoint saved without one).

    Raises:
        CheckpointError: the file is missing, empty or its SHA-256 differs from the saved one.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is empty (0 bytes)")
    checksum = _checksum_path(path)
    if not checksum.is_file():
        return
    expected = checksum.read_text(errors="replace").split()[:1]
    actual = _sha256(path)
    if expected != [actual]:
        raise CheckpointError(f"checkpoint {path} fails its checksum ({checksum.name} says "
                              f"{expected[0] if expected else 'nothing'}, the file hashes to {actual}): "
                              f"truncated or corrupted")


def load_latest(run_dir: str | Path, restore_rng: bool = True) -> tuple[Path, int, dict[str, Any]] | None:
    """The newest intact checkpoint of ``run_dir``: ``(path, step, state)``, or None when it has none.

    Removes a killed save's temporary files first. A newer checkpoint that fails :func:`load` is logged
    as a warning naming the file and why, and skipped; once an intact one is found, the bad newer ones are
    moved aside to ``<name>.corrupt`` (with their checksums).

    Raises:
        CheckpointError: checkpoints exist but none is intact (the message names each; nothing is moved).
    """
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return None
    remove_leftovers(run_dir)
    bad: list[tuple[Path, str]] = []
    for path in reversed(_all(folder)):
        try:
            step, state = load(path, restore_rng=restore_rng)
        except CheckpointError as e:
            log.warning("%s; falling back to an older checkpoint", e)
            bad.append((path, str(e)))
            continue
        for corrupt, _ in bad:  # kept for inspection, no longer offered by latest() / by_step()
            aside = corrupt.with_name(corrupt.name + ".corrupt")
            os.replace(corrupt, aside)
            if _checksum_path(corrupt).exists():
                os.replace(_checksum_path(corrupt), _checksum_path(aside))
        if bad:
            log.warning("resuming from checkpoint %s (step %d); moved the %d unreadable newer one(s) aside: %s",
                        path, step, len(bad), ", ".join(f"{p.name}.corrupt" for p, _ in bad))
        return path, step, state
    if bad:
        raise CheckpointError(f"no intact checkpoint in {folder}: " + "; ".join(reason for _, reason in bad))
    return None


def remove_leftovers(run_dir: str | Path) -> list[Path]:
    """Delete what killed saves left in ``run_dir``'s checkpoint folder: temporary files and checksums
    without their checkpoint. Returns the deleted paths."""
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    removed = []
    for p in folder.iterdir():
        orphan = p.name.endswith(f".pt{_CHECKSUM}") and _NAME.match(p.name[:-len(_CHECKSUM)]) and not (
            folder / p.name[:-len(_CHECKSUM)]).exists()
        if (_TEMPORARY.match(p.name) or orphan) and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    if removed:
        log.info("removed %d leftover file(s) of killed checkpoint saves in %s", len(removed), folder)
    return removed


def latest(run_dir: str | Path) -> Path | None:
    """The newest checkpoint file in ``run_dir`` (temporary files are ignored; nothing is read: see
    :func:`load_latest` for the newest intact one), or None."""
    folder = checkpoint_dir(run_dir)
    found = _all(folder) if folder.is_dir() else []
    return found[-1] if found else None


def by_step(run_dir: str | Path) -> dict[int, Path]:
    """Step -> complete checkpoint file of ``run_dir`` (empty when it has none)."""
    folder = checkpoint_dir(run_dir)
    return {int(_NAME.match(p.name).group(1)): p  # type: ignore[union-attr]  # _all lists matching names
            for p in _all(folder)} if folder.is_dir() else {}


def _all(folder: Path) -> list[Path]:
    """Checkpoints in ``folder``, oldest first."""
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def _checksum_path(path: Path) -> Path:
    return path.with_name(path.name + _CHECKSUM)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
