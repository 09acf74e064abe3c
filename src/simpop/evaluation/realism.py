"""The realism index: how far a P4G simulator's behaviour is from the real persuadees' (``simpop audit --realism``).

A simulator plays ``n`` dialogues against the corpus-like reference persuader
(:class:`~simpop.envs.persuasion.reference.ReferencePersuader`: greeting, strategies at corpus frequencies, then the ask).
Each dialogue and each real P4G dialogue is reduced to the same behavioural statistics, measured by the same
instrument on both sides, and each statistic is compared with the people's by a named distance in [0, 1]:

========================  =========  ==================================================================  ===========
statistic                 level      what (instrument)                                                    distance
========================  =========  ==================================================================  ===========
``donor_rate``            act, text  share of persuadees who donate (env outcome; corpus ``B6``)         abs. diff.
``amount``                act, text  donors' amounts over the 7 amount levels (nearest level)            TV
``decision_rate``         act, text  share who state a decision in the dialogue (act: decision acts;     abs. diff.
                                     text: :func:`~simpop.envs.persuasion.outcome.parse_donation`)
``decision_turn``         act, text  the persuader turn of that decision (1 .. 9, 10+)                   TV
``cooperation``           act        share of replies that are positive acts (agree, thank, positive     abs. diff.
                                     reactions)
``act_distribution``      act        persuadee acts (the first annotated act of a human turn)            TV
``strategy_response``     act, text  per persuasion strategy, the reply's class (act: positive /          mean TV
                                     neutral / negative / question; text: agreeing or not, strategies
                                     read by :func:`~simpop.envs.persuasion.acts.classify_persuader`)
``reply_length``          text       words per reply, in 6 bins                                           TV
``lexical_diversity``     text       per dialogue, distinct-2 of the persuadee's replies, in 5 bins       TV
``semantic_diversity``    text       across dialogues: 1 - mean pairwise cosine of one reply per          abs. diff.
                                     dialogue (MiniLM embeddings)
``agreement``             text       share of replies with an agreement marker (yes, sure, okay, ...)     abs. diff.
========================  =========  ==================================================================  ===========

People's act-level statistics come from the annotated dialogues (their act labels), the text-level ones from all
dialogues' text. The **index** is ``1 - mean distance`` over the level's
statistics (1: indistinguishable from people by these statistics). Its 95% CI is a bootstrap: replicate ``b``
resamples the simulator's dialogues and is compared with the people's bootstrap replicate ``b``; resampling inflates
distances, so the percentile interval is shifted by the replicates' mean minus the point value (bias-corrected).
The **human ceiling** is the index that real dialogues get when scored as a simulator: a random subset of about the
simulator's sample size (:data:`CEILING_SIZES`, the largest not above it) against the other dialogues, over many
subsets (mean and 95% interval): how close people come to people at that sample size.

The people's statistics ship as ``data/p4g-realism-v1.json`` (point values, bootstrap replicates and ceilings;
no text), made from the public corpus by ``simpop fit-p4g`` (:mod:`simpop.evaluation.p4g_fit`); ``--corpus DIR``
computes them from a corpus folder instead.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from simpop.envs.persuasion.acts import DECISION_ACTS, PERSUADEE_ACTS, PERSUADER_ACTS, STRATEGIES, classify_persuader
from simpop.envs.persuasion.model import AMOUNT_LEVELS
from simpop.envs.persuasion.outcome import parse_donation
from simpop.evaluation.diversity import distinct_n
from simpop.user_input import UsageError, integer

REALISM_VERSION = "p4g-realism-v1"
LEVELS = ("act", "text")
_ENV_IDS = {"act": "simpop/PersuasionAct-v0", "text": "simpop/Persuasion-v1"}
#: Statistic -> (levels it is measured at, distance name).
STATISTICS: dict[str, tuple[tuple[str, ...], str]] = {
    "donor_rate": (LEVELS, "abs"), "amount": (LEVELS, "tv"), "decision_rate": (LEVELS, "abs"),
    "decision_turn": (LEVELS, "tv"), "cooperation": (("act",), "abs"), "act_distribution": (("act",), "tv"),
    "strategy_response": (LEVELS, "mean_tv"), "reply_length": (("text",), "tv"),
    "lexical_diversity": (("text",), "tv"), "semantic_diversity": (("text",), "abs"), "agreement": (("text",), "abs"),
}
#: Bootstrap replicates (shipped and per simulator); sample sizes the human ceiling is computed at.
REPLICATES = 100
CEILING_SIZES = (8, 16, 32, 64, 128, 256, 480)
TURN_BINS = 10
LENGTH_EDGES = (3, 6, 11, 21, 41)  # words: 1-2, 3-5, 6-10, 11-20, 21-40, 41+
LEXICAL_EDGES = (0.2, 0.4, 0.6, 0.8)
POSITIVE = ("positive-reaction-to-donation", "positive-to-inquiry", "agree-donation", "provide-donation-amount",
            "confirm-donation", "thank")
NEGATIVE = ("negative-reaction-to-donation", "negative-to-inquiry", "disagree-donation", "disagree-donation-more")
QUESTIONS = ("ask-org-info", "ask-donation-procedure", "ask-persuader-donation-intention", "task-related-inquiry",
             "personal-related-inquiry")
_AGREE = re.compile(r"\b(yes|yeah|yep|sure|ok|okay|agree|agreed|of course|absolutely|definitely|sounds good|great|"
                    r"happy to|glad to|i'?d love|i would love|good idea|i like)\b", re.IGNORECASE)
_WORD = re.compile(r"\w+")


@dataclass
class Turn:
    """One exchange: the persuader's act or text, then the persuadee's (act level: acts; text level: texts)."""

    persuader: str
    persuadee: str


@dataclass
class Conversation:
    """One dialogue as the statistics see it.

    Attributes:
        donation: The persuadee's donation in dollars (0: none).
        turns: The exchanges, in order.
        level: ``act`` (turns hold acts) or ``text`` (turns hold texts).
    """

    donation: float
    turns: list[Turn] = field(default_factory=list)
    level: str = "act"


def _class_of(act: str) -> int:
    return 0 if act in POSITIVE else 2 if act in NEGATIVE else 3 if act in QUESTIONS else 1


def _decision_turn(c: Conversation) -> int | None:
    for i, t in enumerate(c.turns, start=1):
        if (t.persuadee in DECISION_ACTS) if c.level == "act" else parse_donation(t.persuadee) is not None:
            return i
    return None


def counts(c: Conversation) -> dict[str, np.ndarray]:
    """The dialogue's contribution to each additive statistic: ``name -> [numerator..., denominator]`` vectors whose
    sums over dialogues give the statistic (:func:`finish`)."""
    levels = np.array(AMOUNT_LEVELS)
    out: dict[str, np.ndarray] = {}
    donated = c.donation > 0
    out["donor_rate"] = np.array([float(donated), 1.0])
    amount = np.zeros(len(levels))
    if donated:
        amount[int(np.argmin(np.abs(levels - c.donation)))] = 1.0
    out["amount"] = amount
    turn = _decision_turn(c)
    out["decision_rate"] = np.array([float(turn is not None), 1.0])
    bins = np.zeros(TURN_BINS)
    if turn is not None:
        bins[min(turn, TURN_BINS) - 1] = 1.0
    out["decision_turn"] = bins
    strategies = {s: i for i, s in enumerate(STRATEGIES)}
    if c.level == "act":
        acts = np.zeros(len(PERSUADEE_ACTS))
        response = np.zeros((len(STRATEGIES), 4))
        for t in c.turns:
            acts[PERSUADEE_ACTS.index(t.persuadee)] += 1
            if t.persuader in strategies:
                response[strategies[t.persuader], _class_of(t.persuadee)] += 1
        out["act_distribution"] = acts
        out["cooperation"] = np.array([sum(acts[PERSUADEE_ACTS.index(a)] for a in POSITIVE), acts.sum()])
        out["strategy_response"] = response.ravel()
        return out
    lengths = np.zeros(len(LENGTH_EDGES) + 1)
    response = np.zeros((len(STRATEGIES), 2))
    agree = 0
    for t in c.turns:
        lengths[int(np.searchsorted(LENGTH_EDGES, len(_WORD.findall(t.persuadee)), side="right"))] += 1
        agrees = bool(_AGREE.search(t.persuadee))
        agree += agrees
        act = classify_persuader(t.persuader)
        if act in strategies:
            response[strategies[act], int(agrees)] += 1
    out["reply_length"] = lengths
    out["agreement"] = np.array([agree, len(c.turns)], dtype=float)
    out["strategy_response"] = response.ravel()
    lexical = np.zeros(len(LEXICAL_EDGES) + 1)
    value = distinct_n([t.persuadee for t in c.turns], 2)
    if not math.isnan(value):
        lexical[int(np.searchsorted(LEXICAL_EDGES, value, side="right"))] = 1.0
    out["lexical_diversity"] = lexical
    return out


def finish(name: str, total: np.ndarray) -> Any:
    """A statistic from its summed :func:`counts` (a share, a distribution, or per-strategy distributions)."""
    if name in ("donor_rate", "decision_rate", "cooperation", "agreement"):
        return float(total[0] / total[1]) if total[1] else math.nan
    if name == "strategy_response":
        rows = total.reshape(len(STRATEGIES), -1)
        sums = rows.sum(1, keepdims=True)
        return np.where(sums > 0, rows / np.where(sums > 0, sums, 1), np.nan)
    s = total.sum()
    return total / s if s else np.full(len(total), np.nan)


def distance(name: str, a: Any, b: Any) -> float:
    """The named distance of statistic ``name`` between two values (NaN when either is undefined)."""
    kind = STATISTICS[name][1]
    if kind == "abs":
        return abs(float(a) - float(b))
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if kind == "tv":
        return float(0.5 * np.abs(a - b).sum()) if np.isfinite(a).all() and np.isfinite(b).all() else math.nan
    both = np.isfinite(a).all(1) & np.isfinite(b).all(1)  # strategies used on both sides
    return float(0.5 * np.abs(a[both] - b[both]).sum(1).mean()) if both.any() else math.nan


# ---------------------------------------------------------------------------------------------- samples
class Sample:
    """A set of conversations at one level, ready for weighted (bootstrap) statistics.

    Args:
        conversations: The dialogues.
        level: ``act`` or ``text``.
        embed: Texts -> normalised embeddings (text level, for ``semantic_diversity``).
        seed: Which reply of each dialogue ``semantic_diversity`` uses (a seeded draw per dialogue).
    """

    def __init__(self, conversations: Sequence[Conversation], level: str, embed: Callable | None = None,
                 seed: int = 0):
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        self.level, self.size = level, len(conversations)
        self.names = [n for n, (levels, _) in STATISTICS.items() if level in levels]
        rows = [counts(c) for c in conversations]
        self.matrix = {n: np.array([r[n] for r in rows]) for n in self.names if n != "semantic_diversity"}
        self.vectors = None
        if level == "text" and conversations:
            rng = np.random.default_rng(seed)
            picks = [c.turns[int(rng.integers(len(c.turns)))].persuadee if c.turns else "" for c in conversations]
            if embed is None:
                from simpop.evaluation.diversity import load_embedder

                embed = load_embedder()
            self.vectors = np.asarray(embed(picks), dtype=float)

    def statistics(self, weights: np.ndarray | None = None) -> dict[str, Any]:
        """Every statistic with each dialogue counted ``weights[i]`` times (default once)."""
        w = np.ones(self.size) if weights is None else np.asarray(weights, dtype=float)
        out = {n: finish(n, w @ m) for n, m in self.matrix.items()}
        if self.vectors is not None:
            total = w @ self.vectors
            # mean cosine over pairs of draws from different dialogues (unit vectors: a dialogue with itself is w_i^2)
            pairs = w.sum() ** 2 - (w * w).sum()
            out["semantic_diversity"] = (float(max(0.0, 1.0 - (total @ total - (w * w).sum()) / pairs))
                                         if pairs > 0 else math.nan)
        return out

    def replicates(self, count: int, seed: int) -> list[dict[str, Any]]:
        """``count`` bootstrap replicates (dialogues resampled with replacement)."""
        rng = np.random.default_rng(seed)
        return [self.statistics(np.bincount(rng.integers(self.size, size=self.size), minlength=self.size))
                for _ in range(count)]


def index(stats: dict[str, Any], reference: dict[str, Any], names: Sequence[str]) -> tuple[float, dict[str, float]]:
    """``1 - mean distance`` over ``names`` (statistics undefined on either side are left out), and each distance."""
    d = {n: distance(n, stats[n], reference[n]) for n in names}
    finite = [v for v in d.values() if not math.isnan(v)]
    return (1.0 - float(np.mean(finite)) if finite else math.nan), d


def ceiling(sample: Sample, size: int, count: int, seed: int) -> list[float]:
    """The index of ``size`` random dialogues of ``sample`` against the other dialogues, ``count`` times: people
    scored as a simulator with ``size`` dialogues is scored against the people."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        a = np.zeros(sample.size)
        a[rng.permutation(sample.size)[:size]] = 1
        out.append(index(sample.statistics(a), sample.statistics(1 - a), sample.names)[0])
    return out


