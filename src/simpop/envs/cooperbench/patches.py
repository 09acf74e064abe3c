"""Reading unified diffs: which paths a patch touches, test-file stripping, path safety.

Patches come from models, so before git sees one, :func:`unsafe_paths` rejects any that could
write outside the repository: absolute paths, ``..`` components, paths into ``.git``, symlinks
the patch creates that point outside the repository, and paths that pass through an existing
symlink leading outside it. (``git apply`` has its own guards; this is the first line.)
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

# Upstream CooperBench's rule for test files (eval/sandbox.py): an agent's test files must never
# reach the graded patch, where they would collide with the hidden tests.patch.
_TEST_DIR_RE = re.compile(r"/(tests?|__tests__|spec|testdata)/")
_TEST_FILE_RE = re.compile(
    r"(^|/)("
    r"test_[^/]+"
    r"|[^/]+_test\.[A-Za-z0-9]+"
    r"|[^/]+\.(test|spec)\.[A-Za-z0-9]+"
    r"|[^/]*Tests?\.(java|kt|cs|scala)"
    r"|tests?\.py"
    r")$"
)
_SYMLINK_MODE = "120000"
_HUNK_RE = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", '"': '"', "\\": "\\"}


@dataclass
class FileChange:
    """One file section of a patch.

    Attributes:
        paths: Every path the section names (old and new, prefixes removed, ``/dev/null`` dropped).
        symlink_target: The link target when the section creates or rewrites a symlink.
    """

    paths: list[str]
    symlink_target: str | None = None


def is_test_path(path: str) -> bool:
    """Whether ``path`` names a test file, by upstream's rule (any language)."""
    return bool(_TEST_DIR_RE.search("/" + path) or _TEST_FILE_RE.search(path))


def split_sections(patch: str) -> list[list[str]]:
    """Split a patch into per-file sections of lines (text before the first header is dropped).

    Hunk bodies are consumed by their line counts, so content lines that happen to start with
    ``---`` or ``diff --git`` never start a section.
    """
    sections: list[list[str]] = []
    old_left = new_left = 0
    git_header_open = False  # inside a "diff --git" header, before its "---" line
    lines = patch.split("\n")  # not splitlines(): content may hold \r, \f or other separators
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines:
        if old_left > 0 or new_left > 0:
            sections[-1].append(line)
            if line.startswith("-"):
                old_left -= 1
            elif line.startswith("+"):
                new_left -= 1
            elif not line.startswith("\\"):
                old_left -= 1
                new_left -= 1
            continue
        hunk = _HUNK_RE.match(line)
        if hunk and sections:
            old_left = 1 if hunk.group(1) is None else int(hunk.group(1))
            new_left = 1 if hunk.group(2) is None else int(hunk.group(2))
            git_header_open = False
            sections[-1].append(line)
        elif line.startswith("diff --git "):
            sections.append([line])
            git_header_open = True
        elif line.startswith("--- ") and not git_header_open:
            sections.append([line])
        elif sections:
            if line.startswith("--- "):
                git_header_open = False
            sections[-1].append(line)
    return sections


def file_changes(patch: str) -> list[FileChange]:
    """The file sections of ``patch`` with the paths each one names."""
    changes = []
    for section in split_sections(patch):
        paths: list[str] = []
        symlink = False
        header_done = False
        target_lines: list[str] = []
        for line in section:
            if line.startswith("@@"):
                header_done = True
                continue
            if header_done:
                if symlink and line.startswith("+") and not line.startswith("+++"):
                    target_lines.append(line[1:])
                continue
            if line.startswith("diff --git "):
                paths += _git_header_paths(line[len("diff --git "):])
            elif line.startswith(("--- ", "+++ ")):
                paths.append(_strip_prefix(_unquote(line[4:].split("\t")[0].rstrip())))
            elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
                paths.append(_unquote(line.split(" ", 2)[2]))
            elif line.startswith(("new file mode ", "new mode ")) and line.split()[-1] == _SYMLINK_MODE:
                symlink = True
        paths = [p for p in dict.fromkeys(paths) if p != "/dev/null"]
        changes.append(FileChange(paths, target_lines[0] if symlink and target_lines else None))
    return changes


