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
  realised as text (:class:`~simpop.envs.persuasion.simulators.TextPersuadee`).

Outputs in ``out``: ``metrics.jsonl`` (every update's training metrics and every evaluation, tagged
with condition and seed), ``summary.json``, ``report.md`` (tables and claim verdicts computed from the
data by :mod:`simpop.evaluation.report`) and PNG plots. Every (condition, seed) run keeps its own
folder under ``out/runs`` with atomic checkpoints; ``resume`` continues each from its last checkpoint
and skips finished runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

CONDITIONS = ("frozen", "verbalized", "cotrain", "population")
PANEL_TEMPERATURES = (0.8, 0.9, 1.2)
#: Spread (log-scale sd) of the held-out models' parameter jitter.
PANEL_JITTER = 0.35
ENV_IDS = {"act": "simpop/PersuasionAct-v0", "text": "simpop/Persuasion-v0"}
#: Defaults that depend on the level (fields left at None take these).
LEVEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "act": {"seeds": 5, "updates": 200, "group_size": 8, "scenarios_per_update": 8, "eval_every": 20,
            "eval_episodes": 64, "max_turns": 10, "workers": 2},
    "text": {"seeds": 1, "updates": 2, "group_size": 2, "scenarios_per_update": 2, "eval_every": 1,
             "eval_episodes": 2, "max_turns": 2, "workers": 1},
}


@dataclass(frozen=True)
class CollapseConfig:
    """Settings of ``simpop experiment collapse`` (flags are generated from these fields).

    Attributes:
        level: ``act`` (P4G dialogue acts, minutes on a CPU) or ``text`` (free text with LLMs).
        seeds: Seeds per condition (the same seeds for every condition); None: act 5, text 1.
        first_seed: The first seed; seeds are ``first_seed .. first_seed + seeds - 1``.
        conditions: Conditions to run, a subset of frozen, verbalized, cotrain, population.
        updates: Policy updates per run (the equal budget); None: act 200, text 2.
        group_size: GRPO dialogues per scenario; None: act 8, text 2.
        scenarios_per_update: GRPO groups per update; None: act 8, text 2.
        eval_every: Updates between evaluations (also at 0 and at the end); None: act 20, text 1.
        eval_episodes: Dialogues per panel member and on the training simulator per evaluation; None:
            act 64, text 2.
        max_turns: Persuader turns per dialogue; None: act 10, text 2.
        policy_lr: Policy learning rate; None uses GRPO's default for the level.
        hidden_size: Width of the act-level policy's hidden layers.
        population_size: Trainable simulators in population co-training (K).
        pool_size: Snapshots kept in population co-training's checkpoint pool.
        pool_sample_prob: Share of population co-training dialogues driven by the pool.
        snapshot_every: Updates between snapshots into the pool.
        sim_lr: Learning rate of co-trained simulators; None: act 0.05, text 1e-4.
        sim_kl_coef: KL-anchor weight of co-trained simulators.
        target_success: Batch success co-trained simulators steer towards.
        verbalized_tau: Temperature of the verbalized renormalisation.
        verbalized_floor: Probability floor of the verbalized renormalisation.
        verbalized_k: Candidates the text-level verbalized simulator is asked for.
        heldout_personas: Size of the held-out panel's persona set.
        heldout_seed: Seed of the held-out personas and models.
        model: Text level: the policy model (embedded name or local HF folder).
        sim_model: Text level: the simulators' model (backend spec; co-training needs an in-process
            transformers model); None: the same as ``model``.
        max_new_tokens: Text level: tokens per policy and simulator turn.
        dtype: Text level: ``float32`` or ``bfloat16``.
        workers: Parallel processes over (condition, seed) runs; None: act 2, text 1.
        threads: Torch threads per run; None: 1 at the act level (tiny matrices), torch's default at the
            text level. On a busy CPU, 1 avoids threads spinning against each other.
    """

    level: Literal["act", "text"] = "act"
    seeds: int | None = None
    first_seed: int = 0
    conditions: tuple[str, ...] = CONDITIONS
    updates: int | None = None
    group_size: int | None = None
    scenarios_per_update: int | None = None
    eval_every: int | None = None
    eval_episodes: int | None = None
    max_turns: int | None = None
    policy_lr: float | None = None
    hidden_size: int = 64
    population_size: int = 3
    pool_size: int = 5
    pool_sample_prob: float = 0.25
    snapshot_every: int = 10
    sim_lr: float | None = None
    sim_kl_coef: float = 0.1
    target_success: float = 0.5
    verbalized_tau: float = 1.0
    verbalized_floor: float = 0.01
    verbalized_k: int = 5
    heldout_personas: int = 300
    heldout_seed: int = 4242
    model: str = "smollm2"
    sim_model: str | None = None
    max_new_tokens: int = 24
    dtype: str = "float32"
    workers: int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"CollapseConfig: {message}")

        need(self.level in LEVEL_DEFAULTS, f"level must be 'act' or 'text', got {self.level!r}")
        for key, value in LEVEL_DEFAULTS[self.level].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        if self.sim_lr is None:
            object.__setattr__(self, "sim_lr", 0.05 if self.level == "act" else 1e-4)
        unknown = sorted(set(self.conditions) - set(CONDITIONS))
        need(not unknown and len(self.conditions) > 0,
             f"conditions must be a non-empty subset of {', '.join(CONDITIONS)}; unknown: {unknown}")
        need(len(set(self.conditions)) == len(self.conditions), "conditions must not repeat")
        for key in ("seeds", "updates", "group_size", "scenarios_per_update", "eval_every", "eval_episodes",
                    "max_turns", "population_size", "pool_size", "snapshot_every", "heldout_personas",
                    "max_new_tokens", "workers", "verbalized_k", "hidden_size"):
            need(getattr(self, key) >= 1, f"{key} must be >= 1, got {getattr(self, key)}")
        need(self.group_size >= 2, f"group_size must be >= 2 (GRPO compares dialogues), got {self.group_size}")
        need(0 < self.pool_sample_prob < 1, f"pool_sample_prob must be in (0, 1), got {self.pool_sample_prob}")
        need(self.verbalized_tau > 0 and 0 <= self.verbalized_floor < 1,
             f"verbalized_tau must be > 0 and verbalized_floor in [0, 1); got {self.verbalized_tau}, "
             f"{self.verbalized_floor}")
        need(self.dtype in ("float32", "bfloat16"), f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        need(self.threads is None or self.threads >= 1, f"threads must be >= 1 or None, got {self.threads}")

    @property
    def env_id(self) -> str:
        return ENV_IDS[self.level]

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))

    @property
    def eval_steps(self) -> list[int]:
        """Updates after which the policy is evaluated (0 = before training)."""
        return sorted({*range(0, self.updates + 1, self.eval_every), self.updates})

    def env_kwargs(self) -> dict[str, Any]:
        return {"max_turns": self.max_turns}


