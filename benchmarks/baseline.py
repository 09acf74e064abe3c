"""A read-only checkout of an earlier commit, for benchmarks that compare this tree with it side by side."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
#: The last commit before the session that rebuilt serving and vectorised the act level.
BEFORE = "454aa18"


@contextlib.contextmanager
def tree(ref: str) -> Iterator[Path]:
    """``ref`` as a folder: an existing simpop tree (a path) as is, else a git revision checked out into a
    temporary worktree, removed afterwards."""
    if (Path(ref) / "src" / "simpop").is_dir():
        yield Path(ref)
        return
    with tempfile.TemporaryDirectory(prefix="simpop-baseline-") as parent:
        path = Path(parent) / "tree"
        add = subprocess.run(["git", "-C", str(CHECKOUT), "worktree", "add", "--detach", str(path), ref],
                             capture_output=True, text=True)
        if add.returncode != 0:
            raise SystemExit(f"cannot check out {ref!r} (needs the project's git history): {add.stderr.strip()}")
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(CHECKOUT), "worktree", "remove", "--force", str(path)],
                           capture_output=True)
