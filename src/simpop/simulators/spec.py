"""Simulator specs: a comparable description of a simulator, its CLI string, and the builder.

Every simulator exposes a :class:`SimulatorSpec` as ``.spec`` (kind, model, persona set, decoding);
held-out panels compare them (:mod:`simpop.simulators.population`) and reports print them. On the
command line a spec is a string::

    spec    := kind [":" model] ["?" params]
    kind    := a key of KINDS: frozen | verbalized | native
    model   := a backend spec for simpop.agents.load_backend (e.g. "smollm2"; may contain ":" and "/";
               "?", "&", "%" are percent-encoded); for "native", an optional env id
    params  := key "=" value ("&" key "=" value)*
    value   := percent-encoded text; numbers as Python writes them (0.7, 5)

``personas`` (the persona set the simulator plays; ``scenario`` = the scenario's own persona; other
names come from ``env.persona_set(name)``) is valid for every kind; the other keys depend on the kind
(see :data:`KINDS`). Parsing fills in every default, so ``str(spec)`` is canonical and
``SimulatorSpec.parse(str(spec)) == spec`` for the kinds in :data:`KINDS` (the specs of populations and
custom simulators are strings for reports only). Examples::

    frozen:smollm2                                   greedy (the mode-collapsed baseline)
    frozen:smollm2?temperature=1.0                   plain sampling
    verbalized:smollm2?k=5&tau=0.7&personas=p4g-heldout
    native                                           the env's own simulator (e.g. the act-level persuadee)
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

if TYPE_CHECKING:
    from simpop.agents.base import Backend
    from simpop.simulators.base import Simulator

#: The persona-set name meaning "play the persona the scenario comes with".
SCENARIO_PERSONAS = "scenario"

Items = tuple[tuple[str, Any], ...]


def _items(values: Mapping[str, Any] | Items) -> Items:
    return tuple(sorted(dict(values).items()))


@dataclass(frozen=True)
class SimulatorSpec:
    """What a simulator is, in comparable form.

    Attributes:
        kind: ``frozen``, ``verbalized``, ``native``, ``population``, ``custom``, ...
        model: The model behind it (a backend spec such as ``smollm2``, or a class / parameter-set name).
        personas: The persona set it plays (:data:`SCENARIO_PERSONAS` = whatever the scenario says).
        decoding: How it turns the model into replies (sampling settings, k, tau, floor ...), as a
            sorted tuple of ``(key, value)``; a mapping is accepted and converted.
        extra: Other settings that do not change the reply distribution's definition.
    """

    kind: str
    model: str = ""
    personas: str = SCENARIO_PERSONAS
    decoding: Items = ()
    extra: Items = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "decoding", _items(self.decoding))
        object.__setattr__(self, "extra", _items(self.extra))

    @property
    def params(self) -> dict[str, Any]:
        """Decoding and extra settings together, as a dict."""
        return {**dict(self.decoding), **dict(self.extra)}

    def __str__(self) -> str:
        text = self.kind
        if self.model:
            text += ":" + quote(self.model, safe=":/@-_.~+,=")
        params = {**self.params, "personas": self.personas}
        text += "?" + "&".join(f"{key}={_render(value)}" for key, value in sorted(params.items()))
        return text

    @classmethod
    def parse(cls, text: str) -> SimulatorSpec:
        """Parse the string syntax (module docstring), validate names and types, fill in defaults."""
        head, _, query = text.strip().partition("?")
        kind_name, _, model = head.partition(":")
        kind = _kind(kind_name)
        model = unquote(model)
        if kind.needs_model and not model:
            raise ValueError(f"simulator kind {kind_name!r} needs a model: {kind_name}:MODEL, e.g. {kind_name}:smollm2")
        given: dict[str, str] = {}
        for pair in filter(None, query.split("&")):
            key, sep, value = pair.partition("=")
            if not sep:
                raise ValueError(f"bad parameter {pair!r} in simulator spec {text!r}: write key=value")
            if key in given:
                raise ValueError(f"parameter {key!r} given twice in simulator spec {text!r}")
            given[key] = unquote(value)
        personas = given.pop("personas", SCENARIO_PERSONAS)
        unknown = sorted(set(given) - set(kind.decoding) - set(kind.extra))
        if unknown:
            valid = ", ".join(sorted({"personas", *kind.decoding, *kind.extra}))
            raise ValueError(f"unknown parameter(s) {', '.join(unknown)} for simulator kind {kind_name!r}; "
                             f"valid: {valid}")
        decoding = {key: _coerce(key, given.get(key), default) for key, default in kind.decoding.items()}
        extra = {key: _coerce(key, given.get(key), default) for key, default in kind.extra.items()}
        return cls(kind_name, model, personas, decoding, extra)


def _render(value: Any) -> str:
    return repr(value) if isinstance(value, float) else quote(str(value), safe="")


def _coerce(key: str, value: str | None, default: Any) -> Any:
    if value is None:
        return default
    try:
        return type(default)(value)
    except ValueError:
        raise ValueError(f"parameter {key!r} expects {type(default).__name__}, got {value!r}") from None


@dataclass(frozen=True)
class Kind:
    """One simulator kind that specs can name.

    Attributes:
        entry_point: ``"module:Class"``; the class has ``from_spec(spec, backend, personas)``.
            Empty for ``native`` (the env's own simulator).
        help: One line for error messages and ``--help``.
        decoding: Decoding keys and their defaults (a default's type is the key's type).
        extra: Other keys and their defaults.
        needs_model: Whether the spec must name a backend model.
    """

    entry_point: str
    help: str
    decoding: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    needs_model: bool = True


_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 64}

#: Kinds a spec string can name. A new kind adds one entry here (its class provides ``from_spec``).
KINDS: Mapping[str, Kind] = MappingProxyType({
    "frozen": Kind("simpop.simulators.llm:LLMSimulator",
                   "persona prompt + backend + decoding (default greedy: the mode-collapsed baseline)",
                   decoding=_SAMPLING),
    "verbalized": Kind("simpop.simulators.verbalized:VerbalizedSimulator",
                       "k candidate replies with verbalized probabilities, renormalised and sampled",
                       decoding={**_SAMPLING, "max_new_tokens": 256, "k": 5, "tau": 1.0, "floor": 0.01},
                       extra={"fallback_temperature": 1.0, "fallback_max_new_tokens": 64}),
    "native": Kind("", "the env's own simulator (model: optional env id)", needs_model=False),
})


def _kind(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        valid = "; ".join(f"{k} ({v.help})" for k, v in KINDS.items())
        raise ValueError(f"unknown simulator kind {name!r}; valid kinds: {valid}") from None


def build_simulator(spec: SimulatorSpec | str, env: Any = None,
                    backends: MutableMapping[str, Backend] | None = None, name: str | None = None) -> Simulator:
    """Construct the simulator a spec describes.

    Args:
        spec: A :class:`SimulatorSpec` or its string form.
        env: The env the simulator will serve; needed for ``native`` and for named persona sets.
        backends: Model name -> backend cache, shared across calls so that simulators on the same
            model reuse one loaded backend; models not in it are loaded with
            :func:`simpop.agents.load_backend` and added.
        name: The simulator's name (default: the spec string as given).
    """
    text = spec if isinstance(spec, str) else str(spec)
    spec = SimulatorSpec.parse(spec) if isinstance(spec, str) else SimulatorSpec.parse(str(spec))
    kind = KINDS[spec.kind]
    if not kind.entry_point:
        simulator = _native(spec, env)
    else:
        from simpop.envs.registration import load

        backend = _backend(spec.model, backends)
        personas = resolve_personas(spec.personas, env)
        simulator = load(kind.entry_point).from_spec(spec, backend, personas)
    simulator.name = name or text
    return simulator


def _backend(model: str, backends: MutableMapping[str, Backend] | None) -> Backend:
    if backends is not None and model in backends:
        return backends[model]
    from simpop.agents import load_backend

    backend = load_backend(model)
    if backends is not None:
        backends[model] = backend
    return backend


def resolve_personas(name: str, env: Any) -> list[Any] | None:
    """The personas of set ``name`` (None for :data:`SCENARIO_PERSONAS`), from ``env.persona_set(name)``."""
    if name == SCENARIO_PERSONAS:
        return None
    if env is None or not callable(getattr(env, "persona_set", None)):
        raise ValueError(f"persona set {name!r} needs an env that provides persona_set(name); pass env=... "
                         f"or use personas={SCENARIO_PERSONAS}")
    return list(env.persona_set(name))


def _native(spec: SimulatorSpec, env: Any) -> Simulator:
    from simpop.envs import registration

    if spec.model:
        env = env if env is not None else registration.make(spec.model)
        factory = registration.spec(spec.model).default_simulator
        where = spec.model
    else:
        if env is None:
            raise ValueError("native simulators need the env: pass env=..., or name its id (native:ENV_ID)")
        entry = f"{type(env).__module__}:{type(env).__qualname__}"
        owners = [registration.spec(i) for i in registration.ids() if registration.spec(i).entry_point == entry]
        factory = next((s.default_simulator for s in owners if s.default_simulator), None)
        where = type(env).__name__
    if factory is None:
        raise ValueError(f"{where} has no native simulator; use another kind ({', '.join(KINDS)})")
    if spec.personas != SCENARIO_PERSONAS:
        raise ValueError("native simulators play the scenario's persona; drop the personas parameter")
    return registration.load(factory)(env)
