"""Persuadee personas: the 32 P4G survey attributes, a documented sampler, and text descriptions.

P4G participants filled in a pre-task survey; its 32 scores are the persona. Scales follow the corpus:
Big-Five 1–5, moral foundations 1–6, Schwartz values 1–6, decision style 1–5, income bracket 1–12, and
categorical demographics spelled as in ``full_info.csv`` (e.g. ``"Less than four-year college"``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

BIG_FIVE = ("extrovert", "agreeable", "conscientious", "neurotic", "open")
MORAL = ("care", "fairness", "loyalty", "authority", "purity", "freedom")
SCHWARTZ = ("conform", "tradition", "benevolence", "universalism", "self_direction", "stimulation", "hedonism",
            "achievement", "power", "security")
DECISION = ("rational", "intuitive")
DEMOGRAPHICS = ("age", "sex", "race", "edu", "marital", "employment", "income", "religion", "ideology")
#: All 32 attributes, in the order of ``full_info.csv``'s persona columns.
PERSONA_FIELDS = BIG_FIVE + MORAL + SCHWARTZ + DECISION + DEMOGRAPHICS
#: Attributes whose values are category labels rather than numbers.
CATEGORICAL = ("sex", "race", "edu", "marital", "employment", "religion", "ideology")
#: Numeric attributes (income is an ordinal bracket).
NUMERIC = tuple(f for f in PERSONA_FIELDS if f not in CATEGORICAL)

#: (low, high) of every numeric attribute's scale.
SCALES: dict[str, tuple[float, float]] = {
    **{f: (1.0, 5.0) for f in BIG_FIVE + DECISION},
    **{f: (1.0, 6.0) for f in MORAL + SCHWARTZ},
    "age": (18.0, 75.0),
    "income": (1.0, 12.0),
}

#: Category labels as spelled in the corpus.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "sex": ("Male", "Female", "Other"),
    "race": ("White", "Other"),
    "edu": ("Less than four-year college", "Four-year college", "Postgraduate"),
    "marital": ("Married", "Unmarried"),
    "employment": ("Employed for wages", "Other"),
    "religion": ("Catholic", "Protestant", "Atheist", "Other religion"),
    "ideology": ("Liberal", "Moderate", "Conservative"),
}


@dataclass(frozen=True)
class Persona:
    """One persuadee's 32 survey attributes (see the module docstring for scales)."""

    extrovert: float
    agreeable: float
    conscientious: float
    neurotic: float
    open: float
    care: float
    fairness: float
    loyalty: float
    authority: float
    purity: float
    freedom: float
    conform: float
    tradition: float
    benevolence: float
    universalism: float
    self_direction: float
    stimulation: float
    hedonism: float
    achievement: float
    power: float
    security: float
    rational: float
    intuitive: float
    age: float
    sex: str
    race: str
    edu: str
    marital: str
    employment: str
    income: float
    religion: str
    ideology: str

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Persona:
        """Build a persona from ``{attribute: value}``; numbers are converted and checked against scales.

        Raises:
            KeyError: an attribute is missing.
            ValueError: a number is not numeric or lies outside its scale (age: any positive number).
        """
        out: dict[str, Any] = {}
        for name in PERSONA_FIELDS:
            value = values[name]
            if name in CATEGORICAL:
                out[name] = str(value).strip()
                continue
            number = float(value)
            lo, hi = SCALES[name]
            if name == "age":
                lo, hi = 0.0, 120.0
            if not lo <= number <= hi or math.isnan(number):
                raise ValueError(f"{name}={value!r} is outside its scale [{lo:g}, {hi:g}]")
            out[name] = number
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        """The persona's attributes by name."""
        return asdict(self)

    def centred(self, name: str) -> float:
        """A numeric attribute mapped from its scale to [-1, 1] (scale midpoint = 0)."""
        lo, hi = SCALES[name]
        value = min(max(float(getattr(self, name)), lo), hi)
        return (2.0 * value - lo - hi) / (hi - lo)

    def describe(self) -> str:
        """The persona as second-person text for an LLM prompt."""
        return describe(self)


assert tuple(f.name for f in fields(Persona)) == PERSONA_FIELDS


