"""Shipped, versioned held-out panels, one or more per benchmark, by name.

A named panel is a YAML file in this package, in :func:`simpop.simulators.registry.load_panel`'s format
plus two fields::

    name: tau2-mock-v1                 # = the file name; the suffix is the panel's version
    description: >-                    # what the members are and how they differ (printed on the card)
      ...
    env: [simpop/Tau2-mock-v0]         # the env ids it is made for; loading it for another env is an error
    members:                           # member name -> simulator spec (simpop.seat documents the syntax)
      scripted: native
      smollm2-greedy: frozen:smollm2?temperature=0.0

**Versioning**: a shipped panel never changes, so results on ``p4g-act-v1`` stay comparable across
simpop releases. A different panel is a new file with the next suffix (``p4g-act-v2``), and the old one
stays. ``tests/evaluation/test_named_panels.py`` pins every shipped panel's members.

Shipped panels (:func:`named_panels` lists them with their descriptions):

- ``p4g-act-v1`` (``simpop/PersuasionAct-v0``): the collapse experiment's held-out panel, member for member.
- ``p4g-act-human-v1`` (``simpop/PersuasionAct-v0``): persuadees fitted to the public P4G corpus (the shipped fit,
  :mod:`simpop.envs.persuasion.fitted`; no corpus needed), the collapse experiment's human-fitted panel.
- ``p4g-text-v1`` (``simpop/Persuasion-v1``, ``simpop/Persuasion-v0``): the same persuadee models as text, plus two SmolLM2 persuadees.
- ``tau2-<domain>-v1`` for ``mock``, ``airline``, ``retail``, ``telecom``: the scripted user and SmolLM2 users.
- ``cooperbench-mini-v1`` (``simpop/CooperBench-mini-v0``, ``simpop/CooperBench-v0``): scripted and SmolLM2
  teammates.

Use::

    from simpop.evaluation.panels import load_named_panel, named_panels, panel_card

    panel = load_named_panel("p4g-act-v1", "simpop/PersuasionAct-v0")   # or an env, with env_id=...
    print(panel_card(panel))

Members on an LLM (``frozen:smollm2`` ...) load that model when built; pass ``backends`` (model name ->
backend) to share already loaded ones.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

__all__ = ["PanelDefinition", "env_ids_of", "load_named_panel", "named_panels", "panel_card", "panel_definition"]

_FIELDS = ("name", "description", "env", "members")


@dataclass(frozen=True)
class PanelDefinition:
    """A panel as written: what :func:`load_named_panel` builds.

    Attributes:
        name: The panel's name (a shipped panel's name is its file name, version suffix included).
        description: What the members are and how they differ.
        env: The env ids the panel is made for (empty: any env, for user files that name none).
        members: Member name -> simulator spec string, in file order.
        source: Where it was read from.
    """

    name: str
    description: str
    env: tuple[str, ...]
    members: dict[str, str]
    source: str

    def check_env(self, env_id: str) -> None:
        """Raise ValueError unless the panel is made for ``env_id`` (a panel naming no env fits any)."""
        if self.env and env_id not in self.env:
            fitting = [n for n in named_panels() if env_id in panel_definition(n).env]
            raise ValueError(f"panel {self.name!r} is for {', '.join(self.env)}, not {env_id}; named panels for "
                             f"{env_id}: {', '.join(fitting) or 'none'}")


def _files() -> dict[str, Any]:
    """Shipped panel name -> its packaged file."""
    return {f.name[: -len(".yaml")]: f for f in resources.files(__name__).iterdir()
            if f.name.endswith(".yaml") and f.is_file()}


def named_panels() -> dict[str, str]:
    """Every shipped panel's name -> its description, sorted by name."""
    return {name: panel_definition(name).description for name in sorted(_files())}


