"""A griffe extension for simpop's Sphinx-flavoured docstrings, so that mkdocstrings renders them.

- ``#:`` comments above a module or class attribute (Sphinx's attribute docstrings, e.g. ``seat.KINDS``)
  become that attribute's docstring.
- reST's literal-block marker (``Example::``) becomes a colon.
- Sphinx roles (``:class:`~simpop.x.Y```) become Markdown. A role whose target resolves to a public simpop
  object that the reference renders (a module, or a class, function or attribute with a docstring; absolute,
  or relative to the docstring's module/package with a leading dot) becomes a cross-reference
  (``[`Y`][simpop.x.Y]``; autorefs fails the strict build if no page renders it); any other target (private
  names, numpy, the standard library) becomes inline code.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):`(?P<body>[^`]+)`")
LITERAL_MARKER = re.compile(r"(?<=\S)(::)$|^\s*::$", re.M)
LABELLED = re.compile(r"^(?P<label>.+?)\s*<(?P<target>[^>]+)>$")


@functools.lru_cache(maxsize=None)
def _source_lines(path: Any) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def _module_of(obj: griffe.Object) -> griffe.Object:
    while not obj.is_module and obj.parent is not None:
        obj = obj.parent
    return obj


class SphinxRoles(griffe.Extension):
    """Rewrites Sphinx roles in every loaded docstring (after the whole package is loaded, so targets resolve)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        """Give attributes their ``#:`` docstrings, then rewrite the roles of every docstring of ``pkg``."""
        self._comments(pkg, set())
        self._walk(pkg, loader, set())

    def _comments(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        for member in obj.members.values():
            if member.is_alias:
                continue
            if member.is_attribute and member.docstring is None and member.lineno and member.filepath:
                lines = _source_lines(member.filepath)
                comment, i = [], member.lineno - 2
                while i >= 0 and lines[i].strip().startswith("#:"):
                    comment.insert(0, lines[i].strip()[2:].strip())
                    i -= 1
                if comment:
                    member.docstring = griffe.Docstring("\n".join(comment), parent=member)
            elif member.is_module or member.is_class:
                self._comments(member, seen)

    def _walk(self, obj: griffe.Object, loader: griffe.GriffeLoader, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None and ":" in obj.docstring.value:
            value = ROLE.sub(lambda m: self._render(m.group("body"), obj, loader), obj.docstring.value)
            # reST's literal-block marker: "Example::" reads "Example:", a lone "::" line goes (the indented
            # block that follows is a Markdown code block as it is).
            obj.docstring.value = LITERAL_MARKER.sub(lambda m: ":" if m.group(1) else "", value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, loader, seen)

    def _render(self, body: str, obj: griffe.Object, loader: griffe.GriffeLoader) -> str:
        labelled = LABELLED.match(body)
        label, target = (labelled["label"], labelled["target"]) if labelled else (None, body)
        short = target.startswith("~")
        target = target.lstrip("~").removesuffix("()")
        path = self._resolve(target, obj, loader)
        text = label or (target.lstrip(".").rsplit(".", 1)[-1] if short else target.lstrip("."))
        return f"[`{text}`][{path}]" if path else f"`{text}`"

    @staticmethod
    def _resolve(target: str, obj: griffe.Object, loader: griffe.GriffeLoader) -> str | None:
        module = _module_of(obj)
        package = module if module.is_package else module.parent
        if target.startswith("."):
            bases = [b for b in (module, package) if b is not None]
            candidates = [f"{b.path}{target}" for b in bases]
        else:
            candidates = [target, f"{module.path}.{target}"]
            if obj.is_class or (obj.parent is not None and obj.parent.is_class):
                cls = obj if obj.is_class else obj.parent
                candidates.append(f"{cls.path}.{target}")
        for candidate in candidates:
            if not candidate.startswith("simpop"):
                continue
            try:  # an alias on the way (``simpop.testing.copy``) points outside simpop: not a simpop object
                found = loader.modules_collection[candidate]
                if found.is_alias:
                    found = found.final_target
            except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            rendered = found.is_module or (found.docstring is not None and (found.is_class or found.is_function
                                                                            or found.is_attribute))
            if rendered and not any(part.startswith("_") for part in found.path.split(".")):
                return found.path
            return None
        return None
