"""The seat contract: what fills the user seat, how it is described, and how kinds are named.

This is simpop's lowest layer (it imports nothing else from simpop), so that envs, simulators,
trainers and evaluation all speak the same contract without importing each other:

- :class:`Scenario`: what a benchmark's scenario offers whoever plays the user seat.
- :class:`Player`: whatever fills a seat, policy or user, driving many dialogues at once through *slots*;
  :func:`sample_rows`: one action per row of action probabilities, each with its row's generator.
- :class:`Simulator`: a player of the user (or teammate) seat, which also hears the policy's rewards;
  :class:`DistributionalSimulator`: one that can state its reply distribution;
  :class:`Trainable`: one whose parameters a co-trainer updates (with :class:`Scores`); :func:`choice_rows`:
  what each slot's generator picks from its distribution, for many slots at once.
- :class:`Survey` / :func:`survey_of`: a closing question with fixed options that an env may ask the user
  seat as its last turn (P4G's donation survey); :class:`SurveyAnswerer`: a simulator that answers it as a
  constrained choice.
- :class:`SimulatorSpec`: a comparable description of a simulator and its string form;
  :func:`register_simulator_kind` / :data:`KINDS`: the kinds a spec string can name. Kinds are
  string entry points (nothing is imported until a simulator is built by
  :func:`simpop.simulators.registry.build_simulator`).

Spec strings::

    spec    := kind [":" model] ["?" params]
    kind    := a registered kind (frozen | verbalized | trainable | native | a benchmark's own, e.g. persuadee)
    model   := a backend spec for simpop.agents.load_backend (e.g. "smollm2"; may contain ":" and "/";
               "?", "&", "%" are percent-encoded); for "native", an optional env id; for a *wrapper*
               kind (verbalized, trainable) it may instead start with a kind that the wrapper accepts
               ("verbalized:persuadee:base" = verbalized sampling over the P4G persuadee's stated
               distribution; "trainable:persuadee" = the persuadee with trainable parameters)
    params  := key "=" value ("&" key "=" value)*
    value   := percent-encoded text; numbers as Python writes them (0.7, 5)

``personas`` (the persona set played; ``scenario`` = the scenario's own persona; other names come from
``env.persona_set(name)``) is valid for every kind. Parsing fills in every default, so ``str(spec)`` is
canonical and ``SimulatorSpec.parse(str(spec)) == spec``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import quote, unquote

import numpy as np

if TYPE_CHECKING:
    import torch

#: The persona-set name meaning "play the persona the scenario comes with".
SCENARIO_PERSONAS = "scenario"


# ================================================================================ scenarios
@runtime_checkable
class Scenario(Protocol):
    """What envs require of a scenario and what user-seat simulators read from it.

    Attributes:
        id: A stable identifier (``reset(options={"scenario_id": ...})``).
    """

    id: str

    def user_instructions(self) -> str:
        """The user seat's brief: persona and goal, as a system prompt for an LLM simulator."""
        ...


@runtime_checkable
class TextFormat(Protocol):
    """How an LLM in a seat sees an env's text observation and how its text becomes an action.

    Envs whose seat needs more than "system prompt + the dialogue's messages" (e.g. CooperBench's state and
    JSON action language) expose one as ``env.text_format``; every LLM simulator kind uses it.

    Attributes:
        counters: Names of the counters :meth:`to_action` increments in a simulator's ``stats``.
    """

    counters: tuple[str, ...]

    def chat(self, observation: str, scenario: Any, instructions_suffix: str = "") -> list[dict[str, str]]:
        """The chat to send the model for ``observation`` (the seat's own turns are ``assistant``)."""
        ...

    def to_action(self, text: str, stats: dict[str, int]) -> str:
        """The action for the model's reply ``text`` (fallbacks counted in ``stats``)."""
        ...


