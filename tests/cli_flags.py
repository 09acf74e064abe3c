"""Walk every parser of simpop's commands and check that each numeric flag refuses ``nan``, ``inf`` and values
outside its range with one line and exit status 2 (:mod:`tests.test_cli_flags`). No pytest here: a module whose
extra lives in another environment (``simpop.integrations.verifiers_env``) is walked there, as a subprocess::

    PYTHONPATH=src:. python -m tests.cli_flags simpop.integrations.verifiers_env
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import simpop
from simpop.train.config import FieldType
from simpop.user_input import ArgumentParser, Bounded

#: The repository root.
ROOT = Path(__file__).resolve().parents[1]
NON_FINITE = ["nan", "NaN", "inf", "-inf", "1e400", "-1e400"]


def subparsers(parser: argparse.ArgumentParser, argv: list[str]) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    """``(argv, parser)`` for ``parser`` and every subcommand parser below it."""
    yield argv, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from subparsers(child, [*argv, name])


def standalone_mains() -> list[str]:
    """Modules with a ``main(argv)`` that builds its own parser (``python -m ...`` entry points)."""
    root = Path(simpop.__file__).parent
    return [".".join(path.relative_to(root.parent).with_suffix("").parts) for path in sorted(root.rglob("*.py"))
            if path != root / "cli.py" and "ArgumentParser(" in (text := path.read_text()) and "def main(" in text]


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def standalone_parser(module: str) -> argparse.ArgumentParser:
    """The parser ``module.main`` builds (caught at its ``parse_args``)."""
    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Captured(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign,assignment]
    try:
        importlib.import_module(module).main([])
    except _Captured as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise AssertionError(f"{module}.main([]) never parsed its arguments")


def flags(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """``(flag, action)`` for every option of ``parser`` that converts its value."""
    for action in parser._actions:
        if action.option_strings and action.type is not None:
            yield action.option_strings[-1], action


def is_numeric(kind: object) -> bool:
    return kind in (int, float) or isinstance(kind, Bounded) or (isinstance(kind, FieldType)
                                                                  and kind.kind in (int, float))


def bad_values(kind: object) -> list[str]:
    """Values a numeric flag's type must refuse."""
    if isinstance(kind, Bounded):
        below = kind.low if kind.above else kind.low - 1
        out = [*NON_FINITE, repr(float(below)) if kind.kind is float else str(int(below))]
        if math.isfinite(kind.high):
            out.append(str(int(kind.high) + 1) if kind.kind is int else repr(kind.high * 2 + 1))
        return out
    assert isinstance(kind, FieldType), f"a numeric flag without a range: {kind}"
    return [*NON_FINITE, str(2**64), str(-2**64)] if kind.kind is int else NON_FINITE


def check(name: str, top: argparse.ArgumentParser, argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """Every numeric flag of ``parser`` (the subcommand ``argv`` of ``top``, the parser ``name`` runs) fed every bad
    value: the failures, as lines."""
    failures = []
    for flag, action in flags(parser):
        if not is_numeric(action.type):
            continue
        if action.type in (int, float):
            failures.append(f"{name} {' '.join(argv)} {flag}: read without a range (use simpop.user_input.integer)")
            continue
        for bad in bad_values(action.type):
            command = [*argv, f"{flag}={bad}"]
            err = io.StringIO()
            code: object = None
            with contextlib.redirect_stderr(err):
                try:
                    top.parse_args(command)
                except SystemExit as exited:
                    code = exited.code
            text = err.getvalue()
            if code != 2 or text.count("\n") != 1 or f"argument {flag}" not in text:
                failures.append(f"{name} {' '.join(command)}: exit {code}, stderr {text[:300]!r}")
    return failures


def walk_module(module: str) -> tuple[int, list[str]]:
    """(numeric flags, failures) of one standalone module."""
    parser = standalone_parser(module)
    if not isinstance(parser, ArgumentParser):
        return 0, [f"{module} must parse with simpop.user_input.ArgumentParser (one-line errors)"]
    return sum(is_numeric(a.type) for _, a in flags(parser)), check(module, parser, [], parser)


if __name__ == "__main__":
    total, failures = walk_module(sys.argv[1])
    print("\n".join(failures))
    print(f"{total} numeric flags, {len(failures)} failures")
    raise SystemExit(1 if failures else 0)
