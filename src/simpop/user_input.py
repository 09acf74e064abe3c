"""What users type and write, read within bounds: YAML (config files, ``--env-arg`` values, panels) and the
one-line errors that quote it.

:func:`load_yaml` is PyYAML's ``safe_load`` with three bounds, checked before any Python value is built: nesting
depth (PyYAML's composer recurses, so a few thousand nested brackets would raise ``RecursionError``), the number
of values once aliases are expanded and the characters of the scalars once expanded (a few hundred bytes of
anchors and aliases, a "billion laughs", expand to gigabytes wherever the value is printed, copied or walked).
A value beyond a bound is a ``ValueError`` naming the source and the bound. :func:`error_line` is what a CLI
prints for a bad input: one line, at most :data:`MAX_ERROR_CHARS` characters.

Command-line numbers are read by :class:`Bounded` types (:func:`integer`, :func:`number`): every numeric flag
states its range, and ``nan``, ``inf`` or a value outside it is refused while the arguments are parsed.
:class:`ArgumentParser` reports any bad argument as one line and exit status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, NoReturn

#: Deepest nesting of YAML collections.
MAX_DEPTH = 64
#: Most values (scalars and collections) of a YAML document, aliases expanded.
MAX_VALUES = 100_000
#: Most scalar characters of a YAML document, aliases expanded.
MAX_CHARS = 1_000_000
#: Largest YAML file read.
MAX_FILE_BYTES = 4 * 1024 * 1024
#: Longest error line a CLI prints (the rest is cut, with a note saying so).
MAX_ERROR_CHARS = 500
#: Largest seed (numpy's legacy seeding and many libraries take 32-bit seeds).
MAX_SEED = 2**32 - 1
#: Largest integer any setting takes (a signed 64-bit integer; torch and numpy overflow beyond).
MAX_INT = 2**63 - 1


def load_yaml(text: str, source: str, loader: type | None = None) -> Any:
    """``yaml.safe_load(text)`` within the module's bounds (``source`` names the input in errors).

    ``loader``: a ``yaml.SafeLoader`` subclass to read with (default ``SafeLoader``).

    Raises:
        ValueError: The YAML does not parse, or is beyond a bound.
    """
    import yaml

    class Loader(loader or yaml.SafeLoader):  # type: ignore[misc,valid-type]
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise ValueError(f"{source}: YAML nested deeper than {MAX_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        values, chars = _expanded_size(node, {})
        if values > MAX_VALUES or chars > MAX_CHARS:
            raise ValueError(f"{source}: the YAML expands to {values} values and {chars} characters (aliases "
                             f"repeat what they name); at most {MAX_VALUES} values and {MAX_CHARS} characters")
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise ValueError(f"{source}: not valid YAML ({error_line(error, 200)})") from None
    finally:
        loader.dispose()


def load_yaml_file(path: str | Path, loader: type | None = None) -> Any:
    """:func:`load_yaml` of a file of at most :data:`MAX_FILE_BYTES` (ValueError beyond, or if unreadable)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ValueError(f"{path}: {size} bytes; a YAML file may have at most {MAX_FILE_BYTES}")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read it ({error_line(error, 200)})") from None
    return load_yaml(text, str(path), loader)


def _expanded_size(node: Any, memo: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """(values, scalar characters) of ``node`` with every alias expanded, counting each shared node once per use."""
    import yaml

    known = memo.get(id(node))
    if known is not None:
        return known
    if isinstance(node, yaml.ScalarNode):
        size = (1, len(node.value))
    else:
        children = [x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode) else node.value
        sizes = [_expanded_size(child, memo) for child in children]
        size = (1 + sum(v for v, _ in sizes), sum(c for _, c in sizes))
    memo[id(node)] = size
    return size


def error_line(error: BaseException | str, limit: int = MAX_ERROR_CHARS) -> str:
    """An error as one line of at most ``limit`` characters (a ``KeyError``'s quotes removed)."""
    text = " ".join(part.strip() for part in str(error).strip().splitlines() if part.strip())
    if isinstance(error, KeyError) and text.startswith(("'", '"')) and text.endswith(("'", '"')):
        text = text[1:-1]
    if not text and isinstance(error, BaseException):
        text = type(error).__name__
    if len(text) > limit:
        cut = len(text) - limit
        text = f"{text[:limit]}... ({cut} more characters)"
    return text


class Bounded:
    """An argparse ``type``: a finite number (an integer if ``kind`` is int) within ``[low, high]``; with
    ``above``, strictly greater than ``low``. A value outside is an ``ArgumentTypeError`` saying the range."""

    def __init__(self, kind: type, low: float, high: float, *, above: bool = False) -> None:
        if kind not in (int, float) or not low <= high:
            raise ValueError(f"Bounded: kind must be int or float and low <= high, got {kind}, {low}, {high}")
        self.kind, self.low, self.high, self.above = kind, low, high, above
        self.__name__ = kind.__name__  # argparse names the type in its messages

    def __call__(self, text: str) -> Any:
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{self.describe()}, got {error_line(repr(text), 60)}") from None
        if not math.isfinite(value) or value > self.high or value < self.low or (self.above and value == self.low):
            raise argparse.ArgumentTypeError(f"{self.describe()}, got {error_line(text, 60)}")
        return value

    def describe(self) -> str:
        """The range in words: ``an integer from 1 to 1024``, ``a number > 0 and <= 3600``."""
        noun = "an integer" if self.kind is int else "a number"
        low, high = (f"{int(x)}" if self.kind is int else f"{x:g}" for x in (self.low, self.high))
        if self.high == math.inf:
            return f"must be {noun} {'>' if self.above else '>='} {low}"
        if not self.above:
            return f"must be {noun} from {low} to {high}"
        return f"must be {noun} > {low} and <= {high}"

    def __repr__(self) -> str:
        return f"Bounded({self.kind.__name__}, {self.low}, {self.high}, above={self.above})"


def integer(low: int, high: int = MAX_INT) -> Bounded:
    """An integer flag within ``[low, high]``."""
    return Bounded(int, low, high)


def number(low: float, high: float = math.inf, *, above: bool = False) -> Bounded:
    """A finite number flag within ``[low, high]`` (``above``: strictly greater than ``low``)."""
    return Bounded(float, low, high, above=above)


#: A seed flag.
SEED = integer(0, MAX_SEED)
#: A TCP port (0: any free port).
PORT = integer(0, 65535)
#: Torch CPU threads.
THREADS = integer(1, 1024)
#: A duration in seconds (at most a day).
SECONDS = number(0, 86_400, above=True)


class UsageError(ValueError):
    """A command's arguments cannot be used together or as given: ``simpop`` prints it as one line and exits 2."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors are one line (``prog: error: ...``) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``prog: error: message`` as one line and exit with status 2."""
        sys.stderr.write(f"{self.prog}: error: {error_line(message)} (see {self.prog} --help)\n")
        sys.exit(2)
