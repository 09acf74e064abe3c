"""The simulator-collapse experiment on Persuasion-for-Good (DESIGN.md §4; ``simpop experiment collapse``).

The same policy is trained with GRPO, with equal budgets (updates x dialogues per update) and the
same seeds, under four conditions, and every ``eval_every`` updates it is evaluated on the *same*
held-out panel (and on its own training simulator(s)):

1. ``frozen`` — one frozen simulator: the mode-collapsed version of the persona population the
   training scenarios are drawn from, i.e. the population's **modal persona** (every attribute at the
   mode of its marginal, :func:`~simpop.envs.persuasion.personas.modal_persona`) with **greedy
   decoding** (every reply the argmax of the model). Act level: the native persuadee
   (:class:`~simpop.envs.persuasion.simulators.ActPersuadee`, calibrated default parameters); text level:
   the LLM (:class:`~simpop.simulators.llm.LLMSimulator`, temperature 0) playing the modal persona.
   No other quirk is added.
2. ``verbalized`` — verbalized sampling over the training persona set (each dialogue plays its
   scenario's persona). Act level: the native model states its full reply distribution and one reply is
   sampled from ``renormalise(p, floor, tau)`` (:func:`simpop.simulators.verbalized.renormalise`,
   defaults floor 0.01, tau 1.0); text level: :class:`~simpop.simulators.verbalized.VerbalizedSimulator`
   (the LLM lists k=5 replies with probabilities as JSON; the same renormalisation; malformed answers
   fall back to plain sampling and are counted).
3. ``cotrain`` — one trainable simulator starting from the same base simulator (act level: the
   calibrated native persuadee's 373 parameters, sampled at temperature 1; text level: a LoRA adapter on
   the LLM, temperature 1), over the training persona set, updated on the same rollouts as the policy
   towards batch success 0.5 with a KL anchor to the base (:mod:`simpop.train.cotrain`).
4. ``population`` — population co-training: ``population_size`` such trainable simulators (act level:
   K parameter vectors; text level: K LoRA adapters on one base model) plus a checkpoint pool of their
   snapshots sampled with probability ``pool_sample_prob``.

**Held-out panel** (shared by every condition and seed): three simulators that differ from every
training simulator in persona, decoding and model (checked by :meth:`Panel.check_disjoint`):

- persona: ``heldout_personas`` personas drawn from the same sampler with another seed (none of them
  is a training persona; training sees the env's scenario personas, or the modal one);
- decoding: sampled at temperatures 0.8, 0.9 and 1.2 (training simulators are greedy or at 1.0);
- model: persuadee parameter sets that training never uses: the act effects, persona modulations and
  trait weights of the base model each multiplied by ``exp(N(0, 0.35²))`` (seeded per member), then the
  intercept and amount shift recalibrated (:func:`~simpop.envs.persuasion.model.calibrate`) so that a
  corpus-like persuader still gets the corpus donor rate on the held-out personas: other people who
  give as often but respond to different strategies. At text level the panel is the same three models
  realised as text (:class:`~simpop.envs.persuasion.simulators.TextPersuadee`) plus the LLM sampled at
  :data:`TEXT_PANEL_LLM_TEMPERATURES` playing the held-out personas: it is the training simulators' model
  (the one embedded LLM), so it is held out by persona and decoding only (``shared_model`` in
  :meth:`Panel.check_disjoint`).

**Other panels.** At the act level every evaluation also runs a *robustness panel* built by another procedure
(:func:`robust_panel_specs`: strategy effects permuted rather than jittered, personas with uniform attributes,
temperatures 0.7, 1.1, 1.5), the **human-fitted panel** ``human_panel`` (default ``p4g-act-human-v1``: persuadees
fitted to the public P4G corpus, shipped; ``none`` leaves it out, as reports before it had), and with
``corpus_panel`` a panel of persuadees fitted to a P4G corpus folder (:func:`corpus_panel_specs`). None of them is
used to choose anything. At the act level the last evaluation also scores each run's training simulator(s) with the
realism index (:mod:`simpop.evaluation.realism`, ``realism_index``): how far from people the simulator trained
against is.

**Simulator choice.** Three more conditions (not run by default) vary how the training simulator is chosen, with the
same budget: ``prioritised`` is population co-training whose members and pool drive dialogues by the
failure-prioritised rule (:attr:`~simpop.train.cotrain.CoTrainConfig.draw_rule`: the ones the policy loses to
drive more); ``rotation`` (act level) is GRPO against the frozen, verbalized and plain sampled persuadees taking turns
every :data:`~simpop.experiments.conditions.ROTATE_EVERY` updates; ``failure`` (act level) is
:mod:`simpop.experiments.adaptive`'s failure-driven pool, whose probe dialogues count in its cost. Every evaluation
records the run's CPU seconds per update so far (``cpu_s_per_update``, evaluations excluded): the cost of a condition.

**Objective ablations.** ``cotrain+<objective>`` and ``population+<objective>`` are conditions too: the same
co-training with another :attr:`~simpop.train.cotrain.CoTrainConfig.objective` (:func:`condition_cotrain`), paired
by seed with their base condition in the report's ablation table.

**Text level** (``--level text``, ``simpop/Persuasion-v1``: every dialogue ends with an outcome, stated or
from the closing survey): a preset sized for about an hour on two CPU cores (16 updates of 4 x 4 dialogues,
2 persuader turns, evaluations of 16 dialogues per member at updates 0, 8 and 16, frozen and verbalized; one
seed, so CIs are bootstraps over dialogues and updates). The policy is SmolLM2 with LoRA (bf16 weights where
the CPU has bf16 instructions, prefix cache on).

Outputs in ``out``: ``metrics.jsonl`` (every update's training metrics and every evaluation, tagged
with condition and seed), ``summary.json``, ``report.md`` (tables and claim verdicts computed from the
data by :mod:`simpop.experiments.collapse_report`) and PNG plots. Every (condition, seed) run keeps its own
folder under ``out/runs`` with atomic checkpoints; ``resume`` continues each from its last checkpoint
and skips finished runs. ``report_to`` (``--report-to``) logs every run and the plots to experiment trackers.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simpop.experiments.conditions import (COTRAINED, CORPUS_PANEL_TEMPERATURES, GROW_EVERY, PANEL_JITTER,
                                           PANEL_TEMPERATURES, ROBUST_PANEL_TEMPERATURES, ROTATE_EVERY,
                                           TEXT_PANEL_LLM_TEMPERATURES, CollapseConfig, build_panel, build_trainer,
                                           condition_cotrain, evaluate_run, extra_panels, one_server,
                                           shared_model_members, simulator_backends, simulator_specs, write_card)
from simpop.experiments.runs import (finished_evaluations, merge_records, run_experiment, run_folder, train_run,
                                     write_report)
from simpop.train.config import to_dict
from simpop.train.cotrain import CoTrainConfig

#: Dialogues the training simulator plays for its realism index at the last evaluation (act level).
REALISM_EPISODES = 128

def run_one(config: CollapseConfig, condition: str, seed: int, out: Path, resume: bool,
            report: Callable[[str, int, int, dict[str, float]], None] | None = None,
            report_to: str = "none") -> Path:
    """Train and evaluate one (condition, seed) with :func:`~simpop.experiments.runs.train_run`; returns its run folder.

    With ``resume``, continue from the run's newest checkpoint (a finished run is left as it is). ``report_to``:
    the run's experiment trackers (:mod:`simpop.evaluation.trackers`), named ``<condition>/seed<k>`` in the group
    named after ``out``.
    """
    from simpop.agents.vllm_backend import on_policy_server
    from simpop.envs.registration import make
    from simpop.evaluation.panel import EnvPool, evaluate

    write_card(run_folder(out, condition, seed), config, condition, seed)

    def start(env: Any) -> tuple[Any, dict[str, Any]]:
        backends = simulator_backends(config)  # one copy of the simulators' model for training and the panel
        trainer = build_trainer(condition, config, seed, env, backends)
        backends = on_policy_server(backends, trainer.policy)  # the panels' LLM members generate there too
        panel = build_panel(config, env, backends)
        panel.check_disjoint([trainer.training_simulator], shared_model=shared_model_members(config), strict=True)
        extras = {name: build_panel(config, env, backends, name) for name in extra_panels(config)}
        for extra in extras.values():
            extra.check_disjoint([trainer.training_simulator], strict=True)
        eval_seed = 1_000_003 + seed  # the same dialogues at every evaluation, for every condition
        pool = EnvPool(lambda: make(config.env_id, **config.env_kwargs()))  # one set of envs for every evaluation
        cost = Cost()

        def evaluation(step: int) -> dict[str, Any]:
            cost.pause()
            record, held, train = evaluate_run(config.env_id, trainer, panel, config.eval_episodes, eval_seed,
                                               config.env_kwargs(), pool)
            # per dialogue, in a fixed order (the same scenarios and seeds at every evaluation)
            record = {**record, "heldout_outcomes": [int(s) for s in held.outcomes],
                      "train_outcomes": [int(s) for s in train.outcomes]}
            for name, extra in extras.items():
                result = evaluate(config.env_id, trainer.policy, extra, config.eval_episodes, eval_seed,
                                  config.env_kwargs(), pool=pool, records=False)
                record.update({f"{name}_success": result.success,
                               f"{name}_outcomes": [int(s) for s in result.outcomes],
                               **{f"{name}/{k}": v for k, v in result.per_member.items()}})
            if step == config.updates and config.level == "act":  # after training: nothing later depends on it
                record.update(training_realism(trainer.training_simulator, eval_seed))
            return {**record, **cost.resume()}

        def observe(step: int, record: dict[str, Any]) -> None:
            cost.observe(record)
            if report is not None:
                report(condition, seed, step, record)

        return trainer, {"evaluate": evaluation, "report": observe}

    # Act level: tiny matrices, where extra threads only spin (and crawl on a busy machine).
    threads = config.threads or (1 if config.level == "act" else None)
    return train_run(config, condition, seed, out, resume, threads, start, report_to=report_to)


class Cost:
    """CPU seconds of this process per update, evaluations excluded (CPU time: other processes on a shared machine
    do not inflate it), over the updates this process ran (a resumed run: those since its checkpoint)."""

    def __init__(self) -> None:
        self.spent, self.updates, self.since = 0.0, 0, time.process_time()

    def observe(self, record: dict[str, Any]) -> None:
        """Count an update (a ``train`` record of the loop)."""
        self.updates += record.get("kind") == "train"

    def pause(self) -> None:
        """An evaluation begins: stop the clock."""
        self.spent += time.process_time() - self.since

    def resume(self) -> dict[str, float]:
        """An evaluation ends: start the clock again; the cost so far (NaN before any update)."""
        self.since = time.process_time()
        return {"cpu_s_per_update": self.spent / self.updates if self.updates else math.nan}


def training_realism(simulator: Any, seed: int) -> dict[str, Any]:
    """The realism index of a run's training simulator(s) against the shipped people's statistics (act level)."""
    from simpop.evaluation.realism import conversations_of, score, shipped_reference

    result = score(conversations_of(simulator, "act", REALISM_EPISODES, seed), shipped_reference(), "act",
                   seed=seed)
    return {"realism_index": result.index, "realism_ci": list(result.ci)}


# ============================================================================================ summary

def summarise(records: Sequence[dict[str, Any]], config: CollapseConfig, descriptions: dict[str, str],
              wall_time_s: float) -> dict[str, Any]:
    """``summary.json``: per condition, final and initial values with mean and 95% CI over seeds."""
    from simpop.experiments.collapse_report import collapse_curve, judge_claims, judged, stat

    conditions: dict[str, Any] = {}
    for condition in config.conditions:
        values: dict[str, list[float]] = {}
        units: dict[str, list[list[float]] | None] = {}  # one seed: the dialogues / updates inside it
        for seed in config.seed_list:
            evals, trains = finished_evaluations(records, condition, seed, config.updates)
            first, last = evals[0], evals[-1]
            row = {"train_success": last["train_success"], "heldout_success": last["heldout_success"],
                   "collapse_gap": last["collapse_gap"], "policy_entropy": last["policy_entropy"],
                   "zero_var_frac": float(np.mean([r["zero_var_frac"] for r in trains])),
                   "initial_train_success": first["train_success"],
                   "initial_heldout_success": first["heldout_success"],
                   "initial_policy_entropy": first["policy_entropy"],
                   "train_rise": _rise([r["success"] for r in trains]),
                   "late_change": late_change([r["success"] for r in trains])}
            for name in extra_panels(config):
                row.update({f"{name}_success": last[f"{name}_success"],
                            f"initial_{name}_success": first[f"{name}_success"]})
            for key in ("realism_index", "cpu_s_per_update"):  # absent from runs made before they were recorded
                if key in last:
                    row[key] = last[key]
            for key, value in row.items():
                values.setdefault(key, []).append(float(value))
            units = {"train_success": [last.get("train_outcomes")], "heldout_success": [last.get("heldout_outcomes")],
                     **{f"{name}_success": [last.get(f"{name}_outcomes")] for name in extra_panels(config)},
                     "collapse_gap": [last.get("train_outcomes"), last.get("heldout_outcomes")],
                     "initial_train_success": [first.get("train_outcomes")],
                     "initial_heldout_success": [first.get("heldout_outcomes")],
                     "zero_var_frac": [[r["zero_var_frac"] for r in trains]],
                     "train_rise": _halves([r["success"] for r in trains])}
        gap = lambda a, b: float(a.mean() - b.mean())  # noqa: E731 - the difference of two samples' means
        metrics = {}
        for key, v in values.items():
            samples = units.get(key) if len(config.seed_list) == 1 else None
            samples = samples if samples is not None and all(u is not None for u in samples) else None
            metrics[key] = stat(v, samples, gap if key in ("collapse_gap", "train_rise") else None)
        conditions[condition] = {"description": descriptions[condition], "metrics": metrics}
    summary = {
        "setup": {"level": config.level, "env_id": config.env_id, "seeds": config.seed_list, "updates": config.updates,
                  "batch_size": config.grpo.batch_size, "eval_every": config.eval_every,
                  "eval_episodes": config.eval_episodes, **panel_descriptions(config), "config": to_dict(config)},
        "wall_time_s": wall_time_s,
        "conditions": conditions,
    }
    if judged(conditions):
        summary["claims"] = [v.to_dict() for v in judge_claims(conditions)]
    if "frozen" in conditions:
        summary["curve"] = collapse_curve(records, "frozen")
    return summary


def _halves(values: Sequence[float]) -> list[list[float]]:
    """The second half and the first half of a run's per-update values (an odd middle one in neither)."""
    half = len(values) // 2
    return [list(values[len(values) - half:]), list(values[:half])]


