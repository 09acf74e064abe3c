"""``simpop audit``: how diverse is a simulator's next reply to a fixed P4G dialogue history?

For each simulator spec and each built-in history (:data:`HISTORIES`: greeting, inquiries, the
persuasion strategies, asking for the donation, pushing after a refusal ...), the audit samples ``n``
replies (``n`` slots of one batch, each with its own seeded generator) and reports, averaged over the
histories:

- **distinct-1 / distinct-2**: distinct n-grams over all n-grams of the ``n`` replies;
- **semantic diversity**: ``1 - mean pairwise cosine`` of the replies' sentence embeddings;
- **outcome entropy** (bits, at most log2 3): the decision each reply states, read by
  :func:`simpop.envs.persuasion.outcome.parse_donation`: ``donate`` (> $0), ``refuse`` ($0) or
  ``undecided`` (no decision);
- **act entropy** (bits): of the persuadee act each reply performs, with the persuasion act classifier;
- **mode share**: the fraction of replies equal to the most common one (1 = fully collapsed);
- **parse-failure rate** of verbalized simulators (answers that fell back to plain sampling) and their
  **format-repair rate** (answers usable only after a format repair, e.g. salvaged from a cut answer).
  ``verbalized:MODEL`` asks for its ``k`` candidates under a JSON schema (``constrained=true``, the
  default), so its row measures verbalized sampling even with a 135M model;
  ``verbalized:MODEL?constrained=false`` is the free-text prompt-and-parse path.

The histories are replayed through the text env, so each simulator sees exactly the observation it
would see in an episode. Writes ``summary.json`` (every figure and every sampled reply) and
``report.md`` (tables) to ``--out``, holding its writer lock (:func:`simpop.files.run_lock`); a folder holding
anything but an audit's outputs (:data:`OUTPUTS`) is refused before the audit runs.

``simpop audit --realism`` instead scores simulators' behaviour against real persuadees: the realism index of
:mod:`simpop.evaluation.realism`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simpop.evaluation import realism
from simpop.evaluation.diversity import Embedder, distinct_n, label_entropy, load_embedder, semantic_diversity
from simpop.files import write_json
from simpop.user_input import SEED, THREADS, integer

DEFAULT_SIMULATORS = ("frozen:smollm2", "verbalized:smollm2?k=5", "frozen:smollm2?temperature=1.0")
DEFAULT_ENV = "simpop/Persuasion-v1"


@dataclass(frozen=True)
class History:
    """A P4G dialogue so far: alternating persuader / persuadee messages, ending with the persuader's.

    Attributes:
        id: Short name.
        stage: What the persuadee is answering.
        turns: Messages, persuader first.
    """

    id: str
    stage: str
    turns: tuple[str, ...]


_HELLO = ("Hi there! How are you doing today?", "I'm doing well, thanks. How about you?")
_INTRO = _HELLO + ("Great! Have you ever heard of the charity Save the Children?",
                   "I think I've heard the name, but I don't know much about it.")

#: Fixed histories at different stages of a persuasion dialogue (none states a decision yet).
HISTORIES: tuple[History, ...] = (
    History("greeting", "the opening greeting", _HELLO[:1]),
    History("source-inquiry", "a question about the charity", _HELLO + (
        "Great! Have you ever heard of the charity Save the Children?",)),
    History("task-inquiry", "a question about their giving habits", _HELLO + (
        "Good to hear. Do you usually donate to charities?",)),
    History("emotion-appeal", "an emotional appeal", _INTRO + (
        "Imagine a little girl in a war zone who hasn't eaten in days. Save the Children gets food and "
        "medicine to kids like her.",)),
    History("logical-appeal", "a logical appeal", _INTRO + (
        "They help children in poverty with health care and education. Even small amounts go a long way, "
        "because every dollar funds vaccines and school supplies.",)),
    History("credibility-appeal", "a credibility appeal", _INTRO + (
        "It was founded in 1919 and is rated highly by Charity Navigator, with most of its money going "
        "straight to programs.",)),
    History("proposition", "a proposition of donation", _INTRO + (
        "They do amazing work for kids around the world.", "That sounds nice.",
        "Would you be willing to donate part of your task payment to Save the Children?")),
    History("ask-amount", "a request for the amount", _INTRO + (
        "Would you consider donating part of your payment today?", "Maybe, I'd have to think about it.",
        "How much would you like to donate? Anything from $0 to $2 helps.")),
    History("after-hesitation", "a foot-in-the-door after hesitation", _INTRO + (
        "Would you be willing to make a donation today?", "Hmm, I'm not sure. Money is tight for me right now.",
        "I understand. Even a small amount like 10 cents makes a difference. Would you consider that?")),
    History("personal-story", "a personal story", _HELLO + (
        "When I was in college I volunteered at a shelter, and I saw how much a little help meant to the "
        "kids there. That's why I support Save the Children.",)),
)


def outcome_label(text: str) -> str:
    """``donate``, ``refuse`` or ``undecided``: the decision a persuadee reply states."""
    from simpop.envs.persuasion.outcome import parse_donation

    amount = parse_donation(text)
    return "undecided" if amount is None else "donate" if amount > 0 else "refuse"


def observation_for(env: Any, history: History, scenario_id: str, seed: int) -> str:
    """The persuadee's observation after replaying ``history`` through ``env``."""
    env.reset(seed=seed, options={"scenario_id": scenario_id})
    for i, text in enumerate(history.turns):
        seat = env.policy_seat if i % 2 == 0 else env.user_seat
        if env.to_act != seat:
            raise RuntimeError(f"history {history.id!r} cannot be replayed: turn {i} is {seat!r}'s, but the env "
                               f"has {'ended' if env.done else repr(env.to_act) + ' to act'}")
        _, _, _, _, infos = env.step({seat: text})
        if infos[seat].get("invalid_action"):
            raise RuntimeError(f"history {history.id!r} turn {i} was rejected: {infos[seat]['invalid_action']}")
    if env.to_act != env.user_seat:
        raise RuntimeError(f"history {history.id!r} must end with the persuader's message")
    return env.text_observation(env.user_seat)