# ================================================================================ players
class Player(ABC):
    """Whatever fills a seat (the policy's or the user's): it plays many dialogues at once through *slots*.

    :meth:`reset_batch` starts one dialogue per slot with its scenario and random generator; :meth:`act_batch`
    answers the pending observations of some slots in one call. The rollout engine gives the user seat each env's
    own generator (``env.user_rng()``) and the policy seat the wave's generator in every slot, so a policy's draws
    are one stream per wave, in the order it asks. A player may also say how uncertain it was
    (``entropy(trajectories)``, nats; evaluation reports nan without it) and that it draws nothing
    (``rng_free = True``).

    Attributes:
        name: A short identifier, unique within a population (used in logs and reports).
        rngs: Each slot's generator, as :meth:`reset_batch` got them.
    """

    name: str = "player"
    rngs: list[np.random.Generator]

    def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
        """Start ``len(scenarios)`` dialogues in slots ``0..n-1``, discarding earlier slots (the default keeps the
        generators in :attr:`rngs`)."""
        if len(scenarios) != len(rngs):
            raise ValueError(f"reset_batch got {len(scenarios)} scenarios but {len(rngs)} generators")
        self.rngs = list(rngs)

    @abstractmethod
    def act_batch(self, observations: list[Any], slots: list[int]) -> list[Any]:
        """Actions for the given slots' pending observations (one per slot, in order), computed together where
        possible."""

    def record(self, slot: int) -> dict[str, Any]:
        """:class:`~simpop.rollout.Trajectory` fields the player kept of ``slot``'s finished dialogue (a token
        policy: its token ids, log-probs and mask); none by default."""
        return {}


def sample_rows(probs: np.ndarray, rngs: Sequence[np.random.Generator]) -> list[int]:
    """Per row of ``probs`` (action probabilities), the action that one ``random()`` draw of the row's generator
    picks by inverse CDF; rows that share a generator draw from it in row order."""
    u = np.array([rng.random() for rng in rngs])
    cdf = np.cumsum(probs, axis=1)  # (cdf <= u).sum() is searchsorted(cdf, u, side="right") for every row at once
    return np.minimum((cdf <= u[:, None]).sum(axis=1), probs.shape[1] - 1).tolist()


# ================================================================================ simulators
class Simulator(Player):
    """A player of the user (or teammate) seat.

    Besides the :class:`Player` contract it hears the policy's rewards (:meth:`feedback`), names the concrete
    simulator behind a slot (:meth:`member`, populations) and says what it is (:attr:`spec`).
    :meth:`reset` / :meth:`act` are slot 0 of a batch of one, which is what the single-agent ``UserSeat`` view uses.
    """

    name: str = "simulator"

    def reset(self, scenario: Any, rng: np.random.Generator) -> None:
        """Start one dialogue in slot 0."""
        self.reset_batch([scenario], [rng])

    def act(self, observation: Any) -> Any:
        """The action for slot 0's pending observation."""
        return self.act_batch([observation], [0])[0]

    def feedback(self, slots: list[int], rewards: list[float]) -> None:
        """Hear the policy's final reward for finished dialogues (populations track failure rates)."""

    def member(self, slot: int) -> Simulator:
        """The concrete simulator driving ``slot`` (itself, except in populations)."""
        return self

    def success_probability(self, slot: int) -> float | None:
        """The probability that ``slot``'s finished dialogue succeeded, given everything the simulator heard: the
        expectation of its deciding draw (a model-based simulator knows it), or None where the simulator cannot
        say (the default) or has not decided. ``UserSeat`` reports it as ``info["expected_success"]``."""
        return None

    @property
    def spec(self) -> SimulatorSpec:
        """What this simulator is (kind, model, persona set, decoding), compared by held-out panels.

        The default names the class as the model; simulators with parameters that matter override it.
        """
        return SimulatorSpec(kind="custom", model=f"{type(self).__module__}.{type(self).__qualname__}")


def expected_success(simulator: Any, slot: int) -> float | None:
    """``simulator.success_probability(slot)``, or None for a simulator without one (duck-typed simulators)."""
    method = getattr(simulator, "success_probability", None)
    return None if method is None else method(slot)


@runtime_checkable
class DistributionalSimulator(Protocol):
    """A simulator that can state its full action distribution for a slot's observation.

    Verbalized sampling wraps any such simulator (:class:`simpop.simulators.verbalized.Renormalised`).
    """

    def distribution(self, observation: Any, slot: int = 0) -> list[tuple[Any, float]]:
        """``[(action, probability), ...]`` summing to one; does not change the slot's state."""
        ...

    def commit(self, observation: Any, slot: int, action: Any) -> None:
        """Advance the slot's state as if the simulator had answered ``observation`` with ``action``."""
        ...

    def slot_rng(self, slot: int) -> np.random.Generator:
        """The random generator the slot was started with."""
        ...

    # Optional, for speed (:class:`~simpop.simulators.verbalized.Renormalised` uses them when present):
    # ``distribution_batch(observations, slots) -> [(batch indices, actions, probabilities [n, len(actions)])]``,
    # :meth:`distribution` of many slots at once in groups sharing their actions (the same numbers; indices in no
    # group need :meth:`distribution`), and ``commit_batch(observations, slots, actions)``.


