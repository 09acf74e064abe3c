"""Trainer configs as frozen dataclasses, and the command-line flags generated from them.

A trainer config documents every field in its class docstring's Google-style ``Attributes:`` section;
:func:`add_arguments` turns each field into a ``--flag`` (type, default and help from that
documentation), and :func:`build` makes the config from a YAML file plus the flags the user gave
(flags win; fields given nowhere keep the dataclass default). Every value is checked against its field's type
first (:func:`simpop.validation.check`, the one validator), so a YAML ``"false"`` never becomes True and a wrong
type is a ``ValueError`` that names the field::

    parser = argparse.ArgumentParser()
    add_arguments(parser, GRPOConfig)
    args = parser.parse_args()
    config = build(GRPOConfig, args, yaml_path=args.config)
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

from simpop.validation import InvalidValue, check, unwrap_optional

T = TypeVar("T")


def field_docs(cls: type) -> dict[str, str]:
    """``{field: description}`` from the ``Attributes:`` section of ``cls``'s docstring.

    Raises:
        ValueError: If a dataclass field is not documented (every config field must say what it does).
    """
    doc = inspect.getdoc(cls) or ""
    docs: dict[str, str] = {}
    in_section, current = False, None
    for line in doc.splitlines():
        if line.strip() == "Attributes:":
            in_section = True
            continue
        if not in_section:
            continue
        if line and not line.startswith(" "):  # the next section (or text) ends Attributes:
            break
        match = re.match(r"^ {4}(\w+)(?: \([^)]*\))?:\s*(.*)$", line)
        if match:
            current = match.group(1)
            docs[current] = match.group(2).strip()
        elif current and line.strip():
            docs[current] += " " + line.strip()
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
    if missing:
        raise ValueError(f"{cls.__name__} must document {missing} in its docstring's Attributes: section")
    return docs


def add_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (), prefix: str = "") -> None:
    """Add one ``--field-name`` flag per dataclass field of ``cls`` (except those in ``skip``).

    Flags default to "not given" (``argparse.SUPPRESS``) so that :func:`build` can tell a flag the
    user typed from a default, and let YAML values stand where no flag was typed. Booleans get
    ``--name/--no-name``; ``Literal`` fields get ``choices``; tuples take several values. A field whose
    type is itself a config dataclass (a nested config) gets its fields as ``--field.sub-field`` flags.
    """
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group(f"{prefix}{cls.__name__} fields (defaults shown; also settable in --config "
                                      f"YAML)")
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator,misc]
        kind, optional = unwrap_optional(hints[f.name])
        if dataclasses.is_dataclass(kind):
            add_arguments(parser, kind, prefix=f"{prefix}{f.name}.")  # type: ignore[arg-type]  # a dataclass type
            continue
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": prefix + f.name,
                                  "help": f"{docs[f.name]} (default: {default!r})".replace("%", "%%")}
        flag = "--" + prefix + f.name.replace("_", "-")
        if kind is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if typing.get_origin(kind) is Literal:
            kwargs["choices"] = list(typing.get_args(kind))
            kwargs["type"] = type(kwargs["choices"][0])
        elif typing.get_origin(kind) is tuple:
            kwargs["nargs"] = "*"
            kwargs["type"] = FieldType(cls, f.name, typing.get_args(kind)[0])
        else:
            kwargs["type"] = FieldType(cls, f.name, kind, optional)
        kwargs["metavar"] = kind.__name__.upper() if isinstance(kind, type) else None
        group.add_argument(flag, **kwargs)


def build(cls: type[T], args: argparse.Namespace | None = None, yaml_path: str | Path | None = None,
          values: dict[str, Any] | None = None, **overrides: Any) -> T:
    """Make a ``cls`` config: dataclass defaults < YAML file (or ``values`` read from one) < flags given in
    ``args`` < ``overrides``."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    values = dict(values or {})
    if yaml_path is not None:
        values.update(load_yaml(yaml_path, cls))
    if args is not None:
        for key, value in vars(args).items():
            head, dot, tail = key.partition(".")
            if dot and head in names and dataclasses.is_dataclass(unwrap_optional(hints[head])[0]):
                # A nested config's flag: merged into the mapping its class's __post_init__ turns into the config.
                values[head] = _merged(values.get(head), tail, value)
            elif key in names:
                values[key] = value
    values.update(overrides)
    for name, value in values.items():
        if name in hints:  # an unknown name is the constructor's to refuse
            values[name] = check(cls.__name__, name, hints[name], value)
    return cls(**values)