# ---------------------------------------------------------------------------------------------- people
def corpus_conversations(corpus: Any) -> dict[str, list[Conversation]]:
    """The corpus's dialogues as conversations: ``act`` (annotated dialogues, first modelled label per turn and
    role; turns without both are left out) and ``text`` (every dialogue, the turn's sentences joined)."""
    from simpop.envs.persuasion.corpus import ER_LABEL_ALIASES

    out: dict[str, list[Conversation]] = {"act": [], "text": []}
    for d in corpus.dialogues:
        by_turn: dict[int, dict[str, list]] = {}
        for u in d.utterances:
            slot = by_turn.setdefault(u.turn, {"persuader": [], "persuadee": [], "er": [], "ee": []})
            slot[u.role].append(u.text.strip())
            for label in u.labels:
                if u.role == "persuader" and ER_LABEL_ALIASES.get(label, label) in PERSUADER_ACTS:
                    slot["er"].append(ER_LABEL_ALIASES.get(label, label))
                elif u.role == "persuadee" and label in PERSUADEE_ACTS:
                    slot["ee"].append(label)
        turns = [by_turn[k] for k in sorted(by_turn)]
        out["text"].append(Conversation(d.donation, [Turn(" ".join(t["persuader"]), " ".join(t["persuadee"]))
                                                     for t in turns if t["persuadee"]], "text"))
        if d.annotated:
            out["act"].append(Conversation(d.donation, [Turn(t["er"][0], t["ee"][0]) for t in turns
                                                        if t["er"] and t["ee"]], "act"))
    return out