def audit(specs: Sequence[str], n: int = 16, histories: Sequence[History] = HISTORIES, env_id: str = DEFAULT_ENV,
          scenario_id: str | None = None, seed: int = 0, backends: dict | None = None,
          embed: Embedder | None = None, progress: bool = True) -> dict[str, Any]:
    """Sample ``n`` replies per history from each simulator and measure their diversity.

    Args:
        specs: Simulator spec strings (:mod:`simpop.seat`).
        n: Replies sampled per history.
        histories: The dialogue histories.
        env_id: The P4G text env the histories are replayed in.
        scenario_id: The scenario (persona) every history is played with (default: the env's first).
        seed: Seeds the slots' generators.
        backends: Model name -> backend cache (shared with the caller; filled as models load).
        embed: Sentence embedder (default: the bundled MiniLM).
        progress: Show a progress bar.

    Returns:
        The summary: ``config``, ``histories`` and, per simulator, mean ``metrics`` and ``per_history``
        figures with the sampled replies.
    """
    import simpop
    from simpop.envs.persuasion.env import PersuasionEnv
    from simpop.simulators.registry import build_simulator
    from simpop.simulators.verbalized import VerbalizedSimulator
    from simpop.progress import progress_bar

    if n < 2:
        raise ValueError(f"n must be >= 2 to measure diversity, got {n}")
    env = simpop.make(env_id)
    if not isinstance(env, PersuasionEnv):
        raise ValueError(f"env {env_id}: the audit replays P4G histories in a P4G text env, e.g. {DEFAULT_ENV}")
    scenario_id = scenario_id or env.scenario_ids()[0]
    if scenario_id not in env.scenario_ids():
        raise ValueError(f"scenario {scenario_id!r}: {env_id} has no such scenario (e.g. "
                         f"{', '.join(env.scenario_ids()[:3])})")
    observations = [observation_for(env, h, scenario_id, seed) for h in histories]
    scenario = env.scenario
    classify = _act_classifier()
    embed = embed or load_embedder()
    backends = {} if backends is None else backends
    results = []
    bar = progress_bar(len(specs) * len(histories), "audit", disable=not progress)
    for spec in specs:
        simulator = build_simulator(spec, env=env, backends=backends)
        rows = []
        start = time.perf_counter()
        for h, (history, obs) in enumerate(zip(histories, observations)):
            before = dict(simulator.stats) if isinstance(simulator, VerbalizedSimulator) else None
            simulator.reset_batch([scenario] * n, [np.random.default_rng([seed, h, i]) for i in range(n)])
            replies = simulator.act_batch([obs] * n, list(range(n)))
            row = _measure(replies, embed, classify)
            calls = None if before is None else simulator.stats["calls"] - before["calls"]
            row["parse_failure_rate"] = None if before is None else (
                (simulator.stats["fallbacks"] - before["fallbacks"]) / calls)
            row["format_repair_rate"] = None if before is None else (
                (simulator.stats["format_repairs"] - before["format_repairs"]) / calls)
            rows.append({"history": history.id, **row, "replies": replies})
            bar.update()
        metrics = {key: _mean([r[key] for r in rows]) for key in rows[0] if key not in ("history", "replies")}
        results.append({"spec": spec, "resolved": str(simulator.spec), "metrics": metrics,
                        "seconds": round(time.perf_counter() - start, 1), "per_history": rows})
    bar.close()
    return {"config": {"n": n, "env": env_id, "scenario_id": scenario_id, "seed": seed,
                       "act_classifier": classify is not None},
            "histories": [{"id": h.id, "stage": h.stage, "turns": list(h.turns)} for h in histories],
            "simulators": results}