# ============================================================================ native persuadee variants
def _configured(base: type) -> type:
    """``base`` (ActPersuadee or TextPersuadee) with a spec, an optional persona set and optional
    verbalized renormalisation of its stated distribution."""

    class Configured(base):  # type: ignore[misc, valid-type]
        def __init__(self, params: Any = None, *, decoding: str = "sample", temperature: float = 1.0,
                     persona_override: Any = None, personas: Sequence[Any] | None = None, persona_set: str = "scenario",
                     model: str = "persuadee:native", verbalized: tuple[float, float] | None = None, kind: str = "native",
                     name: str | None = None):
            super().__init__(params, decoding=decoding, temperature=temperature, persona_override=persona_override,
                             name=name)
            self.personas, self.persona_set, self.model_name = personas, persona_set, model
            self.verbalized, self.kind = verbalized, kind

        @property
        def spec(self):
            from simpop.simulators.spec import SimulatorSpec

            decoding: dict[str, Any] = {"decoding": self.decoding, "temperature": float(self.temperature)}
            if self.verbalized is not None:
                decoding.update(floor=float(self.verbalized[0]), tau=float(self.verbalized[1]))
            return SimulatorSpec(self.kind, self.model_name, self.persona_set, decoding)

        def reset_batch(self, scenarios: list[Any], rngs: list[np.random.Generator]) -> None:
            if self.personas is not None:  # play a persona of the set instead of the scenario's own
                scenarios = [dataclasses.replace(s, persona=self.personas[int(r.integers(len(self.personas)))])
                             for s, r in zip(scenarios, rngs, strict=True)]
            super().reset_batch(scenarios, rngs)

        def _reply(self, slot: int, act: str, commit: bool):
            if self.verbalized is None:
                return super()._reply(slot, act, commit)
            from simpop.simulators.verbalized import renormalise

            state = self.model.update(self.state(slot), act)
            outcomes = self.model.distribution(state, act, self.temperature)
            p = renormalise([q for _, q in outcomes], *self.verbalized)
            outcome = outcomes[int(self._slots[slot].rng.choice(len(p), p=p))][0]
            if commit:
                self._slots[slot].state = state
            return state, outcome

    Configured.__name__ = Configured.__qualname__ = f"Configured{base.__name__}"
    return Configured