def human_reference(corpus_dir: str, *, seed: int = 2019, commit: str = "", command: str = "",
                    embed: Callable | None = None, replicates: int = REPLICATES) -> dict[str, Any]:
    """The people's statistics from the P4G corpus in ``corpus_dir``: per level, the point values, ``replicates``
    bootstrap replicates and the human ceiling at each of :data:`CEILING_SIZES` up to half the dialogues."""
    from simpop.envs.persuasion.corpus import load_corpus
    from simpop.envs.persuasion.fitted import CORPUS_REPOSITORY

    corpus = load_corpus(corpus_dir)
    conversations = corpus_conversations(corpus)
    levels = {}
    for level in LEVELS:
        sample = Sample(conversations[level], level, embed, seed)
        levels[level] = {"dialogues": sample.size, "statistics": sample.names, "point": _plain(sample.statistics()),
                         "replicates": _plain(sample.replicates(replicates, seed)),
                         "ceiling": {str(m): ceiling(sample, m, replicates, seed + m) for m in CEILING_SIZES
                                     if 2 * m <= sample.size}}
    return {"version": REALISM_VERSION, "corpus": {"repository": CORPUS_REPOSITORY, "commit": commit,
                                                   "dialogues": len(corpus.dialogues)},
            "command": command, "seed": seed, "levels": levels}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _array(value: Any) -> Any:
    """A shipped statistic back as numbers (None -> NaN)."""
    if isinstance(value, list):
        return np.array([_array(v) for v in value], dtype=float)
    return math.nan if value is None else value