def choice_rows(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per row of ``p``, the index ``Generator.choice(len(row), p=row)`` picks when its one ``random()`` draw is
    ``u[row]`` (it normalises the row's cumulative sums and searches them, side right), for sampling many
    slots' distributions at once with each slot's own generator."""
    cdf = np.cumsum(p, axis=1)
    cdf /= cdf[:, -1:]
    return (cdf <= u[:, None]).sum(axis=1)


# ================================================================================ closing surveys
#: The key of a text observation (a JSON object) that holds a :class:`Survey` (``{"question", "options"}``).
SURVEY_KEY = "survey"


@dataclass(frozen=True)
class Survey:
    """A closing question with fixed answer options, asked of the user seat as its last turn.

    An env asks it by putting ``{"survey": {"question": ..., "options": [...]}}`` into the user seat's JSON
    text observation (:meth:`as_dict`); the answer is an ordinary action: the chosen option's text (the env
    says how it reads other text). Simulators that cannot choose (no scoring) answer the question in free text.

    Attributes:
        question: The question as the user seat reads it (it lists the options).
        options: The answers, in order (e.g. ``("$0.00", "$0.05", ...)``).
    """

    question: str
    options: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))
        if not self.question.strip() or not self.options or not all(
                isinstance(o, str) and o.strip() for o in self.options):
            raise ValueError("a survey needs a question and at least one non-empty option")

    def as_dict(self) -> dict[str, Any]:
        """The survey as it appears in an observation: ``{"question", "options"}``."""
        return {"question": self.question, "options": list(self.options)}


def survey_of(observation: Any) -> Survey | None:
    """The :class:`Survey` a text observation asks (under :data:`SURVEY_KEY`), or None; never raises."""
    if not isinstance(observation, str) or f'"{SURVEY_KEY}"' not in observation:
        return None
    try:
        view = json.loads(observation)
        found = view.get(SURVEY_KEY) if isinstance(view, dict) else None
        if (isinstance(found, dict) and isinstance(found.get("question"), str)
                and isinstance(found.get("options"), list)):
            return Survey(found["question"], tuple(found["options"]))
    except (ValueError, TypeError, RecursionError):
        pass
    return None


@runtime_checkable
class SurveyAnswerer(Protocol):
    """A simulator that answers a closing :class:`Survey` as a constrained choice among its options.

    Its ``act_batch`` answers survey observations through :meth:`answer_survey` (a batch may mix survey and
    dialogue turns); callers that want the answer distribution itself (e.g. its entropy) use
    :meth:`survey_distribution`.
    """

    def survey_distribution(self, observations: list[Any], slots: list[int],
                            surveys: list[Survey]) -> list[list[float] | None]:
        """Per slot, each option's probability under the simulator's decoding (greedy: one-hot on the mode),
        or None where it cannot say (it then answers in free text). Changes no slot state, draws nothing."""
        ...

    def answer_survey(self, observations: list[Any], slots: list[int], surveys: list[Survey]) -> list[Any]:
        """Per slot, the answer action: an option's text drawn from :meth:`survey_distribution` with the
        slot's generator (greedy: the most likely option), or free text where the distribution is None."""
        ...


@dataclass
class Scores:
    """A trainable simulator's view of its recorded dialogues, with gradient.

    Attributes:
        logprob: Per dialogue, the summed log-probability of the simulator's own replies.
        kl: Per dialogue, the summed KL of its reply distributions to the base simulator's.
    """

    logprob: torch.Tensor
    kl: torch.Tensor


class Trainable(ABC):
    """What the co-trainer needs from a trainable simulator (a mixin next to :class:`Simulator`).

    A trainable simulator records every dialogue it drives, in start order, in :attr:`episodes`; the
    ``j``-th recorded dialogue is the ``j``-th trajectory of a collected batch that it drove.
    """

    name: str
    episodes: list[Any]
    frozen: bool = False

    @abstractmethod
    def parameters(self) -> list[torch.nn.Parameter]:
        """The trained parameters."""

    @abstractmethod
    def score(self, episodes: Sequence[Any]) -> Scores:
        """Log-probabilities of the recorded replies and KL to the base, with gradient."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The trained parameters, for checkpoints."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    @abstractmethod
    def snapshot(self) -> Simulator:
        """A frozen copy of the current parameters (for checkpoint pools); it records nothing."""

    def after_step(self) -> None:
        """Called after each optimiser step (e.g. to project parameters back into their bounds)."""

    def clear(self) -> None:
        """Forget the recorded dialogues (the co-trainer calls it before each collection)."""
        self.episodes = []


# ================================================================================ specs and kinds
Items = tuple[tuple[str, Any], ...]


def _items(values: Mapping[str, Any] | Items) -> Items:
    return tuple(sorted(dict(values).items()))


@dataclass(frozen=True)
class Kind:
    """One simulator kind that spec strings can name.

    Attributes:
        entry_point: ``"module:callable"``; ``callable(spec, context)`` builds the simulator, where
            ``context`` is a :class:`BuildContext`.
        help: One line for error messages and ``--help``.
        decoding: Decoding keys and their defaults (a default's type is the key's type).
        extra: Other keys and their defaults.
        needs_model: Whether the spec must name a model.
        wraps: For wrapper kinds: the inner kinds' capability they need (``"distribution"`` or
            ``"trainable"``); a spec whose model starts with such a kind builds the wrapper around it.
        distribution: Built simulators state their distribution (:class:`DistributionalSimulator`).
        trainable: ``"module:callable"`` building a trainable version of this kind (same signature).
    """

    entry_point: str
    help: str
    decoding: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    needs_model: bool = True
    wraps: str = ""
    distribution: bool = False
    trainable: str = ""


_KINDS: dict[str, Kind] = {}
#: The registered kinds (read-only view): name -> :class:`Kind`.
KINDS: Mapping[str, Kind] = MappingProxyType(_KINDS)


def register_simulator_kind(name: str, kind: Kind) -> None:
    """Make ``name`` a kind that spec strings can name (benchmarks register their native kinds)."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"simulator kind names are letters, digits, '-' and '_'; got {name!r}")
    if name in _KINDS:
        raise ValueError(f"simulator kind {name!r} is already registered")
    reserved = {"personas"} & (set(kind.decoding) | set(kind.extra))
    if reserved:
        raise ValueError(f"kind {name!r}: 'personas' is valid for every kind; do not declare it")
    _KINDS[name] = kind