_CLASSES: dict[str, type] = {}


def persuadee(level: str, **kwargs: Any):
    """A native persuadee (act or text level) with the options of :func:`_configured`."""
    if level not in _CLASSES:
        from simpop.envs.persuasion.simulators import ActPersuadee, TextPersuadee

        _CLASSES.update(act=_configured(ActPersuadee), text=_configured(TextPersuadee))
    return _CLASSES[level](**kwargs)


def heldout_personas(config: CollapseConfig) -> list[Any]:
    """The panel's personas: fresh draws from the persona sampler, minus any training persona."""
    from simpop.envs.persuasion.env import default_scenarios
    from simpop.envs.persuasion.personas import PersonaSampler, modal_persona

    seen = {s.persona for s in default_scenarios()} | {modal_persona()}
    drawn = PersonaSampler().sample_many(config.heldout_personas, np.random.default_rng(config.heldout_seed))
    return [p for p in drawn if p not in seen]


def heldout_params(index: int, config: CollapseConfig, personas: Sequence[Any]):
    """Held-out model ``index``: base parameters jittered (module docstring) and recalibrated."""
    from simpop.envs.persuasion.model import PersuadeeParams, calibrate

    base = PersuadeeParams()
    rng = np.random.default_rng([config.heldout_seed, index])
    jitter = {name: tuple(v * float(np.exp(rng.normal(0.0, PANEL_JITTER))) for v in getattr(base, name))
              for name in ("act_effects", "modulation", "trait_weights")}
    return calibrate(dataclasses.replace(base, **jitter), personas=personas)


def build_panel(config: CollapseConfig):
    """The held-out :class:`~simpop.simulators.population.Panel` (same for every condition and seed)."""
    from simpop.simulators.population import Panel

    personas = heldout_personas(config)
    members = [persuadee(config.level, params=heldout_params(i, config, personas), decoding="sample", temperature=t,
                         personas=personas, persona_set="p4g-heldout", model=f"persuadee:heldout-{i}",
                         name=f"heldout-{i}-T{t:g}")
               for i, t in enumerate(PANEL_TEMPERATURES)]
    return Panel(members, name="p4g-heldout")


# ================================================================================================ runs
@dataclass
class Run:
    """One (condition, seed) training run, whatever the trainer.

    Attributes:
        step: Runs one update and returns its metrics.
        state_dict, load_state_dict: Checkpointing of everything that trains.
        policy: The policy being trained.
        training_simulator: The simulator(s) it trains against (evaluated as "training success").
        training_leaves: The concrete training simulators (for the panel's disjointness check).
    """

    step: Callable[[], dict[str, float]]
    state_dict: Callable[[], dict[str, Any]]
    load_state_dict: Callable[[dict[str, Any]], None]
    policy: Any
    training_simulator: Any
    training_leaves: list[Any]


def _grpo_config(config: CollapseConfig, seed: int):
    from simpop.train.grpo import GRPOConfig

    return GRPOConfig(group_size=config.group_size, scenarios_per_update=config.scenarios_per_update,
                      lr=config.policy_lr, hidden_size=config.hidden_size, seed=seed, lora=config.level == "text",
                      max_new_tokens=config.max_new_tokens, model=config.model, dtype=config.dtype)