def reference_path():
    """The shipped people's statistics."""
    return resources.files("simpop.evaluation") / "data" / f"{REALISM_VERSION}.json"


@functools.lru_cache(maxsize=1)
def shipped_reference() -> dict[str, Any]:
    """The shipped people's statistics (:func:`human_reference` of the public corpus)."""
    return json.loads(reference_path().read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------- simulators
def simulator_conversations(spec: str, level: str, episodes: int, seed: int = 0,
                            backends: dict | None = None) -> list[Conversation]:
    """``episodes`` dialogues of simulator ``spec`` against the reference persuader, at ``level``."""
    from simpop.envs.registration import make
    from simpop.simulators.registry import build_simulator

    simulator = build_simulator(spec, env=make(_ENV_IDS[level]), backends={} if backends is None else backends)
    return conversations_of(simulator, level, episodes, seed)


def conversations_of(simulator: Any, level: str, episodes: int, seed: int = 0) -> list[Conversation]:
    """``episodes`` dialogues of ``simulator`` (a simulator or population built for ``level``'s env) against the
    reference persuader (act level: the env transcript's acts; text level: its texts)."""
    from simpop.envs.registration import make
    from simpop.evaluation.panel import EnvPool
    from simpop.envs.persuasion.reference import ReferencePersuader
    from simpop.rollout import RolloutEngine

    pool = EnvPool(lambda: make(_ENV_IDS[level]))
    policy = ReferencePersuader(level == "text", pool.take(1)[0].max_turns)
    engine = RolloutEngine(pool.factory(), policy, simulator)
    out = []
    for trajectory, env in zip(engine.collect(episodes, group_size=1, seed=seed), pool.envs):
        said = [(t.act if level == "act" else t.text) for t in env.transcript]
        donation = (trajectory.infos[-1] if trajectory.infos else {}).get("donation") or 0.0
        out.append(Conversation(float(donation), [Turn(a, b) for a, b in zip(said[0::2], said[1::2])], level))
    return out


@dataclass
class Score:
    """One simulator's realism: the index with its CI, each statistic's distance, the ceiling at its sample size."""

    spec: str
    level: str
    dialogues: int
    index: float
    ci: tuple[float, float]
    distances: dict[str, float]
    ceiling: float
    ceiling_ci: tuple[float, float]
    ceiling_size: int


def score(conversations: Sequence[Conversation], reference: dict[str, Any], level: str, spec: str = "",
          embed: Callable | None = None, seed: int = 0) -> Score:
    """The realism :class:`Score` of ``conversations`` against ``reference`` (:func:`human_reference`)."""
    people = reference["levels"][level]
    sample = Sample(conversations, level, embed, seed)
    point = {n: _array(v) for n, v in people["point"].items()}
    value, distances = index(sample.statistics(), point, sample.names)
    human = [{n: _array(v) for n, v in r.items()} for r in people["replicates"]]
    values = [index(s, h, sample.names)[0] for s, h in zip(sample.replicates(len(human), seed + 1), human)]
    bias = float(np.nanmean(values)) - value  # resampling inflates distances: shift the interval back
    values = [v - bias for v in values]
    sizes = sorted(int(m) for m in people["ceiling"])
    size = max([m for m in sizes if m <= sample.size] or sizes[:1])
    top = people["ceiling"][str(size)]
    return Score(spec, level, sample.size, value, _ci(values), distances, float(np.mean(top)), _ci(top), size)


def _ci(values: Sequence[float]) -> tuple[float, float]:
    finite = [v for v in values if not math.isnan(v)]
    return (float(np.quantile(finite, 0.025)), float(np.quantile(finite, 0.975))) if finite else (math.nan, math.nan)


# ---------------------------------------------------------------------------------------------- audit
DEFAULT_ACT = ("persuadee?decoding=greedy&personas=modal", "persuadee", "verbalized:persuadee",
               "persuadee:heldout-0?temperature=0.8&personas=heldout-300-4242",
               "persuadee:fitted-0?temperature=1.0&personas=human-300-2019")
DEFAULT_TEXT = ("persuadee", "frozen:smollm2?temperature=1.0", "verbalized:smollm2?k=5")


def realism_audit(act: Sequence[str], text: Sequence[str], *, corpus: str | None = None, act_episodes: int = 128,
                  text_episodes: int = 8, panels: Sequence[str] = (), seed: int = 0,
                  embed: Callable | None = None, progress: bool = True) -> dict[str, Any]:
    """Score act-level specs ``act``, text-level specs ``text`` and every member of each shipped panel in ``panels``
    (at its env's level) against the shipped people's statistics, or those of the corpus folder ``corpus``."""
    from simpop.evaluation.panels import panel_definition
    from simpop.progress import progress_bar

    reference = human_reference(corpus, embed=embed) if corpus else shipped_reference()
    jobs = [(s, "act", act_episodes) for s in act] + [(s, "text", text_episodes) for s in text]
    for name in panels:
        definition = panel_definition(name)
        level = "act" if any("Act" in e for e in definition.env) else "text"
        jobs += [(spec, level, act_episodes if level == "act" else text_episodes)
                 for spec in definition.members.values()]
    backends: dict = {}
    scores = []
    bar = progress_bar(len(jobs), "realism", disable=not progress)
    for spec, level, episodes in jobs:
        scores.append(score(simulator_conversations(spec, level, episodes, seed, backends), reference, level, spec,
                            embed, seed))
        bar.update()
    bar.close()
    return {"reference": {"version": reference["version"], "corpus": reference["corpus"],
                          "source": corpus or "shipped"},
            "scores": [_plain(vars(s)) for s in scores]}


def render_realism(summary: dict[str, Any]) -> str:
    """The markdown table of a :func:`realism_audit` summary."""
    ref = summary["reference"]
    lines = ["# Realism index (P4G persuadees)", "",
             f"People: {ref['corpus']['repository']} @ {ref['corpus']['commit'][:12] or '?'} "
             f"({ref['corpus']['dialogues']} dialogues; statistics {ref['source']}). Index = 1 - mean distance to the "
             "people's statistics, 95% bias-corrected bootstrap CI; human ceiling = the index of real dialogues scored "
             "as a simulator (a random set of about the simulator's sample size against the other dialogues).", ""]
    for level in LEVELS:
        rows = [s for s in summary["scores"] if s["level"] == level]
        if not rows:
            continue
        names = [n for n, (levels, _) in STATISTICS.items() if level in levels]
        lines += [f"## {level} level", "",
                  "| simulator | dialogues | index [95% CI] | human ceiling [95% CI] (n) | "
                  + " | ".join(f"{n} ({STATISTICS[n][1]})" for n in names) + " |",
                  "|---|---|---|---|" + "---|" * len(names)]
        for s in rows:
            lines.append(f"| `{s['spec']}` | {s['dialogues']} | {_f(s['index'])} [{_f(s['ci'][0])}, {_f(s['ci'][1])}]"
                         f" | {_f(s['ceiling'])} [{_f(s['ceiling_ci'][0])}, {_f(s['ceiling_ci'][1])}] "
                         f"({s['ceiling_size']}) | " + " | ".join(_f(s["distances"].get(n)) for n in names) + " |")
        lines.append("")
    return "\n".join(lines)


def _f(value: Any) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def configure(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Add the ``simpop audit --realism`` flags to the audit's parser; returns those only ``--realism`` uses."""
    group = parser.add_argument_group("realism (--realism)")
    group.add_argument("--realism", action="store_true",
                       help="score simulators' behaviour against real P4G persuadees (the realism index)")
    return [
        group.add_argument("--corpus", default=None, metavar="DIR",
                           help="compute the people's statistics from this P4G corpus folder (default: shipped)"),
        group.add_argument("--act-sim", action="append", metavar="SPEC",
                           help="act-level simulator spec (repeatable; default: " + ", ".join(DEFAULT_ACT) + ")"),
        group.add_argument("--text-sim", action="append", metavar="SPEC",
                           help="text-level simulator spec (repeatable; default with --text: "
                                + ", ".join(DEFAULT_TEXT) + ")"),
        group.add_argument("--text", action="store_true", help="also score the default text-level simulators"),
        group.add_argument("--panel", action="append", default=[], metavar="NAME",
                           help="score a shipped panel's members"),
        group.add_argument("--act-episodes", type=integer(2, 100_000), default=128,
                           help="dialogues per act-level simulator (128)"),
        group.add_argument("--text-episodes", type=integer(2, 10_000), default=8,
                           help="dialogues per text-level simulator (8)"),
    ]


def run(args: argparse.Namespace) -> int:
    """``simpop audit --realism``: write ``realism.json`` and ``realism.md`` into ``--out``."""
    if args.corpus and not Path(args.corpus).is_dir():
        raise UsageError(f"--corpus {args.corpus}: no such folder")
    text = args.text_sim or (list(DEFAULT_TEXT) if args.text else [])
    act = args.act_sim or ([] if args.text_sim or args.panel else list(DEFAULT_ACT))
    try:
        summary = realism_audit(act, text, corpus=args.corpus, act_episodes=args.act_episodes,
                                text_episodes=args.text_episodes, panels=args.panel, seed=args.seed)
    except ValueError as error:
        raise UsageError(f"--realism: {error}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "realism.json").write_text(json.dumps(summary, indent=1))
    (out / "realism.md").write_text(render_realism(summary))
    print(render_realism(summary))
    print(f"wrote {out / 'realism.json'} and {out / 'realism.md'}")
    return 0