def panel_definition(name_or_path: str | Path) -> PanelDefinition:
    """The definition of shipped panel ``name_or_path``, or of the panel YAML file at that path.

    A shipped panel must have every field (name = file name, description, env, members); a user file needs
    only ``members`` (and may add ``name``, ``description``, ``env``). Member names must be distinct (a
    repeated YAML key is an error, not a silent overwrite), every spec must parse, and no two members may
    have the same parsed spec.

    Raises:
        ValueError: Unknown name (the message lists the shipped panels) or a malformed panel.
    """
    files = _files()
    text = str(name_or_path)
    if text in files:
        return _parse(files[text].read_text(encoding="utf-8"), f"shipped panel {text!r}", shipped=text)
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            problem = "is not a file" if path.exists() else "does not exist"
            raise ValueError(f"panel file {path} {problem}; named panels: {', '.join(sorted(files))}")
        return _parse(None, str(path), shipped=None)
    raise ValueError(f"unknown panel {text!r}; named panels: {', '.join(sorted(files))} "
                     f"(or give the path of a panel YAML file)")


def load_named_panel(name: str, env: Any, backends: MutableMapping[str, Any] | None = None, *,
                     env_id: str | None = None):
    """Build shipped panel ``name`` for ``env`` (a :class:`~simpop.simulators.population.Panel`).

    Args:
        name: A shipped panel's name (:func:`named_panels`).
        env: The env id (the env is then made with default arguments) or the env object the panel will serve.
        backends: Model name -> backend cache shared with other builds (e.g. ``{"smollm2": backend}``);
            models not in it are loaded once and added.
        env_id: The id ``env`` was made from; by default it is worked out from the env's class and the
            registered arguments (τ²'s domain, ...).

    Raises:
        ValueError: Unknown panel (listing the shipped ones), or a panel made for another env.
    """
    from simpop.simulators.registry import load_panel

    if name not in _files():
        raise ValueError(f"unknown panel {name!r}; named panels: {', '.join(sorted(_files()))}")
    definition = panel_definition(name)
    if isinstance(env, str):
        from simpop.envs.registration import make

        env_id, env = env, make(env)
    elif env_id is None:
        candidates = env_ids_of(env)
        if not candidates:
            raise ValueError(f"cannot tell which registered env {type(env).__name__} is; pass env_id=... "
                             f"(panel {name!r} is for {', '.join(definition.env)})")
        env_id = next((i for i in candidates if i in definition.env), candidates[0])
    definition.check_env(env_id)
    return load_panel({"name": definition.name, "members": dict(definition.members)}, env, backends)


def env_ids_of(env: Any) -> list[str]:
    """The registered env ids that could have made ``env``: the same class, and no constructor argument
    (registered, else the constructor's default) that the env keeps as a plain attribute of the same name
    (τ²'s ``domain``, P4G's ``survey``) with another value."""
    import inspect

    from simpop.envs import registration

    cls = type(env)
    try:
        defaults = {name: p.default for name, p in inspect.signature(cls).parameters.items()
                    if p.default is not inspect.Parameter.empty}
    except (TypeError, ValueError):
        defaults = {}
    out = []
    for env_id in registration.ids():
        spec = registration.spec(env_id)
        module, _, qualname = spec.entry_point.partition(":")
        if qualname != cls.__qualname__:
            continue
        if module != cls.__module__ and registration.load(spec.entry_point) is not cls:
            continue
        arguments = {**defaults, **spec.kwargs}
        if not any(_differs(getattr(env, key, None), value) for key, value in arguments.items()):
            out.append(env_id)
    return out


def _differs(attribute: Any, argument: Any) -> bool:
    """An env attribute that is a plain value and not the constructor argument of the same name."""
    plain = (str, int, float, bool)
    return isinstance(attribute, plain) and isinstance(argument, plain) and attribute != argument


def panel_card(panel: Any, description: str | None = None) -> str:
    """A printable card of ``panel``: its name, description and one line per member (name, spec string).

    The description defaults to the shipped panel's of the same name, if there is one. A member's spec is
    its canonical form (every setting spelled out, defaults included).
    """
    if description is None and panel.name in _files():
        description = panel_definition(panel.name).description
    rows = []
    for member_name, simulator in panel:
        try:
            spec = str(simulator.spec)
        except Exception as error:  # a custom simulator whose spec fails still gets a line
            spec = f"<{type(simulator).__name__}: spec unavailable: {error}>"
        rows.append((member_name, spec))
    width = max(len("member"), *(len(n) for n, _ in rows))
    lines = [f"panel {panel.name}: {len(rows)} member{'s' * (len(rows) != 1)}"]
    if description:
        lines += _wrap(description, "  ")
    lines.append(f"  {'member':<{width}}  spec")
    lines += [f"  {n:<{width}}  {s}" for n, s in rows]
    return "\n".join(lines)


