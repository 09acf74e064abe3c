"""Reading unified diffs: which paths a patch touches, test-file stripping, path safety.

Patches come from models, so before git sees one, :func:`unsafe_paths` rejects any that could
write outside the repository: absolute paths, ``..`` components, paths into ``.git``, symlinks
the patch creates that point outside the repository, and paths that pass through an existing
symlink leading outside it, and names the filesystem cannot hold (a component over
:data:`MAX_NAME_BYTES`, a path over :data:`MAX_PATH_BYTES` or :data:`MAX_DEPTH` components).
(``git apply`` has its own guards; this is the first line.)

:func:`strip_test_files` drops *test files* (upstream's rule) and *test infrastructure*
(:func:`is_test_infrastructure`: what changes how pytest runs or what Python imports before the
tests: ``conftest.py`` at any depth, pytest/tox config files, ``sitecustomize``/``usercustomize``,
``.pth`` files, package metadata that registers plugins, top-level modules that shadow pytest or
the standard library). ``pyproject.toml``/``setup.cfg`` are stripped only when their pytest
section changes, which needs the files' text: see :func:`pytest_config`.
"""

from __future__ import annotations

import configparser
import json
import posixpath
import re
import sys
import tomllib
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
#: Files that configure pytest or run code before the tests, at any depth (test infrastructure).
_INFRA_NAMES = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini",
                          "sitecustomize.py", "usercustomize.py", "noxfile.py"})
#: Top-level module names a repository file may not take (``python -m pytest`` puts the working
#: directory first on ``sys.path``, so ``pytest.py`` there would replace pytest itself).
_PYTEST_NAMES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging", "simpop_pytest_guard",
                           "xdist"})
_SHADOWED = frozenset(sys.stdlib_module_names) | _PYTEST_NAMES
#: Files whose pytest section is test infrastructure while the rest of the file is not.
PYTEST_CONFIG_FILES = ("pyproject.toml", "setup.cfg")
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
MAX_DEPTH = 32
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


def is_test_infrastructure(path: str) -> bool:
    """Whether ``path`` is test infrastructure: it can change how pytest runs or reports.

    ``conftest.py``, pytest/tox/nox config files, ``sitecustomize.py``/``usercustomize.py`` at any
    depth; ``.pth`` files; anything inside ``*.dist-info``/``*.egg-info`` (entry points register
    pytest plugins); ``pytest_*`` plugin modules; and top-level (or ``src/``-level) modules or
    packages named like pytest or its dependencies, and top-level modules or regular packages
    (``name/__init__.py``) named like a standard-library module.
    """
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts:
        return False
    name = parts[-1]
    if name in _INFRA_NAMES or name.endswith(".pth") or name.startswith("pytest_") and name.endswith(".py"):
        return True
    if any(p.endswith((".dist-info", ".egg-info", ".egg-link")) for p in parts):
        return True
    top = parts[1:] if parts[0] in ("src", "lib") and len(parts) > 1 else parts
    if len(top) > 1:  # a package: any file under a pytest-like name; a stdlib name only as a regular package
        return top[0] in _PYTEST_NAMES or (top[0] in _SHADOWED and top[1] in ("__init__.py", "__init__.pyi"))
    module = re.sub(r"\.(py|pyc|pyi|so|pyd)$|\.[^.]*\.(so|pyd)$", "", top[0])
    return module != top[0] and module in _SHADOWED


def pytest_config(path: str, text: str | None) -> str | None:
    """The pytest section of a ``pyproject.toml``/``setup.cfg``/``tox.ini`` as comparable text.

    None if the file (or the section) is absent. A file that does not parse returns its whole
    text, so any change to it counts as a change of its pytest section.
    """
    if text is None:
        return None
    name = posixpath.basename(path)
    try:
        if name == "pyproject.toml":
            section = tomllib.loads(text).get("tool", {}).get("pytest")
            return None if section is None else json.dumps(section, sort_keys=True, default=str)
        parser = configparser.RawConfigParser(strict=False, interpolation=None)
        parser.read_string(text)
        found = {s: dict(parser.items(s)) for s in ("tool:pytest", "pytest") if parser.has_section(s)}
        return json.dumps(found, sort_keys=True) if found else None
    except (tomllib.TOMLDecodeError, configparser.Error, ValueError, AttributeError):
        return "unparseable:" + text


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


def strip_test_files(patch: str, also: frozenset[str] | set[str] = frozenset()) -> str:
    """Drop the sections of ``patch`` that touch test files or test infrastructure; keep a final newline.

    Args:
        patch: The unified diff.
        also: Further paths whose sections are dropped (e.g. a ``pyproject.toml`` whose pytest
            section the patch changes; see :func:`pytest_config`).
    """
    kept = []
    for section in split_sections(patch):
        paths = [p for change in file_changes("\n".join(section)) for p in change.paths]
        if not any(is_test_path(p) or is_test_infrastructure(p) or p in also for p in paths):
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
    try:
        encoded = [part.encode("utf-8") for part in parts]
    except UnicodeEncodeError:
        return "not valid Unicode (unpaired surrogates)"
    longest = max(len(part) for part in encoded)
    if longest > MAX_NAME_BYTES:
        return f"a file or folder name is {longest} bytes long (the limit is {MAX_NAME_BYTES})"
    if len(path.encode("utf-8", "replace")) > MAX_PATH_BYTES:
        return f"longer than {MAX_PATH_BYTES} bytes"
    if len(parts) > MAX_DEPTH:
        return f"{len(parts)} levels deep (the limit is {MAX_DEPTH})"
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