def touched_paths(patch: str) -> list[str]:
    """Every path ``patch`` names, in order, without duplicates."""
    return list(dict.fromkeys(p for change in file_changes(patch) for p in change.paths))


def strip_test_files(patch: str) -> str:
    """Drop the sections of ``patch`` that touch test files (upstream's filter); keep a final newline."""
    kept = []
    for section in split_sections(patch):
        paths = [p for change in file_changes("\n".join(section)) for p in change.paths]
        if not any(is_test_path(p) for p in paths):
            kept.append("\n".join(section))
    text = "\n".join(kept)
    return text + "\n" if text else ""


def unsafe_paths(patch: str, repo: Path | None = None) -> list[str]:
    """Why ``patch`` could write outside the repository (empty if it cannot).

    Args:
        patch: The unified diff.
        repo: The checkout the patch will be applied to; when given, existing symlinks on the
            touched paths are followed and must stay inside it.
    """
    problems = []
    root = repo.resolve() if repo is not None else None
    for change in file_changes(patch):
        for path in change.paths:
            reason = path_problem(path)
            if reason is None and root is not None and not _stays_inside(root, path):
                reason = "passes through a symlink that leads outside the repository"
            if reason:
                problems.append(f"{path!r}: {reason}")
        if change.symlink_target is not None and change.paths:
            link_dir = posixpath.dirname(change.paths[-1])
            target = change.symlink_target
            resolved = posixpath.normpath(posixpath.join(link_dir, target))
            if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
                problems.append(f"{change.paths[-1]!r}: symlink to {target!r} points outside the repository")
    return problems


def path_problem(path: str) -> str | None:
    """Why a repository-relative ``path`` is not acceptable (None if it is)."""
    if not path or "\0" in path:
        return "empty or contains a NUL byte"
    if path.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", path):
        return "absolute path"
    parts = re.split(r"[\\/]", path)
    if ".." in parts:
        return "contains '..'"
    if any(part.lower() == ".git" for part in parts):
        return "inside .git"
    return None


def _stays_inside(root: Path, path: str) -> bool:
    """Whether ``root/path`` resolves (following existing symlinks) to a place inside ``root``."""
    return (root / path).resolve().is_relative_to(root)


def _git_header_paths(rest: str) -> list[str]:
    """The two paths of a ``diff --git a/X b/Y`` header (quoted or not)."""
    if rest.startswith('"'):
        first, _, remainder = _split_quoted(rest)
        second = remainder.strip()
        return [_strip_prefix(first), _strip_prefix(_unquote(second))]
    if ' "' in rest:
        first, _, second = rest.partition(' "')
        return [_strip_prefix(first), _strip_prefix(_unquote('"' + second))]
    # Unquoted: "a/X b/X"; when both names are equal the split point is the middle.
    half = (len(rest) - 1) // 2
    if len(rest) % 2 == 1 and rest[half] == " " and rest[:half][2:] == rest[half + 1:][2:]:
        return [_strip_prefix(rest[:half]), _strip_prefix(rest[half + 1:])]
    match = re.match(r"(\S+) (\S+)$", rest)
    return [_strip_prefix(match.group(1)), _strip_prefix(match.group(2))] if match else [rest]


def _split_quoted(text: str) -> tuple[str, str, str]:
    """Split ``"quoted" rest`` into (unquoted, separator, rest)."""
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return _unquote(text[: i + 1]), " ", text[i + 1:]
        i += 1
    return _unquote(text), "", ""


def _unquote(path: str) -> str:
    """Undo git's C-style quoting of unusual path names."""
    if not (len(path) >= 2 and path.startswith('"') and path.endswith('"')):
        return path
    body, out, i = path[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and re.match(r"[0-7]{3}", body[i + 1:i + 4]):
                out.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            out += _C_ESCAPES.get(nxt, nxt).encode()
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", errors="replace")


def _strip_prefix(path: str) -> str:
    """Remove git's ``a/`` / ``b/`` prefix."""
    return path[2:] if path.startswith(("a/", "b/")) else path