def heldout_lines(panel_name: str, check: Mapping[str, Any]) -> str:
    """A panel's check against training (``run``, ``strict``, ``look_alikes``: member label -> what it shares with
    a training simulator), as ``simpop eval --run`` and ``simpop train --panel`` print it under the card."""
    lines = [f"panel {panel_name} is held out from the simulators of {check['run']}"
             + (" (strict: every axis differs)" if check["strict"] else "")]
    lines += [f"  {member} (look-alike, evaluated): {text}" for member, texts in check["look_alikes"].items()
              for text in texts]
    return "\n".join(lines)


def _wrap(text: str, indent: str, width: int = 100) -> list[str]:
    import textwrap

    return textwrap.wrap(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent)


# ------------------------------------------------------------------------------------------ parsing
def _parse(text: str | None, source: str, shipped: str | None) -> PanelDefinition:
    """Validate one panel YAML document, ``text`` or (None) the file ``source`` (see :func:`panel_definition`)."""
    from simpop.seat import SimulatorSpec
    from simpop.user_input import load_yaml, load_yaml_file

    try:
        data = load_yaml_file(source, _StrictLoader) if text is None else load_yaml(text, source, _StrictLoader)
    except ValueError as error:  # a repeated key (the bounded loader names the source itself)
        raise ValueError(str(error) if str(error).startswith(source) else f"{source}: {error}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: a panel is a YAML mapping with {', '.join(_FIELDS)}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ValueError(f"{source}: unknown field(s) {unknown}; valid: {', '.join(_FIELDS)}")
    required = _FIELDS if shipped else ("members",)
    missing = [f for f in required if f not in data]
    if missing:
        raise ValueError(f"{source}: missing field(s) {missing}")
    name = data.get("name", Path(source).stem if not shipped else shipped)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{source}: 'name' must be a non-empty string")
    if shipped and name != shipped:
        raise ValueError(f"{source}: 'name' is {name!r}; a shipped panel's name must be its file name {shipped!r}")
    description = data.get("description", "")
    if not isinstance(description, str) or (shipped and not description.strip()):
        raise ValueError(f"{source}: 'description' must be a non-empty string")
    envs = data.get("env", [])
    envs = [envs] if isinstance(envs, str) else envs
    if not isinstance(envs, list) or not all(isinstance(e, str) and e for e in envs) or (shipped and not envs):
        raise ValueError(f"{source}: 'env' must be an env id or a list of env ids")
    members = data["members"]
    if isinstance(members, list):
        if not all(isinstance(s, str) for s in members):
            raise ValueError(f"{source}: 'members' must be a list of spec strings or a mapping name: spec")
        if len(set(members)) != len(members):
            raise ValueError(f"{source}: members repeat a spec; give each member once (or name them)")
        members = {s: s for s in members}
    if not isinstance(members, Mapping) or not members:
        raise ValueError(f"{source}: 'members' must be a non-empty mapping of member name: simulator spec")
    parsed: dict[Any, str] = {}
    for member, spec in members.items():
        if not isinstance(member, str) or not member or not isinstance(spec, str):
            raise ValueError(f"{source}: member {member!r}: write member-name: spec-string")
        try:
            key = SimulatorSpec.parse(spec)
        except (ValueError, KeyError) as error:
            raise ValueError(f"{source}: member {member!r}: {error}") from None
        if key in parsed:
            raise ValueError(f"{source}: members {parsed[key]!r} and {member!r} are the same simulator ({spec})")
        parsed[key] = member
    return PanelDefinition(name, description.strip(), tuple(envs), dict(members), source)


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses repeated mapping keys (PyYAML keeps the last one, silently)."""


def _strict_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ValueError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1}: "
                             f"every member needs its own name")
        seen.add(key)
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)