def kind(name: str) -> Kind:
    """The registered kind ``name``, or a ValueError listing the valid ones."""
    try:
        return _KINDS[name]
    except KeyError:
        valid = "; ".join(f"{k} ({v.help})" for k, v in _KINDS.items())
        raise ValueError(f"unknown simulator kind {name!r}; valid kinds: {valid}") from None


def inner_kind(spec_kind: str, model: str) -> str | None:
    """For a wrapper kind, the inner kind its ``model`` names (``verbalized:persuadee:base`` -> persuadee)."""
    wrapper = kind(spec_kind)
    head = model.partition(":")[0]
    if not wrapper.wraps or head not in _KINDS:
        return None
    inner = _KINDS[head]
    if (wrapper.wraps == "distribution" and not inner.distribution) or (
            wrapper.wraps == "trainable" and not inner.trainable):
        raise ValueError(f"{spec_kind}:{model}: kind {head!r} cannot be wrapped by {spec_kind!r} "
                         f"(it has no {'stated distribution' if wrapper.wraps == 'distribution' else 'trainable form'})")
    return head


@dataclass(frozen=True, init=False)
class SimulatorSpec:
    """What a simulator is, in comparable form.

    Attributes:
        kind: A registered kind, or ``population`` / ``custom`` for simulators no string builds.
        model: The model behind it (a backend spec such as ``smollm2``, or a parameter-set name).
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

    def __init__(self, kind: str, model: str = "", personas: str = SCENARIO_PERSONAS,
                 decoding: Mapping[str, Any] | Items = (), extra: Mapping[str, Any] | Items = ()) -> None:
        for name, value in (("kind", kind), ("model", model), ("personas", personas), ("decoding", _items(decoding)),
                            ("extra", _items(extra))):
            object.__setattr__(self, name, value)

    @property
    def params(self) -> dict[str, Any]:
        """Decoding and extra settings together, as a dict."""
        return {**dict(self.decoding), **dict(self.extra)}

    def __str__(self) -> str:
        text = self.kind
        if self.model:
            text += ":" + quote(self.model, safe=":/@-_.~+,=")
        params = {**self.params, "personas": self.personas}  # an empty string (a default "none") is left out
        text += "?" + "&".join(f"{key}={_render(value)}" for key, value in sorted(params.items()) if value != "")
        return text

    @classmethod
    def parse(cls, text: str) -> SimulatorSpec:
        """Parse the string syntax (module docstring), validate names and types, fill in defaults."""
        head, _, query = text.strip().partition("?")
        kind_name, _, model = head.partition(":")
        k = kind(kind_name)
        model = unquote(model)
        if k.needs_model and not model:
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
        decoding_keys, extra_keys = _keys(kind_name, model)
        unknown = sorted(set(given) - set(decoding_keys) - set(extra_keys))
        if unknown:
            valid = ", ".join(sorted({"personas", *decoding_keys, *extra_keys}))
            raise ValueError(f"unknown parameter(s) {', '.join(unknown)} for simulator kind {kind_name!r}"
                             f"{' over ' + model if inner_kind(kind_name, model) else ''}; valid: {valid}")
        decoding = {key: _coerce(key, given.get(key), default) for key, default in decoding_keys.items()}
        extra = {key: _coerce(key, given.get(key), default) for key, default in extra_keys.items()}
        return cls(kind_name, model, personas, decoding, extra)

    def inner(self) -> SimulatorSpec:
        """For a wrapper spec (``verbalized:persuadee:base?...``), the spec of the simulator it wraps."""
        name = inner_kind(self.kind, self.model)
        if name is None:
            raise ValueError(f"{self} wraps no simulator kind")
        inner_model = self.model.partition(":")[2]
        decoding, extra = _keys(name, inner_model)
        params = self.params
        return SimulatorSpec(name, inner_model, self.personas, {k: params[k] for k in decoding},
                             {k: params[k] for k in extra})


def _keys(kind_name: str, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Valid decoding and extra keys (with defaults) of a spec; a wrapper adds its inner kind's."""
    k = kind(kind_name)
    inner = inner_kind(kind_name, model)
    if inner is None:
        return dict(k.decoding), dict(k.extra)
    inner_decoding, inner_extra = _keys(inner, model.partition(":")[2])
    if k.wraps == "trainable":  # the inner kind's trainable form takes the inner kind's settings
        return inner_decoding, inner_extra
    # Renormalising a stated distribution takes tau and floor; the LLM-only settings do not apply.
    return {**inner_decoding, "tau": k.decoding["tau"], "floor": k.decoding["floor"]}, inner_extra


