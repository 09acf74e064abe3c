"""The native persona-conditioned persuadee: a probabilistic model over P4G dialogue acts.

State: the persuadee's donation *inclination* (log-odds of donating if asked now), *rapport* in [0, 1]
and how often each persuader act was used. Each persuader act moves the inclination by an effect
that depends on the persona, on rapport and on repetition (:meth:`PersuadeeModel.update`):

- a persona baseline: ``intercept + Σ trait_weights · centred trait`` (care, benevolence,
  universalism, agreeableness and income raise it; power and hedonism lower it);
- each act's base effect times a persona multiplier ``max(0, 1 + modulation · mean centred
  modulating traits)``: emotion-appeal by care/agreeable/intuitive, logical-appeal by
  rational/conscientious, credibility-appeal by authority, self-modeling and foot-in-the-door by
  conformity, ... (:data:`MODULATORS`);
- persuasive appeals are amplified by rapport (``× (1 + rapport_boost · rapport)``); inquiries and a
  greeting build rapport;
- the ``n``-th repeat of an act has effect ``effect · repeat_decay**n − repeat_penalty · n``
  (diminishing, then negative returns);
- asking (proposition-of-donation / ask-donation-amount) before any persuasive appeal costs
  ``premature_penalty``.

When asked, the persuadee decides: it donates with probability ``sigmoid(inclination / T)`` (greedy:
iff the inclination is positive, i.e. p > 0.5), an amount from ``softmax((amount_logits + (amount_shift
+ amount_slope · inclination) · u) / T)`` over :data:`AMOUNT_LEVELS` (``u`` = centred level index),
else refuses. Otherwise it answers with a non-decision act from ``softmax((response_logits[act] ±
sentiment_slope · inclination) / T)`` (positive reactions gain and negative ones lose with inclination).
Greedy decoding takes every argmax: on the modal persona it is the mode-collapsed "frozen" simulator.

All parameters live in one :class:`PersuadeeParams`, also viewable as a flat vector for training.
:func:`calibrate` sets the intercept and amount shift so that under the corpus-like
:func:`reference_persuader` the donor rate is 53.6% and the mean donation $0.35 (Wang et al., 2019).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from collections.abc import Sequence

import numpy as np

from simpop.envs.persuasion.acts import (ASKING_ACTS, DECISION_ACTS, INQUIRIES, PERSUADEE_ACTS, PERSUADER_ACTS,
                                         STRATEGIES)
from simpop.envs.persuasion.personas import Persona, PersonaSampler
from simpop.seat import choice_rows

#: Donation amounts a donor chooses between (the corpus's common amounts, in dollars).
AMOUNT_LEVELS = (0.05, 0.10, 0.25, 0.50, 1.00, 1.50, 2.00)
#: Persona traits that shift the baseline inclination (weights in :attr:`PersuadeeParams.trait_weights`).
BASE_TRAITS = ("care", "benevolence", "universalism", "agreeable", "income", "power", "hedonism")
#: Traits whose centred mean scales each persuader act's effect.
MODULATORS: dict[str, tuple[str, ...]] = {
    "logical-appeal": ("rational", "conscientious"),
    "emotion-appeal": ("care", "agreeable", "intuitive"),
    "credibility-appeal": ("authority",),
    "foot-in-the-door": ("conform", "agreeable"),
    "self-modeling": ("conform",),
    "personal-story": ("care", "intuitive"),
    "donation-information": ("rational",),
    "source-related-inquiry": ("open",),
    "task-related-inquiry": ("open",),
    "personal-related-inquiry": ("extrovert",),
    "proposition-of-donation": (),
    "ask-donation-amount": (),
    "greeting": ("extrovert",),
    "closing": (),
}
#: Appeals (strategies that argue rather than ask): amplified by rapport; asking before any is premature.
APPEALS = tuple(s for s in STRATEGIES if s not in INQUIRIES)
#: Acts that build rapport.
RAPPORT_ACTS = INQUIRIES + ("greeting",)
_SENTIMENT = {"positive-reaction-to-donation": 1.0, "positive-to-inquiry": 1.0, "thank": 0.5,
              "negative-reaction-to-donation": -1.0, "negative-to-inquiry": -1.0}

#: Approximate strategy counts in the 300 annotated P4G dialogues (Wang et al., 2019, Table 2).
REFERENCE_STRATEGY_COUNTS = {
    "credibility-appeal": 779, "donation-information": 362, "logical-appeal": 325, "emotion-appeal": 237,
    "task-related-inquiry": 180, "source-related-inquiry": 167, "personal-related-inquiry": 151,
    "self-modeling": 150, "foot-in-the-door": 134, "personal-story": 91,
}
#: Corpus figures the calibration targets: share of persuadees who donated, mean donation in dollars.
CORPUS_DONOR_RATE = 545 / 1017
CORPUS_MEAN_DONATION = 0.35


def _default_response_logits() -> tuple[float, ...]:
    """Hand-set response preferences: which persuadee acts naturally answer each persuader act."""
    appeal = {"positive-reaction-to-donation": 1.5, "neutral-reaction-to-donation": 1.5,
              "negative-reaction-to-donation": 0.8, "acknowledgement": 1.0, "ask-org-info": 0.5}
    affinity: dict[str, dict[str, float]] = {a: appeal for a in APPEALS}
    affinity = {**affinity,
                "self-modeling": {**appeal, "ask-persuader-donation-intention": -0.5},
                "donation-information": {"ask-donation-procedure": 1.5, "acknowledgement": 1.2,
                                         "neutral-reaction-to-donation": 1.0, "positive-reaction-to-donation": 0.5},
                "source-related-inquiry": {"positive-to-inquiry": 1.2, "neutral-to-inquiry": 1.2,
                                           "negative-to-inquiry": 1.0, "ask-org-info": 1.2},
                "task-related-inquiry": {"positive-to-inquiry": 1.2, "neutral-to-inquiry": 1.0,
                                         "negative-to-inquiry": 1.0, "task-related-inquiry": 0.3},
                "personal-related-inquiry": {"positive-to-inquiry": 1.2, "neutral-to-inquiry": 1.2,
                                             "negative-to-inquiry": 0.5, "personal-related-inquiry": 1.0,
                                             "off-task": 0.5},
                "greeting": {"greeting": 2.5, "personal-related-inquiry": 0.5},
                "closing": {"closing": 2.0, "thank": 1.0, "you-are-welcome": 0.5}}
    return tuple(affinity.get(er, {}).get(ee, -3.0) for er in PERSUADER_ACTS for ee in PERSUADEE_ACTS)


def _vector_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(PersuadeeParams))


@dataclass(frozen=True)
class PersuadeeParams:
    """Every parameter of the native persuadee (see the module docstring for how each is used).

    Attributes:
        intercept: Baseline log-odds of donating; set by :func:`calibrate` (donor rate 53.6%).
        trait_weights: Per :data:`BASE_TRAITS` weight on the centred trait (care and benevolence
            predict giving most; power and hedonism are self-enhancement values that oppose it).
        act_effects: Per :data:`PERSUADER_ACTS`, the log-odds change of one use. Appeals 0.2–0.35 so that
            a corpus-like dialogue (≈6 strategies) moves the odds by ≈e^1.5; inquiries small (their value
            is rapport); asking acts 0 (they trigger the decision); closing slightly negative (it signals
            the persuader gave up).
        modulation: Per act, how strongly the persona's modulating traits scale its effect (0 = not).
        rapport_gain: Rapport one inquiry or greeting adds (× persona multiplier; rapport caps at 1).
        rapport_boost: Appeal effects are multiplied by ``1 + rapport_boost · rapport``.
        repeat_decay: Effect multiplier per earlier use of the same act, in [0, 1].
        repeat_penalty: Log-odds lost per earlier use of the same act (repetition annoys).
        premature_penalty: Log-odds lost when asked before any appeal.
        response_logits: Row-major ``len(PERSUADER_ACTS) × len(PERSUADEE_ACTS)`` table of response-act
            logits for non-decision turns (decision acts are masked there).
        sentiment_slope: How much the inclination raises positive and lowers negative reactions.
        amount_logits: Per :data:`AMOUNT_LEVELS`, donors' amount preferences; the defaults put 10.5% of
            donors at the full $2 (57 of 545 in the corpus) and make donors give ≈ $0.65 on average.
        amount_shift: Shift towards larger amounts; set by :func:`calibrate` (mean donation $0.35).
        amount_slope: Extra shift per unit of inclination (keener donors give more).
    """

    intercept: float = -1.9868
    trait_weights: tuple[float, ...] = (0.5, 0.4, 0.3, 0.3, 0.2, -0.3, -0.2)
    act_effects: tuple[float, ...] = (0.30, 0.35, 0.25, 0.20, 0.25, 0.30, 0.20, 0.10, 0.10, 0.15,
                                      0.0, 0.0, 0.10, -0.20)
    modulation: tuple[float, ...] = (0.8, 0.8, 0.8, 0.6, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.5, 0.0)
    rapport_gain: float = 0.35
    rapport_boost: float = 0.5
    repeat_decay: float = 0.5
    repeat_penalty: float = 0.1
    premature_penalty: float = 1.0
    response_logits: tuple[float, ...] = field(default_factory=_default_response_logits)
    sentiment_slope: float = 0.8
    amount_logits: tuple[float, ...] = tuple(math.log(w) for w in (0.10, 0.15, 0.17, 0.22, 0.21, 0.045, 0.105))
    amount_shift: float = -0.1476
    amount_slope: float = 0.3

    def __post_init__(self) -> None:
        sizes = {"trait_weights": len(BASE_TRAITS), "act_effects": len(PERSUADER_ACTS),
                 "modulation": len(PERSUADER_ACTS), "response_logits": len(PERSUADER_ACTS) * len(PERSUADEE_ACTS),
                 "amount_logits": len(AMOUNT_LEVELS)}
        for name, size in sizes.items():
            value = getattr(self, name)
            if len(value) != size:
                raise ValueError(f"PersuadeeParams.{name} needs {size} values, got {len(value)}")
            object.__setattr__(self, name, tuple(float(v) for v in value))
        for name, (lo, hi) in _BOUNDS.items():
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"PersuadeeParams.{name}={value} must lie in [{lo}, {hi}]")
        if not np.all(np.isfinite(self.to_vector())):
            raise ValueError("PersuadeeParams must be finite; check the vector you built them from")

    # ------------------------------------------------------------------ flat vector view
    def to_vector(self) -> np.ndarray:
        """All parameters as one float64 vector, in field order (tuples flattened)."""
        return np.concatenate([np.atleast_1d(np.asarray(getattr(self, n), dtype=float)) for n in _vector_fields()])

    @classmethod
    def from_vector(cls, vector: Sequence[float] | np.ndarray) -> PersuadeeParams:
        """Inverse of :meth:`to_vector` (raises if a bounded parameter is out of range: clip with :meth:`bounds`)."""
        vector = np.asarray(vector, dtype=float)
        sizes = cls.sizes()
        if vector.shape != (sum(sizes.values()),):
            raise ValueError(f"PersuadeeParams vector must have shape ({sum(sizes.values())},), got {vector.shape}")
        values, start = {}, 0
        for name, size in sizes.items():
            chunk = vector[start:start + size]
            values[name] = float(chunk[0]) if name in _SCALARS else tuple(float(v) for v in chunk)
            start += size
        return cls(**values)  # type: ignore[arg-type]  # each name gets its field's kind (scalar or tuple)

    @classmethod
    def sizes(cls) -> dict[str, int]:
        """Number of vector entries per field, in vector order."""
        default = cls()
        return {n: int(np.size(getattr(default, n))) for n in _vector_fields()}

    @classmethod
    def bounds(cls) -> tuple[np.ndarray, np.ndarray]:
        """Per-entry (lower, upper) bounds of the vector view (±inf where unbounded)."""
        lo, hi = [], []
        for name, size in cls.sizes().items():
            a, b = _BOUNDS.get(name, (-np.inf, np.inf))
            lo += [a] * size
            hi += [b] * size
        return np.array(lo), np.array(hi)


_SCALARS = {"intercept", "rapport_gain", "rapport_boost", "repeat_decay", "repeat_penalty", "premature_penalty",
            "sentiment_slope", "amount_shift", "amount_slope"}
_BOUNDS = {"repeat_decay": (0.0, 1.0), "rapport_gain": (0.0, 1.0), "rapport_boost": (0.0, 10.0)}


@dataclass(frozen=True)
class PersuadeeState:
    """One persuadee's dialogue state (immutable: :meth:`PersuadeeModel.update` returns a new one).

    Attributes:
        inclination: Log-odds of donating if asked now.
        rapport: In [0, 1]; built by inquiries and greetings, amplifies appeals.
        counts: Uses of each persuader act so far (aligned with :data:`PERSUADER_ACTS`).
        multipliers: The persona's effect multiplier per persuader act (fixed for the dialogue).
    """

    inclination: float
    rapport: float
    counts: tuple[int, ...]
    multipliers: tuple[float, ...]


@dataclass
class PersuadeeStates:
    """Many persuadees' states as arrays, row ``i`` one dialogue's :class:`PersuadeeState` (advanced in place
    by :meth:`PersuadeeModel.update_rows`; a wave of act-level dialogues keeps its persuadees this way).

    Attributes:
        inclination, rapport: ``[n]`` float64.
        counts: ``[n, len(PERSUADER_ACTS)]`` int64 uses of each persuader act.
        multipliers: ``[n, len(PERSUADER_ACTS)]`` float64 persona effect multipliers.
    """

    inclination: np.ndarray
    rapport: np.ndarray
    counts: np.ndarray
    multipliers: np.ndarray

    @classmethod
    def of(cls, states: Sequence[PersuadeeState]) -> PersuadeeStates:
        """The states as arrays (the same numbers)."""
        n = len(states)
        return cls(np.array([s.inclination for s in states], dtype=np.float64),
                   np.array([s.rapport for s in states], dtype=np.float64),
                   np.array([s.counts for s in states], dtype=np.int64).reshape(n, len(PERSUADER_ACTS)),
                   np.array([s.multipliers for s in states], dtype=np.float64).reshape(n, len(PERSUADER_ACTS)))

    def __len__(self) -> int:
        return len(self.inclination)

    def __getitem__(self, row: int) -> PersuadeeState:
        """Row ``row`` as a :class:`PersuadeeState`."""
        return PersuadeeState(float(self.inclination[row]), float(self.rapport[row]),
                              tuple(self.counts[row].tolist()), tuple(self.multipliers[row].tolist()))

    def __setitem__(self, row: int, state: PersuadeeState) -> None:
        self.inclination[row], self.rapport[row] = state.inclination, state.rapport
        self.counts[row], self.multipliers[row] = state.counts, state.multipliers

    def take(self, rows: np.ndarray) -> PersuadeeStates:
        """The states of ``rows`` (a copy)."""
        return PersuadeeStates(self.inclination[rows], self.rapport[rows], self.counts[rows], self.multipliers[rows])


#: A persuadee turn: (act, amount) where amount is the donation for decision acts, else None.
Outcome = tuple[str, float | None]

_ER_INDEX = {a: i for i, a in enumerate(PERSUADER_ACTS)}
_DECISION_MASK = np.array([a in DECISION_ACTS for a in PERSUADEE_ACTS])
_SENTIMENT_SIGN = np.array([_SENTIMENT.get(a, 0.0) for a in PERSUADEE_ACTS])
_AMOUNTS = np.array(AMOUNT_LEVELS)
_U = (np.arange(len(AMOUNT_LEVELS)) - (len(AMOUNT_LEVELS) - 1) / 2) / (len(AMOUNT_LEVELS) - 1)
#: Per persuader act (aligned with :data:`PERSUADER_ACTS`): an appeal, an asking act, a rapport-building act.
IS_APPEAL = np.array([a in APPEALS for a in PERSUADER_ACTS])
IS_ASKING = np.array([a in ASKING_ACTS for a in PERSUADER_ACTS])
IS_RAPPORT = np.array([a in RAPPORT_ACTS for a in PERSUADER_ACTS])
_APPEAL_INDEX = np.array([_ER_INDEX[a] for a in APPEALS])
#: Persuadee acts a non-decision turn can answer with (every other act has probability 0 there).
_RESPONSE_SUPPORT = np.flatnonzero(~_DECISION_MASK)
#: The outcomes :meth:`PersuadeeModel.distribution` lists, in its order: per decision verb, donating each amount
#: level, then refusing; on other turns, the non-decision acts.
_OUTCOME_GROUPS: tuple[tuple[Outcome, ...], ...] = (
    *((*((verb, float(a)) for a in AMOUNT_LEVELS), ("disagree-donation", 0.0))
      for verb in ("provide-donation-amount", "agree-donation")),
    tuple((PERSUADEE_ACTS[j], None) for j in _RESPONSE_SUPPORT))
#: Per persuader act, the index of its replies' outcomes in :data:`_OUTCOME_GROUPS`.
_OUTCOME_GROUP = {a: 0 if a == "ask-donation-amount" else 1 if a in ASKING_ACTS else 2 for a in PERSUADER_ACTS}


class PersuadeeModel:
    """The decision and response model for given :class:`PersuadeeParams` (stateless; see :class:`PersuadeeState`).

    It works on batches: :meth:`update_rows` advances many dialogues' :class:`PersuadeeStates`, :meth:`probabilities`
    gives their reply distributions and :meth:`respond_batch` draws their replies. The one-dialogue calls
    (:meth:`update`, :meth:`distribution`, :meth:`respond`, ...) are those on a batch of one.
    """

    def __init__(self, params: PersuadeeParams | None = None):
        self.params = params or PersuadeeParams()
        p = self.params
        self._effects = np.array(p.act_effects)
        self._responses = np.array(p.response_logits).reshape(len(PERSUADER_ACTS), len(PERSUADEE_ACTS))
        self._amount_logits = np.array(p.amount_logits)
        self._initial: dict[Persona, PersuadeeState] = {}
        self._decay = np.ones(0)

    def initial_state(self, persona: Persona) -> PersuadeeState:
        """The state before the first persuader act (cached per persona: states are immutable)."""
        state = self._initial.get(persona)
        if state is None:
            if len(self._initial) >= 4096:  # bounded: a stream of fresh personas must not grow memory
                self._initial.clear()
            state = self._initial[persona] = self._initial_state(persona)
        return state

    def _initial_state(self, persona: Persona) -> PersuadeeState:
        p = self.params
        base = p.intercept + sum(w * persona.centred(t) for w, t in zip(p.trait_weights, BASE_TRAITS))
        multipliers = tuple(
            max(0.0, 1.0 + m * sum(persona.centred(t) for t in MODULATORS[a]) / len(MODULATORS[a]))
            if MODULATORS[a] else 1.0 for a, m in zip(PERSUADER_ACTS, p.modulation))
        return PersuadeeState(float(base), 0.0, (0,) * len(PERSUADER_ACTS), multipliers)

    # ------------------------------------------------------------------ state
    def update_rows(self, states: PersuadeeStates, rows: np.ndarray, acts: Sequence[str]) -> None:
        """Row ``rows[k]`` of ``states`` hears persuader act ``acts[k]``, in place, for all rows at once (rows must
        be distinct; the torch :func:`~simpop.envs.persuasion.likelihood.replay` is tested equal to it)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) != len(acts):
            raise ValueError(f"update_rows needs one act per row, got {len(rows)} rows and {len(acts)} acts")
        if len(set(rows.tolist())) != len(rows):
            raise ValueError("update_rows needs distinct rows (one act per dialogue)")
        p = self.params
        i = np.array([_ER_INDEX[a] for a in acts], dtype=np.int64)
        n = states.counts[rows, i]
        decay = self._decay_powers(int(n.max(initial=0)))[n]
        multiplier = states.multipliers[rows, i]
        effect = self._effects[i] * multiplier
        effect = np.where(IS_APPEAL[i], effect * (1.0 + p.rapport_boost * states.rapport[rows]), effect)
        inclination = states.inclination[rows] + effect * decay - p.repeat_penalty * n
        premature = IS_ASKING[i] & ~states.counts[rows][:, _APPEAL_INDEX].any(axis=1)
        states.inclination[rows] = np.where(premature, inclination - p.premature_penalty, inclination)
        rapport = states.rapport[rows]
        states.rapport[rows] = np.where(IS_RAPPORT[i], np.minimum(1.0, rapport + p.rapport_gain * multiplier * decay),
                                        rapport)
        states.counts[rows, i] = n + 1

    def update(self, state: PersuadeeState, act: str) -> PersuadeeState:
        """The state after hearing persuader ``act`` (:meth:`update_rows` of one)."""
        states = PersuadeeStates.of([state])
        self.update_rows(states, np.zeros(1, np.int64), [act])
        return states[0]

    def _decay_powers(self, up_to: int) -> np.ndarray:
        """``repeat_decay ** k`` for k = 0..up_to, each as Python's float power computes it."""
        if len(self._decay) <= up_to:
            self._decay = np.array([self.params.repeat_decay ** k for k in range(max(up_to + 1, 2 * len(self._decay)))])
        return self._decay

    # ------------------------------------------------------------------ reply distributions
    def probabilities(self, incl: np.ndarray, acts: Sequence[str], temperature: float = 1.0
                      ) -> list[tuple[np.ndarray, tuple[Outcome, ...], np.ndarray]]:
        """Every row's reply distribution (inclination ``incl[k]``, the state already including persuader act
        ``acts[k]``), as groups of rows with the same outcomes: ``(rows, outcomes, probabilities [len(rows),
        len(outcomes)])``. Asking acts get a decision (donate each of :data:`AMOUNT_LEVELS`, or refuse with 0.0),
        other acts a non-decision act with amount None. Temperature 0 is greedy (one-hot: every argmax)."""
        groups = []
        for rows, probs in self._probabilities(incl, acts, temperature):
            kind = np.array([_OUTCOME_GROUP[acts[i]] for i in rows.tolist()], dtype=np.int64)
            for k in np.unique(kind).tolist():
                groups.append((rows[kind == k], _OUTCOME_GROUPS[k], probs[kind == k]))
        return groups

    def _probabilities(self, incl: np.ndarray, acts: Sequence[str], temperature: float
                       ) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(rows, probabilities)`` of the decision rows (asking acts; the amount levels, then refusing) and of the
        other rows (:data:`_RESPONSE_SUPPORT`), each left out when it has no row."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        incl = np.asarray(incl, dtype=np.float64)
        asking = np.array([a in ASKING_ACTS for a in acts], dtype=bool)
        out = []
        rows = np.flatnonzero(asking)
        if rows.size:
            donate = self._donate(incl[rows], temperature)
            out.append((rows, np.concatenate([donate[:, None] * self.amount_probabilities(incl[rows], temperature),
                                              (1.0 - donate)[:, None]], axis=1)))
        rows = np.flatnonzero(~asking)
        if rows.size:
            logits = (self._responses[[_ER_INDEX[acts[i]] for i in rows.tolist()]]
                      + self.params.sentiment_slope * incl[rows, None] * _SENTIMENT_SIGN)
            out.append((rows, _softmax_rows(np.where(_DECISION_MASK, -np.inf, logits), temperature)[:, _RESPONSE_SUPPORT]))
        return out

    def _donate(self, incl: np.ndarray, temperature: float) -> np.ndarray:
        """Per row, the probability of donating if asked now (temperature 0: 1 iff the inclination is positive)."""
        if temperature == 0:
            return (incl > 0).astype(np.float64)
        return np.array([_sigmoid(float(x) / temperature) for x in incl])  # math.exp: the shipped numbers

    def amount_probabilities(self, inclination: float | np.ndarray, temperature: float = 1.0) -> np.ndarray:
        """Donors' distribution over :data:`AMOUNT_LEVELS` (temperature 0 = one-hot argmax); one row per
        inclination of an array."""
        z = np.asarray(inclination, dtype=np.float64)
        logits = self._amount_logits + (self.params.amount_shift + self.params.amount_slope * np.atleast_1d(z)
                                        )[:, None] * _U
        probs = _softmax_rows(logits, temperature)
        return probs if z.ndim else probs[0]

    def donate_probability(self, state: PersuadeeState, temperature: float = 1.0) -> float:
        """Probability of donating if asked now (temperature 0 = greedy: 1 iff inclination > 0)."""
        return float(self._donate(np.array([state.inclination]), temperature)[0])

    def response_probabilities(self, inclination: float, act: str, temperature: float = 1.0) -> np.ndarray:
        """Distribution over :data:`PERSUADEE_ACTS` on a non-decision turn (decision acts get 0)."""
        if act in ASKING_ACTS:
            raise ValueError(f"{act!r} asks for a decision; response probabilities are for the other acts")
        (_, _, probs), = self.probabilities(np.array([inclination]), [act], temperature)
        out = np.zeros(len(PERSUADEE_ACTS))
        out[_RESPONSE_SUPPORT] = probs[0]
        return out

    def distribution(self, state: PersuadeeState, act: str, temperature: float = 1.0) -> list[tuple[Outcome, float]]:
        """Every possible reply to persuader ``act`` with its probability (:meth:`probabilities` of one); ``state``
        already includes ``act``. Zero-probability outcomes are left out."""
        (_, outcomes, probs), = self.probabilities(np.array([state.inclination]), [act], temperature)
        return [(o, float(q)) for o, q in zip(outcomes, probs[0]) if q > 0]

    def distribution_batch(self, incl: np.ndarray, acts: Sequence[str], temperature: float = 1.0
                           ) -> list[tuple[np.ndarray, tuple[Outcome, ...], np.ndarray]]:
        """:meth:`probabilities` of the rows whose distribution has no zero (greedy, or underflow: :meth:`distribution`
        leaves those outcomes out); the other rows are in no group (none at temperature 0)."""
        if temperature == 0:
            return []
        return [(rows[ok], outcomes, probs[ok]) for rows, outcomes, probs in self.probabilities(incl, acts, temperature)
                if (ok := (probs > 0).all(axis=1)).any()]

    # ------------------------------------------------------------------ replies
    def respond_batch(self, states: Sequence[PersuadeeState] | PersuadeeStates, acts: Sequence[str],
                      rngs: Sequence[np.random.Generator], temperature: float = 1.0) -> list[Outcome]:
        """Each state's reply to its act (the state already including it), drawn from its distribution with its own
        generator: one ``random()`` per row, exactly what ``rngs[k].choice(len(outcomes), p=...)`` over
        :meth:`distribution`'s outcomes draws and picks (temperature 0: the most likely reply, nothing drawn)."""
        n = len(states)
        if not n == len(acts) == len(rngs):
            raise ValueError(f"respond_batch needs one act and one generator per state, got {n}, {len(acts)}, "
                             f"{len(rngs)}")
        incl = (states.inclination if isinstance(states, PersuadeeStates)
                else np.array([s.inclination for s in states]))
        out: list[Outcome] = [("", None)] * n
        for rows, probs in self._probabilities(incl, acts, temperature):
            picks = np.argmax(probs, axis=1) if temperature == 0 else _draw(probs, rows, rngs)
            for i, c in zip(rows.tolist(), picks.tolist()):
                out[i] = _OUTCOME_GROUPS[_OUTCOME_GROUP[acts[i]]][c]
        return out

    def respond(self, state: PersuadeeState, act: str, rng: np.random.Generator, temperature: float = 1.0) -> Outcome:
        """One reply (:meth:`respond_batch` of one)."""
        return self.respond_batch([state], [act], [rng], temperature)[0]