def _act_classifier():
    """The persuadee act classifier of the persuasion env, if it has one."""
    from simpop.envs.persuasion import acts

    return getattr(acts, "classify_persuadee", None)


def _measure(replies: list[str], embed: Embedder, classify) -> dict[str, Any]:
    most_common = Counter(replies).most_common(1)[0][1]
    return {
        "distinct_1": distinct_n(replies, 1),
        "distinct_2": distinct_n(replies, 2),
        "semantic_diversity": semantic_diversity(replies, embed),
        "outcome_entropy": label_entropy([outcome_label(r) for r in replies]),
        "act_entropy": label_entropy([classify(r) for r in replies]) if classify else None,
        "mode_share": most_common / len(replies),
        "outcomes": dict(Counter(outcome_label(r) for r in replies)),
    }


def _mean(values: list[Any]) -> Any:
    if any(v is None for v in values):
        return None
    if isinstance(values[0], dict):  # outcome counts: summed over histories
        total: Counter = Counter()
        for v in values:
            total.update(v)
        return dict(total)
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


COLUMNS = (("distinct_1", "distinct-1"), ("distinct_2", "distinct-2"), ("semantic_diversity", "semantic div."),
           ("outcome_entropy", "outcome H (bits)"), ("act_entropy", "act H (bits)"), ("mode_share", "mode share"),
           ("parse_failure_rate", "VS parse failures"), ("format_repair_rate", "VS format repairs"))


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    return "nan" if math.isnan(value) else f"{value:.3f}"


def render_report(summary: dict[str, Any]) -> str:
    """The markdown report of an :func:`audit` summary."""
    cfg = summary["config"]
    lines = ["# Simulator diversity audit", "",
             f"{cfg['n']} replies per history, {len(summary['histories'])} P4G histories ({cfg['env']}, "
             f"scenario {cfg['scenario_id']}, seed {cfg['seed']}). Means over histories. Outcome entropy is at "
             f"most log2(3) = 1.585 bits."
             + ("" if cfg["act_classifier"] else " Act entropy: n/a (no persuadee act classifier)."), "",
             "| simulator | " + " | ".join(title for _, title in COLUMNS) + " | outcomes (all histories) | s |",
             "|---|" + "---|" * (len(COLUMNS) + 2)]
    for sim in summary["simulators"]:
        m = sim["metrics"]
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(m["outcomes"].items()))
        lines.append(f"| `{sim['spec']}` | " + " | ".join(_cell(m.get(key)) for key, _ in COLUMNS)
                     + f" | {outcomes} | {sim['seconds']} |")
    lines += ["", "## Semantic diversity per history", "",
              "| history | stage | " + " | ".join(f"`{s['spec']}`" for s in summary["simulators"]) + " |",
              "|---|---|" + "---|" * len(summary["simulators"])]
    for i, history in enumerate(summary["histories"]):
        lines.append(f"| {history['id']} | {history['stage']} | "
                     + " | ".join(_cell(s["per_history"][i]["semantic_diversity"]) for s in summary["simulators"])
                     + " |")
    lines += ["", "## Example replies (first history, first three samples)", ""]
    for sim in summary["simulators"]:
        lines.append(f"- `{sim['spec']}`: " + " / ".join(repr(r) for r in sim["per_history"][0]["replies"][:3]))
    return "\n".join(lines) + "\n"


