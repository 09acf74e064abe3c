"""The one type validator: config fields (YAML, flags, configs built in Python), env arguments, panel files.

:func:`check` validates a value against a type annotation with pydantic's ``TypeAdapter``, under one set of
rules for every input:

- booleans are only ``true``/``false`` (a quoted ``"false"`` is refused, never taken as True);
- integers are integers (not ``4.7``, not ``true``); numbers are finite (``.inf`` and ``.nan`` are refused);
  strings are strings (not ``3``);
- numbers written as text are read as numbers (PyYAML reads ``1e-2``, without a dot, as the string ``"1e-2"``);
  lists are taken for tuples; other conversions are pydantic's lossless ones (``"6"`` -> 6, ``6.0`` -> 6);
- integers fit in 64 bits (torch and numpy overflow beyond); ``seed`` and ``*_seed`` values are from 0 to
  2**32 - 1 (numpy and torch take no negative seeds, and many libraries only 32-bit ones);
- nested configs (dataclass fields) are left to their own class; other classes are checked with ``isinstance``;
  an annotation pydantic cannot build a validator for is not checked.

A refused value is an :class:`InvalidValue` (a ``ValueError`` and a ``TypeError``) with a one-line message that
names the owner, the field and what it takes: ``GRPOConfig: group_size must be an integer, got 4.7 (float)``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AllowInfNan, BeforeValidator, ConfigDict, InstanceOf, StrictBool, StrictStr, TypeAdapter, \
    ValidationError

from simpop.user_input import MAX_INT, MAX_SEED

__all__ = ["InvalidValue", "check", "check_fields", "describe"]


class InvalidValue(ValueError, TypeError):
    """A value of the wrong type for its annotation (the message names the field and what it takes)."""


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("a bool is not a number")
    return value


_INT = Annotated[int, BeforeValidator(_not_bool)]
_FLOAT = Annotated[float, AllowInfNan(False), BeforeValidator(_not_bool)]


def _strict(hint: Any) -> Any:
    """``hint`` with the module's rules made explicit (strict bools and strings, no bool numbers)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is None or hint is type(None):
        return hint
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_strict(a) for a in args)]  # noqa: UP007 - built from a tuple
    if origin is Literal:
        return hint
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple[_strict(args[0]), ...]  # type: ignore[misc]
        return tuple[tuple(_strict(a) for a in args)] if args else tuple  # type: ignore[misc]
    if origin in (list, set, frozenset):
        return origin[_strict(args[0])] if args else origin
    if origin is dict:
        return dict[_strict(args[0]), _strict(args[1])] if args else dict  # type: ignore[misc]  # built at run time
    if origin is not None:
        return hint
    if hint is bool:
        return StrictBool
    if hint is int:
        return _INT
    if hint is float:
        return _FLOAT
    if hint is str:
        return StrictStr
    if isinstance(hint, type) and issubclass(hint, os.PathLike):
        return Path
    if dataclasses.is_dataclass(hint):
        return Any  # a nested config: its own class checks it
    if isinstance(hint, type):
        return InstanceOf[hint]  # type: ignore[misc]  # built at run time
    return hint


@functools.lru_cache(maxsize=512)
def _adapter(hint: Any) -> TypeAdapter | None:
    try:
        return TypeAdapter(_strict(hint), config=ConfigDict(arbitrary_types_allowed=True))
    except Exception:  # an annotation pydantic cannot validate (a Protocol, a forward reference): unchecked
        return None


def unwrap_optional(hint: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``; anything else -> ``(hint, False)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return hint, False


def describe(hint: Any) -> str:
    """An annotation in words, for error messages."""
    kind, optional = unwrap_optional(hint)
    if optional:
        return f"{describe(kind)} or null"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (tuple, list, set, frozenset):
        return f"a list (each item {describe(args[0])})" if args else "a list"
    if origin is dict:
        return "a mapping"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null",
             None: "null"}
    if hint in names:
        return names[hint]
    if isinstance(hint, type) and issubclass(hint, os.PathLike):
        return "a path"
    return f"a {getattr(hint, '__name__', hint)}"


def check(owner: str, name: str, hint: Any, value: Any, noun: str = "") -> Any:
    """``value`` for ``name`` (annotated ``hint``) of ``owner``, validated by the module's rules (``noun``: what
    the message calls the name, e.g. ``"argument "``).

    Returns:
        The value, converted where that is lossless (a numeric string to its number, a list to a tuple).

    Raises:
        InvalidValue: Naming ``owner``, the field and what it takes.
    """
    adapter = _adapter(hint)
    if adapter is None:
        return value
    try:
        value = adapter.validate_python(value)
    except ValidationError as error:
        raise InvalidValue(_message(owner, noun + name, hint, value, dict(error.errors()[0]))) from None
    if (name == "seed" or name.endswith("_seed")) and isinstance(value, int) and not isinstance(value, bool) \
            and not 0 <= value <= MAX_SEED:
        raise InvalidValue(f"{owner}: {noun}{name} must be from 0 to {MAX_SEED} (seeds are 32-bit), got {value}")
    for number in _integers(value):
        if abs(number) > MAX_INT:
            raise InvalidValue(f"{owner}: {noun}{name} must be an integer within +-{MAX_INT} (64 bits), got {number}")
    return value


def _integers(value: Any) -> list[int]:
    """The integers of ``value`` and of the tuples and lists in it."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (tuple, list)):
        return [n for item in value for n in _integers(item)]
    return []


def _message(owner: str, name: str, hint: Any, value: Any, error: dict[str, Any]) -> str:
    kind, _ = unwrap_optional(hint)
    loc = error.get("loc", ())
    if typing.get_origin(kind) in (tuple, list) and loc and isinstance(loc[0], int) \
            and isinstance(value, (list, tuple)) and loc[0] < len(value):
        args = typing.get_args(kind)
        if args and (len(args) == 1 or args[1] is Ellipsis):  # an item of a homogeneous list: name it
            name, hint, value = f"{name}[{loc[0]}]", args[0], value[loc[0]]
    if error.get("type") == "finite_number":
        return f"{owner}: {name} must be a finite number, got {value}"
    text = f"{owner}: {name} must be {describe(hint)}, got {value!r} ({type(value).__name__})"
    if unwrap_optional(hint)[0] is bool and isinstance(value, str):
        text += "; a quoted string: write true or false without quotes"
    return text


@functools.lru_cache(maxsize=256)
def _field_hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_fields(config: Any) -> None:
    """Validate every field of the dataclass instance ``config`` (in ``__post_init__``: configs built in
    Python get the same checks as YAML and flags), storing the converted values."""
    cls: Any = type(config)
    hints = _field_hints(cls)
    for field in dataclasses.fields(config):
        if field.name in hints:
            value = getattr(config, field.name)
            checked = check(cls.__name__, field.name, hints[field.name], value)
            if checked is not value:
                object.__setattr__(config, field.name, checked)


def at_least_one(config: Any, keys: Sequence[str]) -> None:
    """Refuse (ValueError naming the config and field) any of ``config``'s fields ``keys`` below 1."""
    for key in keys:
        if getattr(config, key) < 1:
            raise ValueError(f"{type(config).__name__}: {key} must be >= 1, got {getattr(config, key)}")
