"""Build any simulator from its spec: the one place simulators are constructed.

:func:`build_simulator` turns a spec string (:mod:`simpop.seat` documents the syntax), a list of specs
(a uniform :class:`~simpop.simulators.population.Population`) or a population mapping into simulators;
:func:`load_panel` reads a held-out panel from YAML. Kinds are registered with
:func:`simpop.seat.register_simulator_kind`: the generic ones in :mod:`simpop.seat`, a benchmark's own
native kinds next to its env registration (:mod:`simpop.envs`). Examples::

    build_simulator("frozen:smollm2")                                     # greedy LLM
    build_simulator("verbalized:smollm2?k=5&tau=0.7", env=env)            # LLM verbalized sampling
    build_simulator("persuadee?decoding=greedy&personas=modal", env=env)  # P4G native, mode-collapsed
    build_simulator("verbalized:persuadee?floor=0.01", env=env)           # renormalised stated distribution
    build_simulator("trainable:persuadee", env=env)                       # co-trainable persuadee
    build_simulator(["persuadee?temperature=0.8", "frozen:smollm2"], env=env)   # a uniform population
    build_simulator({"members": [...], "weights": [2, 1], "rule": "prioritised"}, env=env)
    build_simulator({"members": ["frozen:smollm2", "frozen:openai:gpt-4o-mini"], "rule": "rotate",
                     "rotate_every": 5}, env=env)                      # multi-model rotation, every 5 updates

Panel YAML::

    name: p4g-heldout
    members:
      heldout-0: persuadee:heldout-0?temperature=0.8&personas=heldout
      heldout-1: persuadee:heldout-1?temperature=0.9&personas=heldout
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from simpop.seat import SCENARIO_PERSONAS, Simulator, SimulatorSpec, inner_kind, kind
from simpop.validation import check

#: A spec string, a parsed spec, a list of them (uniform population) or a population mapping.
SpecLike = str | SimulatorSpec | Sequence[Any] | Mapping[str, Any]


class Context:
    """Shared state of one build: the env and the loaded backends (see :class:`simpop.seat.BuildContext`).

    Args:
        env: The env the simulators serve (needed for native kinds and named persona sets).
        backends: Model spec -> backend cache shared across builds; models not in it are loaded once.
    """

    def __init__(self, env: Any = None, backends: MutableMapping[str, Any] | None = None):
        self.env = env
        self.backends = backends if backends is not None else {}

    def backend(self, model: str) -> Any:
        """The backend for model spec ``model``, loaded once per build."""
        if model not in self.backends:
            from simpop.agents import load_backend

            self.backends[model] = load_backend(model)
        return self.backends[model]

    def trainable_backend(self, model: str) -> Any:
        """An in-process trainable backend for ``model`` (LoRA adapters), loaded once per build."""
        key = f"trainable:{model}"
        if key not in self.backends:
            from simpop.agents.transformers_backend import TransformersBackend

            self.backends[key] = TransformersBackend(model, prefix_cache=True)
        return self.backends[key]

    def personas(self, name: str) -> list[Any] | None:
        """The personas of set ``name`` from the env (None for the scenario's own).

        Raises:
            ValueError: A named set without an env that provides ``persona_set``.
        """
        if name == SCENARIO_PERSONAS:
            return None
        if self.env is None or not callable(getattr(self.env, "persona_set", None)):
            raise ValueError(f"persona set {name!r} needs an env that provides persona_set(name); pass env=... "
                             f"or use personas={SCENARIO_PERSONAS}")
        return list(self.env.persona_set(name))

    def build(self, spec: SimulatorSpec, name: str | None = None) -> Simulator:
        """Build ``spec`` with its kind's entry point, named ``name`` (default: the spec string)."""
        from simpop.envs.registration import load

        if self.env is not None:
            check_fits(spec, self.env)
        simulator = load(kind(spec.kind).entry_point)(spec, self)
        simulator.name = name or str(spec)
        return simulator


def build_simulator(spec: SpecLike, env: Any = None, backends: MutableMapping[str, Any] | None = None,
                    name: str | None = None) -> Simulator:
    """Construct the simulator (or population) ``spec`` describes.

    Args:
        spec: A spec string or :class:`SimulatorSpec`; a list of specs (a uniform population); ``{spec: weight}``
            (a weighted one); or a mapping ``{"members": [specs] or {name: spec}, "weights": [...], "rule": ...,
            "name": ...}``.
        env: The env the simulator will serve; needed for native kinds and named persona sets.
        backends: Model -> backend cache, shared across calls so simulators on one model load it once.
        name: The simulator's name (default: the spec string as given).
    """
    context = Context(env, backends)
    if isinstance(spec, Mapping) or (isinstance(spec, Sequence) and not isinstance(spec, str)):
        return _population(spec, context, name)
    text = spec if isinstance(spec, str) else str(spec)
    return context.build(SimulatorSpec.parse(text), name or text)


def build_many(specs: Sequence[str] | Mapping[str, str], env: Any = None,
               backends: MutableMapping[str, Any] | None = None) -> list[Simulator]:
    """One simulator per spec (a list, or name -> spec), sharing loaded backends."""
    backends = backends if backends is not None else {}
    items = specs.items() if isinstance(specs, Mapping) else ((None, s) for s in specs)
    return [build_simulator(s, env, backends, name) for name, s in items]


def _population(spec: Sequence[Any] | Mapping[str, Any], context: Context, name: str | None) -> Simulator:
    from simpop.simulators.population import Population

    options: dict[str, Any] = dict(spec) if isinstance(spec, Mapping) else {"members": list(spec)}
    if options and "members" not in options and all(isinstance(w, (int, float)) and not isinstance(w, bool)
                                                    for w in options.values()):
        options = {"members": list(options), "weights": list(options.values())}  # {spec: weight}
    unknown = sorted(set(options) - {"members", "weights", "rule", "rotate_every", "name"})
    if unknown:
        raise ValueError(f"unknown population field(s) {unknown}; valid: members, weights, rule, rotate_every, name")
    if not options.get("members"):
        raise ValueError("a population needs a non-empty 'members' list of simulator specs")
    members = build_many(options["members"], context.env, context.backends)
    return Population(members, options.get("weights"), options.get("rule", "uniform"),
                      rotate_every=options.get("rotate_every", 0), name=name or options.get("name", "population"))


def load_panel(path_or_data: str | Path | Mapping[str, Any], env: Any = None,
               backends: MutableMapping[str, Any] | None = None):
    """A :class:`~simpop.simulators.population.Panel` from YAML (or its parsed mapping); see module docstring."""
    from simpop.simulators.population import Panel

    data = path_or_data
    if not isinstance(data, Mapping):
        from simpop.user_input import load_yaml_file

        data = load_yaml_file(data)
    if not isinstance(data, Mapping) or "members" not in data:
        raise ValueError(f"{path_or_data}: a panel is a mapping with 'members' (a list of specs, or name: spec) "
                         f"and an optional 'name'")
    owner = f"panel {path_or_data}" if not isinstance(path_or_data, Mapping) else "panel"
    name = check(owner, "name", str, data.get("name", "heldout"))
    members = check(owner, "members", list[str] | dict[str, str], data["members"])
    from simpop.simulators.population import check_name

    for member in members if isinstance(members, Mapping) else ():
        check_name(member, "panel member")
    return Panel(build_many(members, env, backends), name=name)


def check_fits(spec: SimulatorSpec, env: Any, env_id: str | None = None) -> None:
    """Refuse, before anything is built, a simulator that cannot play ``env``'s user seat: a language-model kind
    (it writes text) where the seat takes discrete acts (``frozen:smollm2`` on ``simpop/PersuasionAct-v0``)."""
    from gymnasium import spaces

    action_space = getattr(env, "action_space", None)
    if not callable(action_space) or not hasattr(env, "user_seat"):  # not a dialogue env: nothing to check
        return
    if kind(spec.kind).needs_model and inner_kind(spec.kind, spec.model) is None and isinstance(
            action_space(env.user_seat), spaces.Discrete):
        raise ValueError(f"simulator {spec.kind}:{spec.model} is a language-model simulator (it writes text), but "
                         f"{env_id or type(env).__name__}'s user seat takes discrete acts; use a native kind there "
                         f"(see `simpop envs`, e.g. persuadee or trainable:persuadee on simpop/PersuasionAct-v0), "
                         f"or a text env (e.g. simpop/Persuasion-v1) for LLM simulators")


def native(spec: SimulatorSpec, context: Context) -> Simulator:
    """The ``native`` kind: the default simulator registered with the env (or with env id ``spec.model``)."""
    from simpop.envs import registration

    env = context.env
    if spec.model:
        entry = registration.spec(spec.model).entry_point
        if env is not None and entry != f"{type(env).__module__}:{type(env).__qualname__}":
            raise ValueError(f"native:{spec.model} is the simulator of {spec.model} ({entry}), which cannot play "
                             f"{type(env).__name__}'s user seat; use native (this env's own) or another kind")
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
        raise ValueError(f"{where} has no native simulator; name another kind")
    if spec.personas != SCENARIO_PERSONAS:
        raise ValueError("native simulators play the scenario's persona; drop the personas parameter "
                         "(or name the benchmark's own kind, which takes one)")
    return registration.load(factory)(env)


def inner_or_none(spec: SimulatorSpec) -> SimulatorSpec | None:
    """The wrapped kind's spec for wrapper specs (``verbalized:persuadee``), else None."""
    return spec.inner() if inner_kind(spec.kind, spec.model) else None