def _softmax_rows(logits: np.ndarray, temperature: float) -> np.ndarray:
    """The softmax of each row at ``temperature`` (0: one-hot at the row's argmax)."""
    if temperature == 0:
        out = np.zeros_like(logits, dtype=np.float64)
        out[np.arange(len(logits)), np.argmax(logits, axis=1)] = 1.0
        return out
    z = logits / temperature
    z = np.exp(z - np.max(z, axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def _draw(probs: np.ndarray, rows: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
    """Per row ``k``, the index ``rngs[rows[k]].choice`` picks over the row's non-zero outcomes (normalised), as an
    index into the row."""
    ok = (probs > 0).all(axis=1)
    p = probs[ok]
    choice = np.empty(len(rows), dtype=np.int64)
    choice[ok] = choice_rows(p / p.sum(axis=1, keepdims=True), np.array([rngs[i].random() for i in rows[ok]]))
    for k in np.flatnonzero(~ok):  # an outcome underflowed to 0: drawn over the others, normalised without it
        support = np.flatnonzero(probs[k] > 0)
        q = probs[k, support]
        choice[k] = support[int(rngs[rows[k]].choice(len(q), p=q / q.sum()))]
    return choice


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


# ---------------------------------------------------------------------------------------------- calibration
def reference_persuader(rng: np.random.Generator, max_turns: int = 10) -> list[str]:
    """A corpus-like persuader's act sequence: greet, use strategies at corpus frequencies, then propose.

    The proposition comes at a uniformly drawn turn in the second half of the dialogue (P4G persuaders
    mostly ask after 5–9 turns); strategies are drawn from :data:`REFERENCE_STRATEGY_COUNTS`; the
    remaining turns (never reached: the persuadee decides when asked) close the dialogue.
    """
    if max_turns < 2:
        raise ValueError(f"reference_persuader needs max_turns >= 2, got {max_turns}")
    names = list(REFERENCE_STRATEGY_COUNTS)
    weights = np.array([REFERENCE_STRATEGY_COUNTS[n] for n in names], dtype=float)
    ask = int(rng.integers(max(1, max_turns // 2), max_turns))
    middle = [names[int(i)] for i in rng.choice(len(names), size=ask - 1, p=weights / weights.sum())]
    return ["greeting", *middle, "proposition-of-donation"] + ["closing"] * (max_turns - ask - 1)


def asked_inclinations(params: PersuadeeParams, personas: Sequence[Persona], rng: np.random.Generator,
                       max_turns: int = 10) -> np.ndarray:
    """Each persona's inclination when a :func:`reference_persuader` first asks (with ``params``' intercept)."""
    model = PersuadeeModel(params)
    dialogues = [reference_persuader(rng, max_turns) for _ in personas]
    # Each dialogue is heard up to its first asking act, all dialogues turn by turn.
    heard = [next((k + 1 for k, act in enumerate(d) if act in ASKING_ACTS), len(d)) for d in dialogues]
    states = PersuadeeStates.of([model.initial_state(p) for p in personas])
    for turn in range(max(heard, default=0)):
        rows = np.array([i for i, n in enumerate(heard) if turn < n], dtype=np.int64)
        model.update_rows(states, rows, [dialogues[i][turn] for i in rows])
    return states.inclination


def expected_outcomes(params: PersuadeeParams, inclinations: np.ndarray) -> tuple[float, float]:
    """(donor rate, mean donation) when personas with these inclinations are asked once."""
    model = PersuadeeModel(params)
    p = 1.0 / (1.0 + np.exp(-inclinations))
    amounts = np.array([row @ _AMOUNTS for row in model.amount_probabilities(inclinations)])
    return float(p.mean()), float((p * amounts).mean())


def calibrate(params: PersuadeeParams | None = None, personas: Sequence[Persona] | None = None,
              target_rate: float = CORPUS_DONOR_RATE, target_mean: float = CORPUS_MEAN_DONATION,
              n: int = 4000, seed: int = 0, max_turns: int = 10) -> PersuadeeParams:
    """``params`` with ``intercept`` and ``amount_shift`` solved so the reference persuader gets the targets.

    Args:
        params: Parameters to calibrate (default: the defaults).
        personas: Population to calibrate on (default: ``n`` draws from :class:`PersonaSampler`).
        target_rate: Share of persuadees who donate (corpus: 545/1017 = 53.6%).
        target_mean: Mean donation over all persuadees in dollars (corpus: $0.35).
        n: Sample size of the personas and reference dialogues.
        seed: Seed of the personas and reference dialogues (deterministic).
        max_turns: Dialogue length of the reference persuader.
    """
    params = params or PersuadeeParams()
    donors_mean = target_mean / target_rate
    if not 0 < target_rate < 1 or not AMOUNT_LEVELS[0] < donors_mean < AMOUNT_LEVELS[-1]:
        raise ValueError(f"targets out of reach: donor rate {target_rate} must be in (0, 1) and mean/rate "
                         f"{donors_mean:.3f} within the amount levels {AMOUNT_LEVELS[0]}–{AMOUNT_LEVELS[-1]}")
    rng = np.random.default_rng(seed)
    if personas is None:
        personas = PersonaSampler().sample_many(n, rng)
    offsets = asked_inclinations(replace(params, intercept=0.0), personas, rng, max_turns)
    intercept = _bisect(lambda b: float(np.mean(1 / (1 + np.exp(-(b + offsets))))) - target_rate, -20.0, 20.0)
    inclinations = intercept + offsets
    shift = _bisect(lambda c: expected_outcomes(replace(params, amount_shift=c), inclinations)[1] - target_mean,
                    -50.0, 50.0)
    return replace(params, intercept=round(intercept, 4), amount_shift=round(shift, 4))


def _bisect(f, lo: float, hi: float, tol: float = 1e-6) -> float:
    """Root of increasing ``f`` on [lo, hi]."""
    if f(lo) > 0 or f(hi) < 0:
        raise ValueError("calibration target is unreachable with these parameters")
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
