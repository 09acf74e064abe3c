"""Files that a kill never leaves half-written: write beside the target, fsync, rename over it.

:func:`atomic_path` yields a temporary path in the target's folder; when the block ends without an error the
file is fsynced and renamed over the target (``os.replace`` is atomic on one filesystem) and the folder is
fsynced, so the rename itself survives a crash; on an error the temporary file is removed and the target stays
as it was. :func:`write_atomically` writes bytes or text that way. Locks between processes are ``filelock``'s.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


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


def fsync_dir(folder: str | Path) -> None:
    """Make the latest renames in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
