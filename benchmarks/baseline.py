"""A read-only checkout of an earlier commit, for benchmarks that compare this tree with it side by side."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
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


def run_child(folder: Path, script: str, args: list[str], **env: str) -> dict:
    """Run ``script args`` in a child Python that imports simpop from ``folder``'s sources (``env``: more
    environment); the JSON object its last output line holds, checked to come from that tree (its ``simpop``
    field: the imported package's file)."""
    environment = {**os.environ, "PYTHONPATH": str(folder / "src"), **env}
    out = subprocess.run([sys.executable, script, *args], env=environment, cwd=folder, capture_output=True, text=True,
                         check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(result["simpop"]).resolve().is_relative_to(folder.resolve()):
        raise RuntimeError(f"child imported simpop from {result['simpop']}, not from {folder}")
    return result