def _cotrain_config(config: CollapseConfig, condition: str):
    from simpop.train.cotrain import CoTrainConfig

    population = condition == "population"
    return CoTrainConfig(target_success=config.target_success, sim_lr=config.sim_lr, sim_kl_coef=config.sim_kl_coef,
                         population_size=config.population_size if population else 1,
                         pool_size=config.pool_size if population else 0,
                         pool_sample_prob=config.pool_sample_prob if population else 0.0,
                         snapshot_every=config.snapshot_every)


def _policy(config: CollapseConfig, seed: int, backends: dict[str, Any]):
    grpo = _grpo_config(config, seed)
    if config.level == "act":
        from simpop.envs.registration import make
        from simpop.train.grpo import ActPolicy

        return ActPolicy.for_env(make(config.env_id, **config.env_kwargs()), config.hidden_size, seed)
    from simpop.train.grpo import LLMPolicy

    backend = _transformers(config.model, config, backends, key="policy")
    return LLMPolicy(backend, grpo.sampling(), lora=True, adapter=f"policy{seed}")


def _transformers(model: str, config: CollapseConfig, backends: dict[str, Any], key: str):
    """An in-process model, one per role (policy / simulators), loaded once per process."""
    if key not in backends:
        from simpop.agents.transformers_backend import TransformersBackend

        backends[key] = TransformersBackend(model, dtype=config.dtype, prefix_cache=True)
    return backends[key]


def _frozen_and_verbalized(condition: str, config: CollapseConfig, backends: dict[str, Any]):
    from simpop.envs.persuasion.personas import modal_persona

    if config.level == "act":
        if condition == "frozen":
            return persuadee("act", decoding="greedy", persona_override=modal_persona(), persona_set="p4g-modal",
                             name="frozen-modal-greedy")
        return persuadee("act", decoding="sample", temperature=1.0, persona_set="scenario", kind="verbalized",
                         verbalized=(config.verbalized_floor, config.verbalized_tau), name="verbalized")
    from simpop.agents import load_backend
    from simpop.agents.base import SamplingParams

    spec = config.sim_model or config.model
    if spec not in backends:  # HTTP backends take no dtype
        backends[spec] = (load_backend(spec) if spec.startswith("openai:")
                          else load_backend(spec, dtype=config.dtype, prefix_cache=True))
    backend = backends[spec]
    if condition == "frozen":
        from simpop.simulators.llm import LLMSimulator

        return LLMSimulator(backend, SamplingParams(max_new_tokens=config.max_new_tokens), personas=[modal_persona()],
                            persona_set="p4g-modal", name="frozen-modal-greedy")
    from simpop.simulators.verbalized import VerbalizedSimulator

    return VerbalizedSimulator(backend, k=config.verbalized_k, tau=config.verbalized_tau, floor=config.verbalized_floor,
                               params=SamplingParams(max_new_tokens=max(64, 8 * config.max_new_tokens)),
                               fallback_max_new_tokens=config.max_new_tokens, name="verbalized")


def _trainable(config: CollapseConfig, condition: str, index: int, seed: int, backends: dict[str, Any]):
    name = f"{condition}-{index}"
    if config.level == "act":
        from simpop.simulators.trainable import TrainableActPersuadee

        return TrainableActPersuadee(temperature=1.0, name=name)
    from simpop.agents.base import SamplingParams
    from simpop.simulators.trainable import TrainableLLMSimulator

    backend = _transformers(config.sim_model or config.model, config, backends, key="simulators")
    return TrainableLLMSimulator(backend, adapter=f"{condition}{index}s{seed}",
                                 params=SamplingParams(max_new_tokens=config.max_new_tokens, temperature=1.0),
                                 name=name)