def _merged(current: Any, dotted: str, value: Any) -> dict[str, Any]:
    """``current`` (None, a mapping or a config) as a mapping, with ``dotted`` (``a`` or ``a.b``) set to ``value``."""
    out = to_dict(current) if dataclasses.is_dataclass(current) else dict(current or {})
    head, dot, tail = dotted.partition(".")
    out[head] = _merged(out.get(head), tail, value) if dot else value
    return out


def nested(value: Any, cls: type[T], default: T) -> T:
    """A nested config field's value as a ``cls``: None -> ``default``; a mapping -> ``default`` with those
    fields replaced (YAML sections and ``--field.sub`` flags); a ``cls`` as it is."""
    if value is None:
        return default
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"expected a {cls.__name__} or a mapping of its fields, got {type(value).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {unknown}; valid fields: {', '.join(fields)}")
    hints = typing.get_type_hints(cls)
    value = {k: check(cls.__name__, k, hints[k], v) for k, v in value.items()}
    return dataclasses.replace(default, **value)  # type: ignore[type-var]  # default is a ``cls`` instance


def load_yaml(path: str | Path, cls: type) -> dict[str, Any]:
    """Read a YAML mapping of ``cls`` fields, rejecting unknown keys with the list of valid ones."""
    from simpop.user_input import load_yaml_file

    data = load_yaml_file(path) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config file must be a YAML mapping of field: value")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ValueError(f"{path}: unknown {cls.__name__} fields {unknown}; valid fields: {', '.join(names)}")
    return data


def to_dict(config: Any) -> dict[str, Any]:
    """A config as plain YAML/JSON-able data (tuples become lists, nested configs mappings)."""
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def changed_settings(saved: dict[str, Any], current: Any, default: Any, *, values: bool = False) -> list[str]:
    """Dotted names of the settings in which config ``current`` differs from ``saved`` (a :func:`to_dict` of an
    earlier run's config); with ``values``, ``name: saved -> current``. A setting ``saved`` lacks (a field added
    since) counts as changed only if ``current`` moves it off ``default``'s value (a config built with the
    defaults), which earlier runs behaved as; one ``current`` lacks (a field removed since) is a change: the
    earlier run meant something this one cannot."""
    def flat(value: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(value, dict) and value:
            return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): value}

    old, new, base = flat(saved), flat(json_ready(to_dict(current))), flat(json_ready(to_dict(default)))
    before = {k: old[k] if k in old else base.get(k) for k in new.keys() | old.keys()}
    names = sorted(k for k in before if before[k] != new.get(k, "(removed)"))
    return [f"{k}: {before[k]!r} -> {new.get(k, '(removed)')!r}" for k in names] if values else names


def json_ready(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples at any depth become lists, keys strings)."""
    import json

    return json.loads(json.dumps(value))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    return list(value) if isinstance(value, tuple) else value


def save_yaml(config: Any, path: str | Path) -> None:
    """Write a config so that ``--config path`` reproduces it."""
    import yaml

    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


class FieldType:
    """The argparse ``type`` of a config field's flag: the text read as ``kind`` (``none`` too if ``optional``),
    then checked by :func:`~simpop.validation.check`, so ``nan``, ``inf`` and out-of-range integers are refused
    while the flags are parsed, as a usage error."""

    def __init__(self, cls: type, name: str, kind: Any, optional: bool = False) -> None:
        self.cls, self.name, self.kind, self.optional = cls, name, kind, optional
        self.__name__ = getattr(kind, "__name__", str(kind))  # argparse names the type in its messages

    def __call__(self, text: str) -> Any:
        if self.optional and text.lower() == "none":
            return None
        try:
            value = self.kind(text) if isinstance(self.kind, type) else text
            return check(self.cls.__name__, self.name, self.kind, value)
        except (TypeError, ValueError) as error:
            raise argparse.ArgumentTypeError(str(error) if isinstance(error, InvalidValue)
                                             else f"invalid {self.__name__} value: {text!r}") from None