def _render(value: Any) -> str:
    return repr(value) if isinstance(value, float) else quote(str(value), safe="")


def _coerce(key: str, value: str | None, default: Any) -> Any:
    if value is None:
        return default
    if isinstance(default, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"parameter {key!r} expects true or false, got {value!r}")
        return value.lower() in ("true", "1")
    try:
        parsed = type(default)(value)
    except ValueError:
        raise ValueError(f"parameter {key!r} expects {type(default).__name__}, got {value!r}") from None
    if isinstance(parsed, float) and not np.isfinite(parsed):
        raise ValueError(f"parameter {key!r} expects a finite number, got {value!r}")
    return parsed


class BuildContext(Protocol):
    """What a kind's builder gets besides its spec (implemented by :mod:`simpop.simulators.registry`).

    Attributes:
        env: The env the simulator will serve (None if the caller gave none).
    """

    env: Any

    def backend(self, model: str) -> Any:
        """The backend for a model spec, loaded once and shared by every simulator of this build."""
        ...

    def trainable_backend(self, model: str) -> Any:
        """An in-process trainable backend for ``model`` (LoRA adapters), shared likewise."""
        ...

    def personas(self, name: str) -> list[Any] | None:
        """The personas of set ``name`` (None for :data:`SCENARIO_PERSONAS`)."""
        ...

    def build(self, spec: SimulatorSpec, name: str | None = None) -> Simulator:
        """Build another spec in the same context (wrapper kinds build their inner simulator)."""
        ...


# ================================================================================ generic kinds
_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 64}

register_simulator_kind("frozen", Kind(
    "simpop.simulators.llm:LLMSimulator.from_spec",
    "persona prompt + backend + decoding (default greedy: the mode-collapsed baseline)", decoding=_SAMPLING))
register_simulator_kind("verbalized", Kind(
    "simpop.simulators.verbalized:from_spec",
    "verbalized sampling: an LLM lists k replies with probabilities (verbalized:MODEL), or a simulator's "
    "stated distribution is renormalised (verbalized:KIND[:MODEL]); one reply is sampled",
    decoding={**_SAMPLING, "max_new_tokens": 256, "k": 5, "tau": 1.0, "floor": 0.01, "constrained": True},
    extra={"fallback_temperature": 1.0, "fallback_max_new_tokens": 64}, wraps="distribution"))
register_simulator_kind("trainable", Kind(
    "simpop.simulators.trainable:from_spec",
    "co-trained: a LoRA adapter on an in-process model (trainable:MODEL), or a kind's trainable form "
    "(trainable:KIND[:MODEL])",
    decoding={**_SAMPLING, "temperature": 1.0, "max_new_tokens": 48}, extra={"lora_r": 8, "lora_alpha": 16},
    wraps="trainable"))
register_simulator_kind("native", Kind(
    "simpop.simulators.registry:native", "the env's own simulator (model: optional env id)", needs_model=False))