def build_run(condition: str, config: CollapseConfig, seed: int, backends: dict[str, Any]) -> Run:
    """The trainer of one condition and seed (see the module docstring for each simulator)."""
    from simpop.simulators.population import leaf_simulators

    policy = _policy(config, seed, backends)
    if condition in ("frozen", "verbalized"):
        from simpop.train.grpo import GRPOTrainer

        simulator = _frozen_and_verbalized(condition, config, backends)
        trainer = GRPOTrainer(config.env_id, policy, simulator, _grpo_config(config, seed), env_kwargs=config.env_kwargs())
        return Run(lambda: trainer.update(trainer.collect()), trainer.state_dict, trainer.load_state_dict, policy,
                   simulator, [simulator])
    from simpop.train.cotrain import CoTrainer

    cot = _cotrain_config(config, condition)
    sims = [_trainable(config, condition, i, seed, backends) for i in range(cot.population_size)]
    co = CoTrainer(config.env_id, policy, sims, _grpo_config(config, seed), cot, env_kwargs=config.env_kwargs())
    return Run(co.step, co.state_dict, co.load_state_dict, policy, co.simulator,
               leaf_simulators([co.simulator]))


def run_one(config: CollapseConfig, condition: str, seed: int, out: Path, resume: bool,
            report: Callable[[str, int, int, dict[str, float]], None] | None = None) -> Path:
    """Train and evaluate one (condition, seed); returns its run folder (``metrics.jsonl`` + checkpoints).

    With ``resume``, continue from the run's newest checkpoint (a finished run is left as it is).
    """
    import torch

    from simpop.train import checkpoint

    run_dir = out / "runs" / condition / f"seed{seed}"
    saved = checkpoint.latest(run_dir) if resume else None
    if saved is not None and int(saved.stem.split("_")[1]) >= config.updates:
        return run_dir
    threads = torch.get_num_threads()
    # Act level: tiny matrices, where extra threads only spin (and crawl on a busy machine).
    wanted = config.threads or (1 if config.level == "act" else threads)
    torch.set_num_threads(wanted)
    try:
        _train_and_evaluate(config, condition, seed, run_dir, saved, report)
    finally:
        torch.set_num_threads(threads)
    return run_dir


def _train_and_evaluate(config: CollapseConfig, condition: str, seed: int, run_dir: Path, saved: Path | None,
                        report: Callable[[str, int, int, dict[str, float]], None] | None) -> None:
    import torch

    from simpop.evaluation.metrics import MetricsLogger
    from simpop.evaluation.panel import evaluate
    from simpop.train import checkpoint

    start = 0
    torch.manual_seed(seed)
    backends: dict[str, Any] = {}
    run = build_run(condition, config, seed, backends)
    panel = build_panel(config)
    panel.check_disjoint(run.training_leaves)
    if saved is not None:
        start, state = checkpoint.load(saved)
        run.load_state_dict(state)
    logger = MetricsLogger(run_dir, resume_step=start if saved is not None else None, tensorboard=False)
    eval_seed = 1_000_003 + seed  # the same dialogues at every evaluation, for every condition

    def evaluation(step: int) -> None:
        held = evaluate(config.env_id, run.policy, panel, config.eval_episodes, eval_seed, config.env_kwargs())
        train = evaluate(config.env_id, run.policy, run.training_simulator, config.eval_episodes, eval_seed,
                         config.env_kwargs())
        record = {"kind": "eval", "heldout_success": held.success, "train_success": train.success,
                  "collapse_gap": train.success - held.success, "policy_entropy": held.entropy,
                  **{f"heldout/{k}": v for k, v in held.per_member.items()}}
        logger.log(step, record)
        if report is not None:
            report(condition, seed, step, record)

    if saved is None:
        evaluation(0)
        checkpoint.save(run_dir, 0, run.state_dict(), keep=2)
    for step in range(start + 1, config.updates + 1):
        metrics = run.step()
        logger.log(step, {"kind": "train", **metrics})
        if report is not None:
            report(condition, seed, step, {"kind": "train", **metrics})
        if step in config.eval_steps:
            evaluation(step)
            checkpoint.save(run_dir, step, run.state_dict(), keep=2)
    logger.close()


# ============================================================================================ summary
def read_records(out: Path, config: CollapseConfig) -> list[dict[str, Any]]:
    """Every run's metrics, tagged with condition and seed, in (condition, seed, line) order."""
    records = []
    for condition in config.conditions:
        for seed in config.seed_list:
            path = out / "runs" / condition / f"seed{seed}" / "metrics.jsonl"
            if path.exists():
                for line in path.read_text().splitlines():
                    if line.strip():
                        records.append({"condition": condition, "seed": seed, **json.loads(line)})
    return records


