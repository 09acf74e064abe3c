"""Atomic checkpoints, RNG state, latest()."""

from __future__ import annotations

import random

import numpy as np
import torch

from simpop import checkpoint


def test_save_load_latest_and_rng(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = checkpoint.save(tmp_path, 3, {"w": torch.arange(3), "n": 7})
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    step, state = checkpoint.load(path)  # restores the RNG states saved with it
    assert step == 3 and state["n"] == 7 and torch.equal(state["w"], torch.arange(3))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert checkpoint.latest(tmp_path) == path


def test_keep_and_ignore_temporary_files(tmp_path):
    for step in (1, 2, 10, 11):
        checkpoint.save(tmp_path, step, {"step": step}, keep=2)
    folder = checkpoint.checkpoint_dir(tmp_path)
    (folder / ".step_0000099.pt.abc.tmp").write_bytes(b"torn")  # a save killed mid-write
    assert sorted(p.name for p in folder.glob("step_*.pt")) == ["step_0000010.pt", "step_0000011.pt"]
    assert checkpoint.latest(tmp_path).name == "step_0000011.pt"
    assert checkpoint.load(checkpoint.latest(tmp_path), restore_rng=False) == (11, {"step": 11})