def late_change(values: Sequence[float]) -> float:
    """Convergence check of a run's per-update training success: the mean over its last 10% of updates minus the
    mean over the 10% before (|change| <= :data:`~simpop.experiments.collapse_report.CONVERGED_CHANGE`: flat)."""
    tenth = max(1, len(values) // 10)
    if len(values) < 2 * tenth or not values:
        return math.nan
    return float(np.mean(values[-tenth:]) - np.mean(values[-2 * tenth:-tenth]))


def _rise(values: Sequence[float]) -> float:
    """Mean of the second half of ``values`` minus the mean of the first half (0 with fewer than two)."""
    late, early = _halves(values)
    return float(np.mean(late) - np.mean(early)) if early else 0.0


def panel_descriptions(config: CollapseConfig) -> dict[str, str | None]:
    """The panels, for the report: ``panel`` (held-out), ``robust_panel``, ``human_panel`` and ``corpus_panel`` (None:
    not evaluated)."""
    from simpop.evaluation.panels import panel_definition

    def temperatures(values: Sequence[float]) -> str:
        return ", ".join(f"{t:g}" for t in values)

    held = ("three native persuadee models training never uses (base act effects, modulations and trait "
            f"weights jittered by exp(N(0, {PANEL_JITTER}^2)), recalibrated to the corpus donor rate), "
            f"sampled at temperatures {temperatures(PANEL_TEMPERATURES)}, each playing personas drawn from the persona "
            "sampler with a held-out seed (no training persona among them)")
    if config.level == "text":
        held += (f"; realised as text, plus LLM {config.sim_model or config.model.model} sampled at temperature "
                 f"{temperatures(TEXT_PANEL_LLM_TEMPERATURES)} playing the same held-out personas (the training "
                 "simulators' model: held out by persona and decoding only)")
    return {
        "panel": held,
        "robust_panel": "three native persuadee models whose persuasive strategies' effects and persona modulations "
                        "are permuted among the strategies (which strategy works is reassigned, not perturbed), "
                        "recalibrated to the corpus donor rate, sampled at temperatures "
                        f"{temperatures(ROBUST_PANEL_TEMPERATURES)}, playing {config.heldout_personas} personas whose "
                        "every attribute is uniform over its values (not the population sampler's marginals): built "
                        "by another procedure than the held-out panel" if config.robust_panel else None,
        "human_panel": f"`{config.human_panel}`: {panel_definition(config.human_panel).description}"
                       if config.human_panel != "none" else None,
        "corpus_panel": "three native persuadee models fitted to bootstrap resamples of the P4G corpus in "
                        f"{config.corpus_panel} (response acts from its annotated dialogues, strategy effects by "
                        "logistic regression, calibrated to the resample's donor rate and mean donation), sampled at "
                        f"temperatures {temperatures(CORPUS_PANEL_TEMPERATURES)}, playing the corpus's real persuadees"
                        if config.corpus_panel else None,
    }


def descriptions(config: CollapseConfig) -> dict[str, str]:
    """How each condition's training simulator is built, for the report."""
    base = _base_descriptions(config)
    out = {}
    for condition in config.conditions:
        name, _, objective = condition.partition("+")
        text = base[name]
        if name in COTRAINED:
            text += "; " + _objective_description(condition_cotrain(condition, config.cotrain))
        out[condition] = text
    return out


def _objective_description(co: CoTrainConfig) -> str:
    """The simulators' objective in words (:mod:`simpop.train.cotrain` defines them)."""
    return {
        "target": "objective target",
        "persona": "objective persona: the same outcome term on the persona sampler's logits (which personas it "
                   "plays), its reply model fixed",
        "realism": f"objective realism: target plus {co.realism_coef:g} x the NLL of the reference corpus's persuadee "
                   f"acts given its persuader acts ({co.reference_data})",
        "adversarial": f"objective adversarial: lowers the policy's success, plus {co.realism_coef:g} x the reference "
                       f"corpus NLL ({co.reference_data})",
        "diverse": f"objective diverse: target minus {co.diversity_coef:g} x the mean KL between members' reply "
                   f"distributions; a full pool drops its {co.pool_prune} snapshot",
    }[co.objective]


def _base_descriptions(config: CollapseConfig) -> dict[str, str]:
    co = config.cotrain
    if config.level == "act":
        base = "the native act-level persuadee (calibrated default parameters)"
        return {
            "frozen": f"{base} playing the modal persona of the persona sampler with greedy decoding (every reply "
                      "its argmax)",
            "verbalized": f"{base} stating its full reply distribution; one reply sampled from renormalise(p, "
                          f"floor={config.verbalized_floor:g}, tau={config.verbalized_tau:g}); each dialogue plays "
                          "its scenario's persona (the training persona set)",
            "cotrain": f"{base} with all 373 parameters trainable, sampled at temperature 1 over the training persona "
                       f"set, updated on the policy's rollouts towards batch success {co.target_success:g} with "
                       f"KL anchor {co.sim_kl_coef:g} to the base (lr {co.sim_lr:g})",
            "population": f"{co.population_size} such trainable persuadees (same base) plus a checkpoint pool of "
                          f"their last {co.pool_size} snapshots (every {co.snapshot_every} updates), the pool "
                          f"driving {co.pool_sample_prob:.0%} of dialogues",
            "prioritised": f"population co-training ({co.population_size} trainable persuadees, pool of "
                           f"{co.pool_size}) whose members and pool drive dialogues by the failure-prioritised rule: "
                           f"the population's weights times each one's recent failure rate against the policy",
            "rotation": f"the frozen, verbalized and plain sampled (temperature 1, scenario personas) persuadees "
                        f"taking turns, the next every {ROTATE_EVERY} updates",
            "failure": f"the failure-driven pool: {base} sampled over the scenario personas, grown every "
                       f"{GROW_EVERY} updates with persuadees over the persona regions the policy "
                       "lost on the probe panel, reweighted and pruned (simpop experiment adaptive; probe "
                       "dialogues count in its cost)",
        }
    model = config.sim_model or config.model.model
    return {
        "frozen": f"LLM {model} playing the modal persona with greedy decoding",
        "verbalized": f"LLM {model} asked for k={config.verbalized_k} replies with probabilities (JSON), renormalised "
                      f"(floor {config.verbalized_floor:g}, tau {config.verbalized_tau:g}) and sampled; scenario personas",
        "cotrain": f"LLM {model} with a LoRA adapter, temperature 1, trained towards batch success "
                   f"{co.target_success:g} with KL {co.sim_kl_coef:g} to the base model",
        "population": f"{co.population_size} LoRA adapters on one {model} base plus a pool of {co.pool_size} "
                      f"snapshots ({co.pool_sample_prob:.0%} of dialogues)",
        "prioritised": f"{co.population_size} LoRA adapters on one {model} base plus a pool of {co.pool_size} "
                       "snapshots, chosen by the failure-prioritised rule",
    }


def write_outputs(out: Path, config: CollapseConfig, wall_time_s: float, report_to: str = "none") -> Path:
    """Merge run metrics into ``metrics.jsonl``; write ``summary.json``, plots and ``report.md``; log the plots to
    the trackers ``report_to`` names (:func:`simpop.evaluation.trackers.log_report`)."""
    from simpop.experiments.collapse_report import judge_claims, judged, plot_curves, plot_per_seed, render_report

    records = merge_records(out, config)
    summary = summarise(records, config, descriptions(config), wall_time_s)
    plots = plot_curves(records, out, order=config.conditions) + plot_per_seed(records, out, order=config.conditions)
    verdicts = judge_claims(summary["conditions"]) if judged(summary["conditions"]) else []
    return write_report(out, config, summary, render_report(summary, verdicts, [str(p) for p in plots]), plots,
                        report_to)


# ============================================================================================ driver
def run_collapse(config: CollapseConfig, out: str | Path, resume: bool = False, progress: bool = True,
                 report_to: str = "none") -> Path:
    """Run every (condition, seed) (in ``config.workers`` processes), then write the outputs; the report's path.
    ``report_to``: the experiment trackers of every run and of the report's plots (:mod:`simpop.evaluation.trackers`).

    Raises:
        FileExistsError: ``out`` holds an earlier run and ``resume`` is False.
    """
    # runs saved before the human-fitted panel existed had none: resuming them needs --human-panel none
    earlier = dataclasses.replace(CollapseConfig(level=config.level), human_panel="none")
    # Runs that co-train more simulators take longer: they start first, so that the last to finish are short.
    out, wall_time_s = run_experiment(
        run_one, config, out, resume, earlier, progress, report_to,
        order=lambda task: -len(simulator_specs(task[0], config)) * (task[0].partition("+")[0] in COTRAINED),
        runs=one_server(config))  # --model.generator vllm:launch: one server for every run
    return write_outputs(out, config, wall_time_s, report_to)