def summarise(records: Sequence[dict[str, Any]], config: CollapseConfig, descriptions: dict[str, str],
              wall_time_s: float) -> dict[str, Any]:
    """``summary.json``: per condition, final and initial values with mean and 95% CI over seeds."""
    from simpop.evaluation.report import judge_claims, stat

    conditions: dict[str, Any] = {}
    for condition in config.conditions:
        values: dict[str, list[float]] = {}
        for seed in config.seed_list:
            mine = [r for r in records if r["condition"] == condition and r["seed"] == seed]
            evals = sorted((r for r in mine if r["kind"] == "eval"), key=lambda r: r["step"])
            trains = [r for r in mine if r["kind"] == "train"]
            if not evals or evals[-1]["step"] != config.updates or evals[0]["step"] != 0:
                raise RuntimeError(f"run {condition}/seed{seed} is incomplete; rerun with --resume to finish it")
            first, last = evals[0], evals[-1]
            row = {"train_success": last["train_success"], "heldout_success": last["heldout_success"],
                   "collapse_gap": last["collapse_gap"], "policy_entropy": last["policy_entropy"],
                   "zero_var_frac": float(np.mean([r["zero_var_frac"] for r in trains])),
                   "initial_train_success": first["train_success"],
                   "initial_heldout_success": first["heldout_success"],
                   "initial_policy_entropy": first["policy_entropy"]}
            for key, value in row.items():
                values.setdefault(key, []).append(float(value))
        conditions[condition] = {"description": descriptions[condition],
                                 "metrics": {key: stat(v) for key, v in values.items()}}
    summary = {
        "setup": {"level": config.level, "env_id": config.env_id, "seeds": config.seed_list, "updates": config.updates,
                  "batch_size": config.group_size * config.scenarios_per_update, "eval_every": config.eval_every,
                  "eval_episodes": config.eval_episodes, "panel": PANEL_DESCRIPTION,
                  "config": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}},
        "wall_time_s": wall_time_s,
        "conditions": conditions,
    }
    if "frozen" in conditions:
        summary["claims"] = [v.to_dict() for v in judge_claims(conditions)]
    return summary


PANEL_DESCRIPTION = ("three native persuadee models training never uses (base act effects, modulations and trait "
                     f"weights jittered by exp(N(0, {PANEL_JITTER}^2)), recalibrated to the corpus donor rate), "
                     "sampled at temperatures " + ", ".join(f"{t:g}" for t in PANEL_TEMPERATURES)
                     + ", each playing personas drawn from the persona sampler with a held-out seed (no training "
                       "persona among them)")


def descriptions(config: CollapseConfig) -> dict[str, str]:
    """How each condition's training simulator is built, for the report."""
    if config.level == "act":
        base = "the native act-level persuadee (calibrated default parameters)"
        return {
            "frozen": f"{base} playing the modal persona of the persona sampler with greedy decoding (every reply "
                      "its argmax)",
            "verbalized": f"{base} stating its full reply distribution; one reply sampled from renormalise(p, "
                          f"floor={config.verbalized_floor:g}, tau={config.verbalized_tau:g}); each dialogue plays "
                          "its scenario's persona (the training persona set)",
            "cotrain": f"{base} with all 373 parameters trainable, sampled at temperature 1 over the training persona "
                       f"set, updated on the policy's rollouts towards batch success {config.target_success:g} with "
                       f"KL anchor {config.sim_kl_coef:g} to the base (lr {config.sim_lr:g})",
            "population": f"{config.population_size} such trainable persuadees (same base) plus a checkpoint pool of "
                          f"their last {config.pool_size} snapshots (every {config.snapshot_every} updates), the pool "
                          f"driving {config.pool_sample_prob:.0%} of dialogues",
        }
    model = config.sim_model or config.model
    return {
        "frozen": f"LLM {model} playing the modal persona with greedy decoding",
        "verbalized": f"LLM {model} asked for k={config.verbalized_k} replies with probabilities (JSON), renormalised "
                      f"(floor {config.verbalized_floor:g}, tau {config.verbalized_tau:g}) and sampled; scenario personas",
        "cotrain": f"LLM {model} with a LoRA adapter, temperature 1, trained towards batch success "
                   f"{config.target_success:g} with KL {config.sim_kl_coef:g} to the base model",
        "population": f"{config.population_size} LoRA adapters on one {model} base plus a pool of {config.pool_size} "
                      f"snapshots ({config.pool_sample_prob:.0%} of dialogues)",
    }