# ---------------------------------------------------------------------------------------------- sampling
@dataclass(frozen=True)
class Marginal:
    """One attribute's sampling distribution.

    Numeric: a normal (``mean``, ``sd``) clipped to the scale and rounded to ``step`` (the resolution of
    the survey score: Big-Five scores average five 1–5 items, so they move in steps of 0.2).
    Categorical: ``weights`` over :data:`CATEGORIES` (or over brackets 1..12 for income).
    """

    mean: float = 0.0
    sd: float = 0.0
    step: float = 1.0
    weights: tuple[float, ...] = ()

    def support(self, name: str) -> list[Any]:
        """Every value this marginal can produce."""
        if self.weights:
            return list(CATEGORIES[name]) if name in CATEGORIES else [float(i + 1) for i in range(len(self.weights))]
        lo, hi = SCALES[name]
        n = int(round((hi - lo) / self.step))
        return [round(lo + i * self.step, 6) for i in range(n + 1)]

    def probabilities(self, name: str) -> np.ndarray:
        """Probabilities of :meth:`support` (the clipped, rounded normal's mass per grid point)."""
        if self.weights:
            w = np.asarray(self.weights, dtype=float)
            return w / w.sum()
        grid = np.asarray(self.support(name))
        edges = np.concatenate([[-np.inf], (grid[:-1] + grid[1:]) / 2, [np.inf]])
        cdf = np.array([_normal_cdf((e - self.mean) / self.sd) for e in edges])
        return np.diff(cdf)


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0))) if math.isfinite(x) else (1.0 if x > 0 else 0.0)


#: Default marginals (see :class:`PersonaSampler` for the rationale).
DEFAULT_MARGINALS: dict[str, Marginal] = {
    "extrovert": Marginal(3.0, 0.9, 0.2),
    "agreeable": Marginal(3.9, 0.7, 0.2),
    "conscientious": Marginal(4.0, 0.7, 0.2),
    "neurotic": Marginal(2.5, 0.9, 0.2),
    "open": Marginal(3.7, 0.7, 0.2),
    "care": Marginal(4.5, 0.8, 0.2),
    "fairness": Marginal(4.6, 0.7, 0.25),
    "loyalty": Marginal(3.4, 1.0, 1 / 3),
    "authority": Marginal(3.7, 0.9, 0.2),
    "purity": Marginal(3.4, 1.3, 1 / 3),
    "freedom": Marginal(4.6, 0.9, 0.5),
    "conform": Marginal(4.0, 1.2, 1.0),
    "tradition": Marginal(3.3, 1.3, 1.0),
    "benevolence": Marginal(4.4, 1.1, 1.0),
    "universalism": Marginal(4.6, 1.1, 1.0),
    "self_direction": Marginal(4.6, 1.0, 1.0),
    "stimulation": Marginal(3.8, 1.2, 1.0),
    "hedonism": Marginal(3.6, 1.2, 1.0),
    "achievement": Marginal(3.6, 1.2, 1.0),
    "power": Marginal(3.2, 1.2, 1.0),
    "security": Marginal(4.4, 1.1, 1.0),
    "rational": Marginal(4.1, 0.6, 0.5),
    "intuitive": Marginal(3.3, 0.8, 0.5),
    "age": Marginal(35.0, 10.0, 1.0),
    "sex": Marginal(weights=(0.47, 0.52, 0.01)),
    "race": Marginal(weights=(0.78, 0.22)),
    "edu": Marginal(weights=(0.50, 0.37, 0.13)),
    "marital": Marginal(weights=(0.45, 0.55)),
    "employment": Marginal(weights=(0.70, 0.30)),
    "income": Marginal(weights=(0.05, 0.07, 0.10, 0.11, 0.13, 0.11, 0.10, 0.09, 0.08, 0.06, 0.05, 0.05)),
    "religion": Marginal(weights=(0.20, 0.30, 0.20, 0.30)),
    "ideology": Marginal(weights=(0.45, 0.35, 0.20)),
}


