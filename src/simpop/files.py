"""Files that a kill never leaves half-written: write beside the target, fsync, rename over it.

:func:`atomic_path` yields a temporary path in the target's folder; when the block ends without an error the
file is fsynced and renamed over the target (``os.replace`` is atomic on one filesystem) and the folder is
fsynced, so the rename itself survives a crash; on an error the temporary file is removed and the target stays
as it was. :func:`write_atomically` writes bytes or text that way, :func:`write_json` strict JSON (no NaN);
:func:`append_durably` appends text in one fsynced write (a log a kill may cut only at its end). :func:`atomic_folder`
does for a folder what :func:`atomic_path` does for a file: filled under a temporary name beside the target, renamed
into place when complete.

:func:`run_lock` gives a folder one writer: every command that writes a run folder (``simpop train``,
``experiment``, ``eval``, ``audit --out``, ``openenv serve --cotrain-dir``) holds its lock (``filelock``, an
exclusive ``flock`` on ``FOLDER/.simpop.lock``, released by the kernel if the holder dies) before it touches a
file there, and a second one is refused at once.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

#: The lock file of :func:`run_lock` (left in the folder: removing it on release would race a new holder).
RUN_LOCK = ".simpop.lock"


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path (``.NAME.<random>.tmp``) to write instead of ``path``, which it replaces at the end."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_atomically(path: str | Path, data: bytes | str) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


def write_json(path: str | Path, value: object, indent: int = 2) -> None:
    """Write ``value`` to ``path`` as strict JSON through :func:`write_atomically`: NaN and infinities as null,
    numpy scalars and arrays as numbers and lists (what other JSON readers than Python's accept)."""
    write_atomically(path, json.dumps(_strict(value), indent=indent, ensure_ascii=False, allow_nan=False) + "\n")


def _strict(value: object) -> object:
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    return value


def append_durably(path: str | Path, text: str) -> None:
    """Append ``text`` (UTF-8) to ``path`` in one write, flushed and fsynced (nothing for empty text)."""
    if not text:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_folder(path: str | Path, replace: bool = False) -> Iterator[Path]:
    """A fresh folder (``.NAME.<random>.tmp``, beside ``path``) to fill; renamed to ``path`` when the block ends.

    On an error the folder is removed and ``path`` stays as it was. An existing ``path`` is replaced only with
    ``replace``: it is set aside, removed once the new folder is in place, and put back if that rename fails.

    Raises:
        FileExistsError: ``path`` exists when the block ends and ``replace`` is False.
    """
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if not path.exists():
            tmp.rename(path)
        elif not replace:
            raise FileExistsError(f"{path} exists (it appeared while the new folder was written); it is kept")
        else:
            old = tmp.with_suffix(".old")  # .NAME.<random>.old: as unique as tmp
            path.rename(old)
            try:
                tmp.rename(path)
            except BaseException:
                old.rename(path)
                raise
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: str | Path) -> None:
    """Make the latest renames in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def run_lock(folder: str | Path, flag: str = "--out") -> Iterator[Path]:
    """Hold ``folder``'s writer lock while a command writes it; yields the folder (made as needed).

    The folder is checked before the block runs: made, locked (timeout 0) and written (a probe through
    :func:`write_atomically`, removed at once).

    Raises:
        ValueError: One line naming ``flag`` and the folder: another run holds the lock, or the folder is a
            file, cannot be made (under a file, in ``/proc``) or cannot be written.
    """
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{flag} {folder}: exists and is not a folder")
    lock, probe = FileLock(folder / RUN_LOCK, timeout=0), folder / f"{RUN_LOCK}.probe"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock.acquire()
        try:
            write_atomically(probe, b"")
            probe.unlink()
        except BaseException:
            lock.release()
            raise
    except Timeout:  # before OSError: filelock's Timeout is a TimeoutError
        raise ValueError(f"another simpop run is writing {flag} {folder} right now (it holds {RUN_LOCK}); wait for "
                         f"it to end, or choose another {flag}") from None
    except OSError as error:
        raise ValueError(f"{flag} {folder}: cannot make or write the folder ({error.strerror or error})") from None
    try:
        yield folder
    finally:
        lock.release()