def write(summary: dict[str, Any], out: str | Path) -> Path:
    """Write ``summary.json`` and ``report.md`` into ``out`` (created if needed)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "summary.json", summary)
    (out / "report.md").write_text(render_report(summary))
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``simpop audit``'s arguments to ``parser``."""
    diversity = [
        parser.add_argument("--sim", action="append", metavar="SPEC",
                            help="simulator spec (repeatable), e.g. 'verbalized:smollm2?k=5'; default: "
                                 + ", ".join(DEFAULT_SIMULATORS)),
        parser.add_argument("--n", type=integer(2, 10_000), default=16,
                            help="replies sampled per history (default 16; at least 2 to measure diversity)"),
        parser.add_argument("--histories", default="all", help="comma-separated history ids, or 'all' (ids: "
                                                               + ", ".join(h.id for h in HISTORIES) + ")"),
        parser.add_argument("--env", default=DEFAULT_ENV, help=f"P4G text env id (default {DEFAULT_ENV})"),
        parser.add_argument("--scenario", default=None, help="scenario id (default: the env's first)"),
    ]
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--threads", type=THREADS, default=None,
                        help="torch threads of in-process models (1 is fastest on a busy 2-core machine)")
    parser.add_argument("--out", default="runs/audit", help="output folder (default runs/audit)")
    parser.set_defaults(mode_flags={"diversity": diversity, "realism": realism.configure(parser)})


def misplaced_flags(args: argparse.Namespace) -> str | None:
    """Why flags of one audit were given to the other (``--corpus`` without ``--realism``, ``--sim`` with it), or
    None: a flag that would be ignored is a usage error."""
    mode, other = ("--realism", "diversity") if args.realism else ("the diversity audit", "realism")
    given = [a.option_strings[0] for a in args.mode_flags[other] if getattr(args, a.dest) != a.default]
    if not given:
        return None
    return (f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} not used by {mode}"
            + ("" if args.realism else " (add --realism)"))


#: What ``simpop audit`` writes in ``--out`` (with ``--realism``: the last two). A folder holding anything else is
#: not an audit's, and is refused.
OUTPUTS = ("summary.json", "report.md", "realism.json", "realism.md")


def run(args: argparse.Namespace) -> int:
    """Run ``simpop audit`` with parsed arguments, holding ``--out``'s writer lock; returns the exit code."""
    from simpop.files import RUN_LOCK, run_lock
    from simpop.user_input import error_line

    wrong = misplaced_flags(args)
    if wrong:
        print(f"simpop audit: error: {wrong}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as held:
        try:  # one writer, and only an audit's folder: checked before the audit runs
            out = held.enter_context(run_lock(args.out))
            others = sorted(p.name for p in out.iterdir() if p.name not in (*OUTPUTS, RUN_LOCK))
            if others:
                raise ValueError(f"--out {args.out} holds files not written by simpop audit "
                                 f"({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}); choose a new or "
                                 f"empty --out")
        except (ValueError, OSError) as error:
            print(f"simpop audit: error: {error_line(error)}", file=sys.stderr)
            return 2
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.realism:
        return realism.run(args)
    try:
        histories = select_histories(args.histories)
        summary = audit(args.sim or list(DEFAULT_SIMULATORS), n=args.n, histories=histories, env_id=args.env,
                        scenario_id=args.scenario, seed=args.seed)
    except (ValueError, KeyError) as error:
        from simpop.user_input import error_line

        print(f"simpop audit: error: {error_line(error)}", file=sys.stderr)
        return 2
    out = write(summary, args.out)
    print(render_report(summary))
    print(f"wrote {out / 'summary.json'} and {out / 'report.md'}")
    return 0


def select_histories(names: str) -> list[History]:
    """``'all'`` or comma-separated ids -> histories (unknown ids raise, listing the valid ones)."""
    if names == "all":
        return list(HISTORIES)
    by_id = {h.id: h for h in HISTORIES}
    unknown = [name for name in names.split(",") if name not in by_id]
    if unknown:
        raise ValueError(f"--histories: unknown id(s) {', '.join(unknown)}; valid: {', '.join(by_id)}")
    return [by_id[name] for name in names.split(",")]