class PersonaSampler:
    """Samples personas attribute by attribute from independent marginals.

    Default marginals (numeric: normal mean/sd, clipped to the scale, rounded to the survey's step):

    ==============  ==========  ====  ========================================================
    attribute       mean / sd   step  rationale
    ==============  ==========  ====  ========================================================
    extrovert       3.0 / 0.9   0.2   US crowd workers sit near the scale midpoint
    agreeable       3.9 / 0.7   0.2   agreeableness is the highest Big-Five score in P4G
    conscientious   4.0 / 0.7   0.2   crowd workers score high (attention-checked tasks)
    neurotic        2.5 / 0.9   0.2   lowest Big-Five mean, widest spread
    open            3.7 / 0.7   0.2   moderately high
    care            4.5 / 0.8   0.2   individualising foundations dominate (liberal-leaning sample)
    fairness        4.6 / 0.7   0.25  as care
    loyalty         3.4 / 1.0   1/3   binding foundations are lower and more spread out
    authority       3.7 / 0.9   0.2   as loyalty
    purity          3.4 / 1.3   1/3   the most polarised foundation (religion, ideology)
    freedom         4.6 / 0.9   0.5   high in US samples
    conform         4.0 / 1.2   1     Schwartz items are integers 1–6
    tradition       3.3 / 1.3   1     lower and polarised (religion)
    benevolence     4.4 / 1.1   1     among the highest values in every culture
    universalism    4.6 / 1.1   1     as benevolence
    self_direction  4.6 / 1.0   1     high in US samples
    stimulation     3.8 / 1.2   1     middling
    hedonism        3.6 / 1.2   1     middling
    achievement     3.6 / 1.2   1     middling
    power           3.2 / 1.2   1     the lowest value in most samples
    security        4.4 / 1.1   1     high
    rational        4.1 / 0.6   0.5   people rate themselves more rational ...
    intuitive       3.3 / 0.8   0.5   ... than intuitive
    age             35 / 10     1     crowd workers are young adults; clipped to 18–75
    ==============  ==========  ====  ========================================================

    Categorical weights: sex Male .47 / Female .52 / Other .01; race White .78 / Other .22; edu
    less than four-year college .50 / four-year college .37 / postgraduate .13; marital Married .45 /
    Unmarried .55; employment Employed for wages .70 / Other .30; income brackets 1–12 peaked at 5
    (lower-middle incomes); religion Catholic .20 / Protestant .30 / Atheist .20 / Other religion .30;
    ideology Liberal .45 / Moderate .35 / Conservative .20.

    These approximate the P4G participants (US crowd workers, 2018); the paper publishes no per-
    attribute statistics, so they are set from the corpus's scales and typical MTurk demographics.
    With the corpus at hand, prefer :class:`EmpiricalPersonaSampler` over its real personas.
    Attributes are sampled independently (the corpus's correlations, e.g. purity with ideology, are
    not modelled).
    """

    def __init__(self, marginals: Mapping[str, Marginal] | None = None):
        self.marginals = dict(DEFAULT_MARGINALS if marginals is None else marginals)
        missing = set(PERSONA_FIELDS) - set(self.marginals)
        if missing:
            raise ValueError(f"marginals lack attributes {sorted(missing)}; give one Marginal per attribute")
        # Precomputed once: sampling is a categorical draw per attribute over its value grid.
        self._tables = {n: (self.marginals[n].support(n), self.marginals[n].probabilities(n)) for n in PERSONA_FIELDS}

    @classmethod
    def uniform(cls) -> PersonaSampler:
        """A sampler over the same value grids with every attribute uniform: a population that reaches the
        extremes as often as the middle (the robustness panel's personas, not P4G's participants)."""
        sampler = cls()
        sampler._tables = {n: (support, np.full(len(support), 1.0 / len(support)))
                           for n, (support, _) in sampler._tables.items()}
        return sampler

    def sample(self, rng: np.random.Generator) -> Persona:
        """One persona: each attribute drawn independently from its marginal."""
        values = {}
        for name in PERSONA_FIELDS:
            support, probs = self._tables[name]
            values[name] = support[int(rng.choice(len(support), p=probs))]
        return Persona(**values)

    def sample_many(self, n: int, rng: np.random.Generator) -> list[Persona]:
        """``n`` personas drawn with ``rng``."""
        return [self.sample(rng) for _ in range(n)]

    def modal_persona(self) -> Persona:
        """The most likely persona: every attribute at its marginal's mode."""
        return Persona(**{n: support[int(np.argmax(probs))] for n, (support, probs) in self._tables.items()})