def write_outputs(out: Path, config: CollapseConfig, wall_time_s: float) -> Path:
    """Merge run metrics into ``metrics.jsonl``; write ``summary.json``, plots and ``report.md``."""
    from simpop.evaluation.report import judge_claims, plot_curves, render_report

    records = read_records(out, config)
    with (out / "metrics.jsonl").open("w") as f:
        for record in records:
            f.write(json.dumps(record, sort_keys=True) + "\n")
    summary = summarise(records, config, descriptions(config), wall_time_s)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default))
    plots = plot_curves(records, out, order=config.conditions)
    verdicts = judge_claims(summary["conditions"]) if "frozen" in summary["conditions"] else []
    report = out / "report.md"
    report.write_text(render_report(summary, verdicts, [str(p) for p in plots]))
    return report


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


# ============================================================================================ driver
def _worker(args: tuple[CollapseConfig, str, int, str, bool, Any]) -> tuple[str, int, float]:
    config, condition, seed, out, resume, queue = args
    start = time.perf_counter()
    report = (lambda c, s, step, m: queue.put((c, s, step, m))) if queue is not None else None
    run_one(config, condition, seed, Path(out), resume, report)
    return condition, seed, time.perf_counter() - start


def run_collapse(config: CollapseConfig, out: str | Path, resume: bool = False, progress: bool = True) -> Path:
    """Run every (condition, seed) (in ``config.workers`` processes), then write the outputs; the report's path.

    Raises:
        FileExistsError: ``out`` holds an earlier run and ``resume`` is False.
    """
    out = Path(out)
    if not resume and (out / "runs").exists():
        raise FileExistsError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.json"
    saved = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}
    if resume and config_path.exists():
        previous = json.loads(config_path.read_text())
        changed = sorted(k for k in saved if previous.get(k) != saved[k])  # a field added since reads as None
        if changed:
            raise ValueError(f"--resume with different settings ({', '.join(changed)}) than the run in {out}; "
                             f"resume with the same flags or use another --out")
    config_path.write_text(json.dumps(saved, indent=2))
    tasks = [(c, s) for s in config.seed_list for c in config.conditions]
    started = time.perf_counter()
    bar = Progress(len(tasks) * config.updates, progress)
    if config.workers == 1 or len(tasks) == 1:
        for condition, seed in tasks:
            run_one(config, condition, seed, out, resume, bar.report)
    else:
        import concurrent.futures
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        with context.Manager() as manager:
            queue = manager.Queue()
            with concurrent.futures.ProcessPoolExecutor(config.workers, mp_context=context) as pool:
                futures = [pool.submit(_worker, (config, c, s, str(out), resume, queue)) for c, s in tasks]
                while not all(f.done() for f in futures):
                    bar.drain(queue)
                    time.sleep(0.2)
                bar.drain(queue)
                for f in futures:
                    f.result()  # re-raise a worker's error here
    bar.close()
    return write_outputs(out, config, time.perf_counter() - started)


class Progress:
    """A tqdm bar over all updates of all runs, with the latest held-out success per condition."""

    def __init__(self, total: int, enabled: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc="collapse", unit="update", disable=not enabled)
        self.heldout: dict[str, float] = {}

    def report(self, condition: str, seed: int, step: int, record: dict[str, Any]) -> None:
        if record.get("kind") == "train":
            self.bar.update(1)
        elif "heldout_success" in record and not math.isnan(record["heldout_success"]):
            self.heldout[condition] = record["heldout_success"]
            self.bar.set_postfix({f"{c}": f"{v:.2f}" for c, v in self.heldout.items()}, refresh=False)

    def drain(self, queue: Any) -> None:
        while not queue.empty():
            self.report(*queue.get())

    def close(self) -> None:
        self.bar.close()

