"""``simpop experiment adaptive``: a fixed random pool vs a failure-driven pool vs population co-training.

The act-level P4G policy (``simpop/PersuasionAct-v0``) is trained with GRPO, equal policy budgets (updates x
dialogues per update) and the same seeds, under three conditions, and evaluated every ``eval_every`` updates
on the collapse experiment's held-out panel (:func:`simpop.experiments.conditions.panel_specs`: three jittered
persuadee models at temperatures 0.8/0.9/1.2 playing held-out personas):

1. ``fixed`` — a pool fixed at the start: the base persuadee over the scenario personas plus ``cap - 1``
   persuadees over *random* persona regions (two numeric attributes, a random side of each marginal's mean,
   drawn with the run's seed, blind to the policy). Uniform sampling; contributions are recorded, never acted on.
2. ``failure`` — the failure-driven pool: starts with the base persuadee alone; every ``grow_every`` updates
   the policy plays the *probe panel* (two other jittered persuadee models, ``heldout-10`` and ``heldout-11``
   at temperature 1.1, over the scenario personas: never the held-out panel, so growth does not see the test),
   the lost dialogues' persona regions become up to ``grow_count`` new persuadees
   (:mod:`simpop.envs.persuasion.failures`), checked against the held-out panel
   (:func:`simpop.simulators.generation.generate`), and the pool is reweighted by each member's share of
   informative groups and pruned to ``cap`` (:class:`simpop.train.pool.PoolGrower`). Its probe dialogues are
   extra compute, reported in the compute curve.
3. ``population`` — population co-training, exactly the collapse experiment's ``population`` condition.
4. ``failure-keep-base`` (not run by default; defined *after* the first results, which showed pruning retire the
   base persuadee within 20 updates and the pool chase the newest failure regions) — ``failure`` with the base
   persuadee protected from pruning, so generated simulators complement the scenario population instead of
   replacing it.

Outputs in ``out``: ``runs/<condition>/seed<k>/`` (metrics, checkpoints; ``--resume`` continues them),
``metrics.jsonl``, ``summary.json``, ``report.md`` (final held-out success with 95% t-CIs over seeds, paired
comparisons, verdicts computed from the data) and plots (held-out success by update and by dialogues run,
pool size).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simpop.train.cotrain import CoTrainConfig
from simpop.train.grpo import GRPOConfig
from simpop.train.pool import PoolConfig
from simpop.validation import at_least_one, check_fields
from simpop.experiments.conditions import BASE_SPEC, GROW_EVERY, probe_specs
from simpop.experiments.runs import (Seeded, finished_evaluations, merge_records, run_experiment, run_folder,
                                     train_run, write_report)

CONDITIONS = ("fixed", "failure", "failure-keep-base", "population")
#: Run by default (failure-keep-base was added after the first results; see the module docstring).
DEFAULT_CONDITIONS = ("fixed", "failure", "population")
ENV_ID = "simpop/PersuasionAct-v0"


@dataclass(frozen=True)
class AdaptiveConfig(Seeded):
    """Settings of ``simpop experiment adaptive`` (flags are generated from these fields).

    Attributes:
        seeds: Seeds per condition (the same for every condition).
        first_seed: The first seed.
        conditions: A subset of fixed, failure, failure-keep-base, population (default: all but
            failure-keep-base).
        updates: Policy updates per run (the equal budget).
        eval_every: Updates between held-out evaluations (also at 0 and at the end).
        eval_episodes: Dialogues per held-out member (and on the training pool) per evaluation.
        grow_every: Updates between growth rounds of the failure-driven pool.
        max_turns: Persuader turns per dialogue.
        pool: Pool size cap, simulators added per round, probe dialogues per member, pruning thresholds
            (:class:`~simpop.train.pool.PoolConfig`); the fixed pool has ``cap`` members.
        grpo: The policy trainer (default: the collapse experiment's act level, 8 x 8 dialogues).
        cotrain: Population co-training (default: the collapse experiment's).
        heldout_personas: Size of the held-out panel's persona set.
        heldout_seed: Seed of the held-out personas and models.
        workers: Parallel processes over (condition, seed) runs.
        threads: Torch threads per run.
    """

    seeds: int = 3
    first_seed: int = 0
    conditions: tuple[str, ...] = DEFAULT_CONDITIONS
    updates: int = 60
    eval_every: int = 20
    eval_episodes: int = 32
    grow_every: int = GROW_EVERY
    max_turns: int = 10
    pool: PoolConfig | None = None
    grpo: GRPOConfig | None = None
    cotrain: CoTrainConfig | None = None
    heldout_personas: int = 300
    heldout_seed: int = 4242
    workers: int = 2
    threads: int = 1

    def __post_init__(self) -> None:
        check_fields(self)
        from simpop.experiments.conditions import default_cotrain, default_grpo
        from simpop.train.config import nested

        for key, cls, default in (("pool", PoolConfig, PoolConfig()), ("grpo", GRPOConfig, default_grpo("act")),
                                  ("cotrain", CoTrainConfig, default_cotrain("act"))):
            try:
                object.__setattr__(self, key, nested(getattr(self, key), cls, default))
            except (TypeError, ValueError) as error:
                raise ValueError(f"AdaptiveConfig: {key}: {error}") from None
        unknown = sorted(set(self.conditions) - set(CONDITIONS))
        if unknown or not self.conditions or len(set(self.conditions)) != len(self.conditions):
            raise ValueError(f"AdaptiveConfig: conditions must be distinct and from {', '.join(CONDITIONS)}; "
                             f"got {list(self.conditions)}")
        at_least_one(self, ("seeds", "updates", "eval_every", "eval_episodes", "grow_every", "max_turns", "workers",
                            "threads", "heldout_personas"))

    def collapse_config(self):
        """The collapse experiment's act-level config with this experiment's shared settings (panel, trainers)."""
        from simpop.experiments.conditions import CollapseConfig

        return CollapseConfig(level="act", seeds=1, updates=self.updates, eval_every=self.eval_every,
                              eval_episodes=self.eval_episodes, max_turns=self.max_turns, grpo=self.grpo,
                              cotrain=self.cotrain, heldout_personas=self.heldout_personas,
                              heldout_seed=self.heldout_seed, workers=1, threads=self.threads)


# ============================================================================================ specs
def random_region_specs(cap: int, seed: int) -> dict[str, str]:
    """The fixed pool: the base persuadee plus ``cap - 1`` persuadees over random persona regions (policy-blind)."""
    from simpop.envs.persuasion.personas import DEFAULT_MARGINALS, NUMERIC

    rng = np.random.default_rng([seed, 1616])
    specs = {"base": BASE_SPEC}
    for i in range(cap - 1):
        clauses = []
        for attr in rng.choice(len(NUMERIC), size=2, replace=False):
            name = NUMERIC[int(attr)]
            clauses.append(f"{name}{'<' if rng.random() < 0.5 else '>'}{round(DEFAULT_MARGINALS[name].mean, 2)}")
        text = ",".join(clauses)
        specs[f"random-{i}-{text}"] = f"{BASE_SPEC}&personas=region-64-{int(rng.integers(1 << 30))}:{text}"
    return specs


def initial_pool(config: AdaptiveConfig, condition: str, seed: int) -> dict[str, str]:
    """Name -> spec of a pool condition's first members (``fixed``: the whole pool)."""
    return random_region_specs(config.pool.cap, seed) if condition == "fixed" else {"base": BASE_SPEC}


def policy_configs(config: AdaptiveConfig, seed: int) -> tuple[Any, Any]:
    """The policy model and GRPO settings of one seed's pool runs (``population`` runs use the collapse ones)."""
    from simpop.agents.policy import ModelConfig

    return ModelConfig(), dataclasses.replace(config.grpo, seed=seed)


def write_card(run_dir: Path, config: AdaptiveConfig, condition: str, seed: int) -> None:
    """The run folder's ``config.yaml`` and ``run.json`` (:func:`simpop.train.loop.write_run_card`)."""
    from simpop.experiments import conditions
    from simpop.train.loop import write_run_card

    if condition == "population":
        conditions.write_card(run_dir, config.collapse_config(), condition, seed, experiment="adaptive")
        return
    write_run_card(run_dir, {"trainer": "adaptive-pool", "env": ENV_ID, "env_args": {"max_turns": config.max_turns},
                             "experiment": "adaptive", "condition": condition, "seed": seed,
                             "simulators": initial_pool(config, condition, seed)},
                   *policy_configs(config, seed))


def build_trainer(condition: str, config: AdaptiveConfig, seed: int, env: Any, heldout: Any):
    """The trainer of one condition and seed (``heldout``: the panel generated simulators must stay clear of):
    :func:`~simpop.experiments.conditions.pool_trainer` (growing for the failure conditions) or population
    co-training."""
    from simpop.agents.policy import build_policy
    from simpop.experiments import conditions

    if condition == "population":
        return conditions.build_trainer("population", config.collapse_config(), seed, env)
    model, grpo = policy_configs(config, seed)
    policy = build_policy(env, model, grpo.sampling(), seed)
    return conditions.pool_trainer(config.collapse_config(), seed, env, policy, grpo,
                                   initial_pool(config, condition, seed), f"{condition}-pool", heldout, config.pool,
                                   config.grow_every, {"base"} if condition == "failure-keep-base" else (),
                                   grow=condition.startswith("failure"))


def run_one(config: AdaptiveConfig, condition: str, seed: int, out: Path, resume: bool,
            report: Callable[[str, int, int, dict[str, Any]], None] | None = None, report_to: str = "none") -> Path:
    """Train and evaluate one (condition, seed) with :func:`~simpop.experiments.runs.train_run`; its run folder.
    ``report_to``: its experiment trackers (:mod:`simpop.evaluation.trackers`)."""
    from simpop.envs.registration import make
    from simpop.evaluation.panel import EnvPool
    from simpop.experiments import conditions

    write_card(run_folder(out, condition, seed), config, condition, seed)
    shared = config.collapse_config()

    def start(env: Any) -> tuple[Any, dict[str, Any]]:
        heldout = conditions.build_panel(shared, env)
        trainer = build_trainer(condition, config, seed, env, heldout)
        heldout.check_disjoint([trainer.training_simulator], strict=True)
        eval_seed = 1_000_003 + seed
        batch = config.grpo.batch_size
        envs = EnvPool(lambda: make(ENV_ID, **shared.env_kwargs()))  # one set of envs for every evaluation

        def evaluation(step: int) -> dict[str, Any]:
            record, _, _ = conditions.evaluate_run(ENV_ID, trainer, heldout, config.eval_episodes, eval_seed,
                                                 shared.env_kwargs(), envs)
            grower = getattr(trainer, "grower", None)
            probes = grower.probe_dialogues if grower is not None else 0
            pool = trainer.training_simulator
            size = len(getattr(pool, "members", [pool]))
            return {**record, "pool_size": size, "training_dialogues": step * batch, "probe_dialogues": probes,
                    "dialogues": step * batch + probes}

        return trainer, {"evaluate": evaluation}

    return train_run(shared, condition, seed, out, resume, config.threads, start, report, report_to)


# ============================================================================================ summary
def summarise(records: Sequence[dict[str, Any]], config: AdaptiveConfig, wall_time_s: float) -> dict[str, Any]:
    """Per condition: final held-out / training success, pool size, dialogues run (mean, 95% t-CI over seeds),
    and paired comparisons of held-out success (failure - fixed, failure - population)."""
    from simpop.evaluation.metrics import mean_ci
    from simpop.experiments.collapse_report import Comparison

    per_seed: dict[str, dict[str, list[float]]] = {}
    for condition in config.conditions:
        values: dict[str, list[float]] = {}
        for seed in config.seed_list:
            evals, _ = finished_evaluations(records, condition, seed, config.updates)
            last, first = evals[-1], evals[0]
            row = {"heldout_success": last["heldout_success"], "train_success": last["train_success"],
                   "initial_heldout_success": first["heldout_success"],
                   "heldout_gain": last["heldout_success"] - first["heldout_success"],
                   "pool_size": last["pool_size"], "dialogues": last["dialogues"]}
            for key, value in row.items():
                values.setdefault(key, []).append(float(value))
        per_seed[condition] = values
    conditions = {c: {k: dict(zip(("mean", "ci_low", "ci_high"), mean_ci(v)), per_seed=v)
                      for k, v in values.items()} for c, values in per_seed.items()}
    comparisons = []
    for a, b in (("failure", "fixed"), ("failure", "population"), ("fixed", "population"),
                 ("failure-keep-base", "fixed"), ("failure-keep-base", "failure")):
        if a in per_seed and b in per_seed:
            c = Comparison(f"held-out success: {a} - {b}", list(np.subtract(per_seed[a]["heldout_success"],
                                                                            per_seed[b]["heldout_success"])))
            comparisons.append(dataclasses.asdict(c))
    return {"setup": {"env_id": ENV_ID, "seeds": config.seed_list, "updates": config.updates,
                      "batch_size": config.grpo.batch_size, "eval_every": config.eval_every,
                      "eval_episodes": config.eval_episodes, "grow_every": config.grow_every,
                      "pool": dataclasses.asdict(config.pool), "probe": probe_specs()},
            "wall_time_s": wall_time_s, "conditions": conditions, "comparisons": comparisons,
            "growth": growth_log(records)}


def growth_log(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per failure-driven growth round: condition, seed, update, pool size and members, what was added and retired."""
    return [{k: r.get(k) for k in ("condition", "seed", "step", "pool_size", "pool_members", "pool_removed_names",
                                  "pool_added_specs")}
            for r in records if r["condition"].startswith("failure") and r["kind"] == "train" and "pool_added" in r]


def render_report(summary: dict[str, Any], plots: Sequence[Path]) -> str:
    """``report.md``: setup, the table, paired comparisons with verdicts, plots."""
    from simpop.experiments.collapse_report import cell

    setup = summary["setup"]
    columns = {"heldout_success": "held-out success", "initial_heldout_success": "initial held-out",
               "heldout_gain": "held-out gain", "train_success": "training-pool success",
               "pool_size": "final pool size",
               "dialogues": "dialogues run (training + probe)"}
    lines = ["# Adaptive pools on P4G (act level)", "",
             f"`{setup['env_id']}`; seeds {setup['seeds']}; {setup['updates']} updates of {setup['batch_size']} "
             f"dialogues per condition (equal policy budget); held-out evaluation every {setup['eval_every']} "
             f"updates, {setup['eval_episodes']} dialogues per held-out member. Failure-driven growth every "
             f"{setup['grow_every']} updates (pool cap {setup['pool']['cap']}, up to {setup['pool']['grow_count']} "
             f"added per round, {setup['pool']['probe_episodes']} probe dialogues per probe member). Wall time "
             f"{summary['wall_time_s']:.0f} s. Values: mean [95% Student-t CI over seeds], final evaluation.", "",
             "| condition | " + " | ".join(columns.values()) + " |", "|" + "---|" * (len(columns) + 1)]
    for name, cond in summary["conditions"].items():
        lines.append(f"| {name} | " + " | ".join(cell(cond[k], 1 if k in ("pool_size", "dialogues") else 3)
                                                 for k in columns) + " |")
    lines += ["", "## Paired comparisons (by seed)", "", "| comparison | mean | 95% CI | verdict |",
              "|---|---|---|---|"]
    for c in summary["comparisons"]:
        lines.append(f"| {c['label']} | {c['mean']:+.3f} | [{c['ci_low']:+.3f}, {c['ci_high']:+.3f}] | "
                     f"{verdict(c)} |")
    lines += ["", "A verdict says *better* or *worse* only when the CI excludes 0; otherwise *no detectable "
                  "difference* at this number of seeds.", "", "## Plots", ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(lines) + "\n"


def verdict(comparison: dict[str, Any]) -> str:
    """``better`` / ``worse`` when the CI excludes 0, else ``no detectable difference`` (one seed: no CI)."""
    if len(comparison["differences"]) < 2:
        return "one seed: no CI, no verdict"
    if comparison["ci_low"] > 0:
        return "better"
    if comparison["ci_high"] < 0:
        return "worse"
    return "no detectable difference"


def plot(records: Sequence[dict[str, Any]], out: Path, order: Sequence[str]) -> list[Path]:
    """Held-out success by update and by dialogues run, and pool size by update (mean, 95% CI over seeds)."""
    from simpop.experiments.collapse_report import PLOTS, figure, plot_curves, save

    paths = plot_curves(records, out, order, plots=(
        PLOTS[0], ("pool_size", "eval", "pool_size", "training pool size", (0.0, None))))
    # compute curve: held-out success against all dialogues run (training + probe), mean over seeds
    fig, ax = figure(figsize=(6.4, 4.0))
    for name in order:
        evals = [r for r in records if r["condition"] == name and r["kind"] == "eval"]
        steps = sorted({r["step"] for r in evals})
        if steps:
            ax.plot([np.mean([r["dialogues"] for r in evals if r["step"] == s]) for s in steps],
                    [np.mean([r["heldout_success"] for r in evals if r["step"] == s]) for s in steps],
                    marker="o", label=name)
    ax.set_xlabel("dialogues run (training + probe)")
    ax.set_ylabel("held-out panel success")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return [*paths, save(fig, out / "compute.png")]


def write_outputs(out: Path, config: AdaptiveConfig, wall_time_s: float, report_to: str = "none") -> Path:
    """Write the experiment's ``metrics.jsonl``, ``summary.json``, report and plots into ``out`` and log the plots to
    the trackers ``report_to`` names; returns the report's path.
    """
    records = merge_records(out, config)
    summary = summarise(records, config, wall_time_s)
    plots = plot(records, out, config.conditions)
    return write_report(out, config, summary, render_report(summary, plots), plots, report_to)


# ============================================================================================ driver
def run_adaptive(config: AdaptiveConfig, out: str | Path, resume: bool = False, progress: bool = True,
                 report_to: str = "none") -> Path:
    """Run every (condition, seed) in ``config.workers`` processes, then write the outputs; the report's path.
    ``report_to``: the experiment trackers of every run and of the plots (:mod:`simpop.evaluation.trackers`)."""
    out, wall_time_s = run_experiment(run_one, config, out, resume, AdaptiveConfig(), progress, report_to)
    return write_outputs(out, config, wall_time_s, report_to)