class EmpiricalPersonaSampler:
    """Resamples real personas (e.g. the corpus's persuadees) uniformly."""

    def __init__(self, personas: Sequence[Persona]):
        if not personas:
            raise ValueError("EmpiricalPersonaSampler needs at least one persona")
        self.personas = list(personas)

    def sample(self, rng: np.random.Generator) -> Persona:
        """One of the personas, uniformly."""
        return self.personas[int(rng.integers(len(self.personas)))]

    def sample_many(self, n: int, rng: np.random.Generator) -> list[Persona]:
        """``n`` personas drawn with replacement."""
        return [self.sample(rng) for _ in range(n)]

    def modal_persona(self) -> Persona:
        """Each attribute's most frequent value among the personas (ties: the smallest value)."""
        values = {}
        for name in PERSONA_FIELDS:
            column = [getattr(p, name) for p in self.personas]
            values[name] = max(sorted(set(column), key=str), key=column.count)
        return Persona(**values)


def modal_persona() -> Persona:
    """The default sampler's most likely persona (the collapse experiment's frozen simulator uses it)."""
    return PersonaSampler().modal_persona()


# ---------------------------------------------------------------------------------------------- text
_LEVELS = ("very low", "low", "moderate", "high", "very high")


def _level(persona: Persona, name: str) -> str:
    c = persona.centred(name)
    return _LEVELS[min(4, int((c + 1.0) / 2.0 * 5))]


_TRAIT_TEXT = {
    "extrovert": "extraversion", "agreeable": "agreeableness", "conscientious": "conscientiousness",
    "neurotic": "neuroticism", "open": "openness to experience",
    "care": "care for others", "fairness": "fairness", "loyalty": "loyalty to your group",
    "authority": "respect for authority", "purity": "sanctity/purity", "freedom": "personal liberty",
    "conform": "conformity", "tradition": "tradition", "benevolence": "benevolence",
    "universalism": "universalism", "self_direction": "self-direction", "stimulation": "stimulation",
    "hedonism": "hedonism", "achievement": "achievement", "power": "power", "security": "security",
}

_SEX_NOUN = {"Male": "man", "Female": "woman"}
_EDU_TEXT = {"Less than four-year college": "less than a four-year college degree",
             "Four-year college": "a four-year college degree", "Postgraduate": "a postgraduate degree"}


def describe(persona: Persona) -> str:
    """Second-person natural-language description of ``persona`` for LLM prompts."""
    noun = _SEX_NOUN.get(persona.sex, "person")
    race = "white " if persona.race == "White" else ""
    employment = ("employed for wages" if persona.employment == "Employed for wages"
                  else "not in regular paid employment")
    religion = {"Atheist": "an atheist", "Other religion": "of a non-Christian religion or none in particular"}.get(
        persona.religion, persona.religion)
    income = int(round(persona.income))
    band = "low" if income <= 3 else "lower-middle" if income <= 6 else "upper-middle" if income <= 9 else "high"
    lines = [
        f"You are a {int(round(persona.age))}-year-old {race}{noun}, {persona.marital.lower()}, with "
        f"{_EDU_TEXT.get(persona.edu, persona.edu)}, {employment}, with a {band} household income "
        f"(bracket {income} of 12); religion: {religion}; politically {persona.ideology.lower()}.",
        "Personality (Big Five): " + ", ".join(f"{_level(persona, n)} {_TRAIT_TEXT[n]}" for n in BIG_FIVE) + ".",
        "Moral foundations: " + ", ".join(f"{_level(persona, n)} {_TRAIT_TEXT[n]}" for n in MORAL) + ".",
        "Values: " + ", ".join(f"{_level(persona, n)} {_TRAIT_TEXT[n]}" for n in SCHWARTZ) + ".",
        f"Decision style: {_level(persona, 'rational')} reliance on careful reasoning, "
        f"{_level(persona, 'intuitive')} reliance on gut feeling.",
    ]
    return "\n".join(lines)
