"""Issue 18 item 8: resuming past a corrupted checkpoint, leftover temporary files, checksums."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import zipfile

import numpy as np
import pytest
import torch

from simpop import checkpoint
from simpop.train import loop
from tests.train.test_loop import Counter as LoopCounter

CONFIG = loop.LoopConfig(save_every=1, keep_checkpoints=10, report_to="none")


class Counter(LoopCounter):
    """The loop tests' counter trainer, with a tensor in its state (so that a checkpoint has bytes to corrupt)."""

    def state_dict(self) -> dict:
        return {**super().state_dict(), "w": torch.full((64,), self.weight)}


def _corrupt(path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "random-bytes":
        path.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif how == "one-flipped-byte":  # inside the saved 1000-float32 tensor: torch.load reads it without a word
        entry = next(i for i in zipfile.ZipFile(io.BytesIO(data)).infolist() if i.file_size == 4000)
        i = entry.header_offset + 30 + len(entry.filename) + len(entry.extra) + 100
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    else:
        raise AssertionError(how)


def _warnings(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.mark.parametrize("how", ["truncated", "empty", "random-bytes"])
def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, caplog, how):
    loop.run(Counter(), 4, tmp_path, config=CONFIG)
    newest = checkpoint.checkpoint_dir(tmp_path) / "step_0000004.pt"
    _corrupt(newest, how)

    trainer = Counter()
    with caplog.at_level(logging.WARNING, logger="simpop.checkpoint"):
        history = loop.run(trainer, 6, tmp_path, config=CONFIG, resume=True)
    assert len(history) == 3 and trainer.update_count == 6 and trainer.weight == 3.0  # resumed from step 3
    assert str(newest) in _warnings(caplog)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # the log was cut back to step 3, then redone
    assert [r["value"] for r in records] == [0.5 * k for k in range(1, 7)]
    # the bad file was moved aside and step 4 written anew, intact
    assert (newest.parent / "step_0000004.pt.corrupt").exists()
    assert (newest.parent / "step_0000004.pt.corrupt.sha256").exists()
    assert checkpoint.load(newest, restore_rng=False)[0] == 4


def test_load_names_the_file_for_each_kind_of_damage(tmp_path):
    for k, how in enumerate(["truncated", "empty", "random-bytes", "one-flipped-byte"]):
        path = checkpoint.save(tmp_path, k, {"w": torch.arange(1000, dtype=torch.float32)}, keep=None)
        _corrupt(path, how)
        with pytest.raises(checkpoint.CheckpointError, match=str(path).replace(".", r"\.")):
            checkpoint.load(path, restore_rng=False)


def test_a_flipped_byte_torch_would_read_is_caught_by_the_checksum(tmp_path, caplog):
    good = checkpoint.save(tmp_path, 1, {"w": torch.zeros(1000)})
    bad = checkpoint.save(tmp_path, 2, {"w": torch.zeros(1000)})
    _corrupt(bad, "one-flipped-byte")
    assert not torch.equal(torch.load(bad, weights_only=False)["state"]["w"], torch.zeros(1000))  # silently wrong
    with pytest.raises(checkpoint.CheckpointError, match="fails its checksum"):
        checkpoint.load(bad, restore_rng=False)
    with caplog.at_level(logging.WARNING, logger="simpop.checkpoint"):
        path, step, state = checkpoint.load_latest(tmp_path, restore_rng=False)
    assert (path, step) == (good, 1) and torch.equal(state["w"], torch.zeros(1000))
    assert str(bad) in _warnings(caplog)
    assert checkpoint.latest(tmp_path) == good  # the corrupt one is no longer offered
    assert list(checkpoint.by_step(tmp_path)) == [1]


def test_checksum_is_saved_beside_each_checkpoint_and_removed_with_it(tmp_path):
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, {"step": step}, keep=2)
    folder = checkpoint.checkpoint_dir(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == [
        "step_0000002.pt", "step_0000002.pt.sha256", "step_0000003.pt", "step_0000003.pt.sha256"]
    path = folder / "step_0000003.pt"
    digest, name = (folder / "step_0000003.pt.sha256").read_text().split()
    assert name == path.name and digest == hashlib.sha256(path.read_bytes()).hexdigest()  # `sha256sum -c` format


def test_leftover_temporary_files_are_cleaned_on_resume_and_save(tmp_path):
    loop.run(Counter(), 2, tmp_path, config=CONFIG)
    folder = checkpoint.checkpoint_dir(tmp_path)
    torn = folder / ".step_0000003.pt.k1l2m3.tmp"            # a save killed mid-write
    torn_sum = folder / ".step_0000003.pt.sha256.x9y8.tmp"   # ... or while writing its checksum
    orphan = folder / "step_0000003.pt.sha256"              # ... or just before the rename
    for p in (torn, torn_sum, orphan):
        p.write_bytes(b"torn")
    unrelated = folder / "notes.txt"
    unrelated.write_text("mine")
    assert checkpoint.load_latest(tmp_path, restore_rng=False)[1] == 2
    assert not torn.exists() and not torn_sum.exists() and not orphan.exists() and unrelated.exists()
    torn.write_bytes(b"torn")
    checkpoint.save(tmp_path, 3, {"x": 1})
    assert not torn.exists()
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_all_checkpoints_corrupt_is_a_clear_error_naming_them(tmp_path):
    loop.run(Counter(), 2, tmp_path, config=CONFIG)
    folder = checkpoint.checkpoint_dir(tmp_path)
    for p in folder.glob("step_*.pt"):
        _corrupt(p, "truncated")
    for _ in range(2):  # nothing is moved aside, so a second attempt says the same instead of starting afresh
        with pytest.raises(checkpoint.CheckpointError) as error:
            loop.run(Counter(), 4, tmp_path, config=CONFIG, resume=True)
        assert "step_0000001.pt" in str(error.value) and "step_0000002.pt" in str(error.value)
    assert checkpoint.latest(tmp_path).name == "step_0000002.pt"


def test_checkpoints_without_a_checksum_still_load_and_are_checked_by_reading(tmp_path):
    """Checkpoints saved before checksums existed."""
    old = checkpoint.save(tmp_path, 1, {"n": 1})
    new = checkpoint.save(tmp_path, 2, {"n": 2})
    for p in (old, new):
        os.unlink(p.with_name(p.name + ".sha256"))
    assert checkpoint.load(old, restore_rng=False) == (1, {"n": 1})
    _corrupt(new, "truncated")
    path, step, state = checkpoint.load_latest(tmp_path, restore_rng=False)
    assert (path, step, state) == (old, 1, {"n": 1})


def test_a_fresh_run_dir_has_nothing_to_resume(tmp_path):
    assert checkpoint.load_latest(tmp_path) is None
    assert checkpoint.remove_leftovers(tmp_path) == []
