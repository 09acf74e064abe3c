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

from simpop.agents.policy import ModelConfig
from simpop.train.cotrain import CoTrainConfig
from simpop.train.config import changed_settings, to_dict
from simpop.train.grpo import GRPOConfig

CONDITIONS = ("frozen", "verbalized", "cotrain", "population")
#: Conditions that co-train simulators; ``cotrain+<objective>`` runs one with another objective (an ablation).
COTRAINED = ("cotrain", "population")
PANEL_TEMPERATURES = (0.8, 0.9, 1.2)
#: Spread (log-scale sd) of the held-out models' parameter jitter.
PANEL_JITTER = 0.35
#: The robustness panel (act level): strategy-shuffled models at these temperatures playing uniform personas.
ROBUST_PANEL_TEMPERATURES = (0.7, 1.1, 1.5)
ROBUST_SEED = 9091
#: The corpus panel (act level, with ``corpus_panel``): models fitted to corpus resamples, at these temperatures.
CORPUS_PANEL_TEMPERATURES = (0.9, 1.1, 1.3)
CORPUS_SEED = 2019
#: Dialogues the training simulator plays for its realism index at the last evaluation (act level).
REALISM_EPISODES = 128
#: Text level: LLM members added to the panel (held-out personas, these temperatures); they share the
#: training simulators' model (the one embedded LLM), so they are held out by persona and decoding only.
TEXT_PANEL_LLM_TEMPERATURES = (0.7,)
ENV_IDS = {"act": "simpop/PersuasionAct-v0", "text": "simpop/Persuasion-v1"}
#: Defaults that depend on the level (fields left at None take these).
LEVEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "act": {"seeds": 12, "updates": 200, "eval_every": 20, "eval_episodes": 64, "max_turns": 10, "workers": 2,
            "conditions": CONDITIONS, "robust_panel": True, "human_panel": "p4g-act-human-v1"},
    # Sized to finish within an hour on two CPU cores (docs/text-collapse.md has the measured run).
    "text": {"seeds": 1, "updates": 16, "eval_every": 8, "eval_episodes": 16, "max_turns": 2, "workers": 1,
             "conditions": ("frozen", "verbalized"), "robust_panel": False, "human_panel": "none"},
}


def default_grpo(level: str) -> GRPOConfig:
    """The policy trainer's settings at ``level`` when the experiment names none (the seed is set per run)."""
    if level == "act":
        return GRPOConfig(group_size=8, scenarios_per_update=8, max_new_tokens=24)
    # 16 updates is a short run: a LoRA learning rate of 5e-4 (GRPOConfig's LoRA default is 1e-4), set before
    # any text-level result was seen.
    return GRPOConfig(group_size=4, scenarios_per_update=4, max_new_tokens=24, lr=5e-4)


def default_cotrain(level: str) -> CoTrainConfig:
    """Population co-training's settings at ``level`` (plain co-training: the same with K = 1 and no pool)."""
    return CoTrainConfig(sim_lr=0.05 if level == "act" else 1e-4, sim_kl_coef=0.1, target_success=0.5,
                         population_size=3, pool_size=5, pool_sample_prob=0.25, snapshot_every=10)


def default_model(level: str) -> ModelConfig:
    """The policy model at ``level`` (text: a LoRA adapter on the embedded model, bf16 weights on a GPU or where
    the CPU has bf16 matmul, resolved here so that the report names it; the adapter is named per seed)."""
    if level == "act":
        return ModelConfig()
    from simpop.agents.transformers_backend import resolve_dtype

    return ModelConfig(lora=True, dtype=resolve_dtype("auto"))


@dataclass(frozen=True)
class CollapseConfig:
    """Settings of ``simpop experiment collapse`` (flags are generated from these fields; the nested
    trainer configs' fields are ``--grpo.lr``, ``--cotrain.sim-lr``, ``--model.dtype``, ...).

    Attributes:
        level: ``act`` (P4G dialogue acts, minutes on a CPU) or ``text`` (free text with LLMs).
        seeds: Seeds per condition (the same seeds for every condition); None: act 12, text 1 (one seed: CIs
            are bootstraps over the evaluation dialogues, see :mod:`simpop.evaluation.report`).
        first_seed: The first seed; seeds are ``first_seed .. first_seed + seeds - 1``.
        conditions: Conditions to run, from frozen, verbalized, cotrain, population, and ablations of the co-trained
            two, ``cotrain+<objective>`` / ``population+<objective>`` (the same condition with another
            :attr:`CoTrainConfig.objective <simpop.train.cotrain.CoTrainConfig.objective>`, e.g.
            ``cotrain+persona``, ``population+diverse``); None: the four at the act level, frozen and verbalized at
            the text level (what fits in an hour on two CPU cores).
        updates: Policy updates per run (the equal budget); None: act 200, text 16.
        eval_every: Updates between evaluations (also at 0 and at the end); None: act 20, text 8.
        eval_episodes: Dialogues per panel member and on the training simulator per evaluation; None:
            act 64, text 16.
        max_turns: Persuader turns per dialogue; None: act 10, text 2.
        grpo: The policy trainer of every condition (:class:`~simpop.train.grpo.GRPOConfig`; its ``seed`` is
            set per run, its ``max_new_tokens`` is also the text simulators' budget); a mapping replaces fields
            of the level default (:func:`default_grpo`: act 8 x 8 dialogues, text 4 x 4 with LoRA lr 5e-4; 24
            new tokens).
        cotrain: Population co-training (:class:`~simpop.train.cotrain.CoTrainConfig`); the cotrain condition
            uses it with population_size 1 and no pool. A mapping replaces fields of :func:`default_cotrain`
            (K = 3, pool 5 sampled 25%, snapshot every 10, sim_lr act 0.05 / text 1e-4, KL 0.1, target 0.5).
        model: The policy model (:class:`~simpop.agents.policy.ModelConfig`; text level: the model, dtype (default
            bf16 where the CPU has it) and LoRA settings; act level: hidden_size); a mapping replaces fields of
            :func:`default_model`.
        verbalized_tau: Temperature of the verbalized renormalisation.
        verbalized_floor: Probability floor of the verbalized renormalisation.
        verbalized_k: Candidates the text-level verbalized simulator is asked for.
        heldout_personas: Size of the held-out panel's persona set (and of the robustness panel's).
        heldout_seed: Seed of the held-out personas and models.
        robust_panel: Also evaluate on the robustness panel (:func:`robust_panel_specs`), built by another
            procedure than the held-out panel; None: act yes, text no (its evaluations cost LLM time).
        human_panel: A shipped panel (:mod:`simpop.evaluation.panels`) evaluated as the human-fitted panel, or
            ``none``; None: act ``p4g-act-human-v1``, text ``none``. ``--human-panel none`` reproduces reports made
            before it was the default.
        corpus_panel: A P4G corpus folder (not shipped; :mod:`simpop.envs.persuasion.corpus`): also evaluate on
            persuadees fitted to it (:func:`corpus_panel_specs`); None: no corpus panel.
        sim_model: Text level: the simulators' model (backend spec; co-training needs an in-process
            transformers model); None: the policy's model.
        workers: Parallel processes over (condition, seed) runs; None: act 2, text 1.
        threads: Torch threads per run; None: 1 at the act level (tiny matrices), torch's default at the
            text level. On a busy CPU, 1 avoids threads spinning against each other.
    """

    level: Literal["act", "text"] = "act"
    seeds: int | None = None
    first_seed: int = 0
    conditions: tuple[str, ...] | None = None
    updates: int | None = None
    eval_every: int | None = None
    eval_episodes: int | None = None
    max_turns: int | None = None
    grpo: GRPOConfig | None = None
    cotrain: CoTrainConfig | None = None
    model: ModelConfig | None = None
    verbalized_tau: float = 1.0
    verbalized_floor: float = 0.01
    verbalized_k: int = 5
    heldout_personas: int = 300
    heldout_seed: int = 4242
    robust_panel: bool | None = None
    human_panel: str | None = None
    corpus_panel: str | None = None
    sim_model: str | None = None
    workers: int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        from simpop.train.config import nested

        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(f"CollapseConfig: {message}")

        need(self.level in LEVEL_DEFAULTS, f"level must be 'act' or 'text', got {self.level!r}")
        for key, value in LEVEL_DEFAULTS[self.level].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        for key, cls, default in (("grpo", GRPOConfig, default_grpo), ("cotrain", CoTrainConfig, default_cotrain),
                                  ("model", ModelConfig, default_model)):
            try:
                object.__setattr__(self, key, nested(getattr(self, key), cls, default(self.level)))
            except (TypeError, ValueError) as error:
                need(False, f"{key}: {error}")
        unknown = sorted(c for c in self.conditions if not _known_condition(c))
        need(not unknown and len(self.conditions) > 0,
             f"conditions must be a non-empty subset of {', '.join(CONDITIONS)} or co-training ablations "
             f"(cotrain+<objective>, population+<objective>); unknown: {unknown}")
        need(len(set(self.conditions)) == len(self.conditions), "conditions must not repeat")
        for condition in self.conditions:
            if condition.partition("+")[0] in COTRAINED:
                try:
                    condition_cotrain(condition, self.cotrain)
                except ValueError as error:
                    need(False, f"condition {condition}: {error}")
        for key in ("seeds", "updates", "eval_every", "eval_episodes", "max_turns", "heldout_personas", "workers",
                    "verbalized_k"):
            need(getattr(self, key) >= 1, f"{key} must be >= 1, got {getattr(self, key)}")
        need(self.cotrain.pool_size >= 1 and self.cotrain.pool_sample_prob > 0 or "population" not in self.conditions,
             "population co-training needs a checkpoint pool: cotrain.pool_size >= 1 and cotrain.pool_sample_prob > 0")
        need(self.verbalized_tau > 0 and 0 <= self.verbalized_floor < 1,
             f"verbalized_tau must be > 0 and verbalized_floor in [0, 1); got {self.verbalized_tau}, "
             f"{self.verbalized_floor}")
        need(self.threads is None or self.threads >= 1, f"threads must be >= 1 or None, got {self.threads}")
        if self.human_panel != "none":
            from simpop.evaluation.panels import panel_definition

            try:
                panel_definition(self.human_panel).check_env(self.env_id)
            except ValueError as error:
                need(False, f"human_panel: {error} (or 'none')")
        if self.corpus_panel is not None:
            need(Path(self.corpus_panel).is_dir(), f"corpus_panel {self.corpus_panel}: no such folder")
            object.__setattr__(self, "corpus_panel", str(Path(self.corpus_panel).resolve()))

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


def _known_condition(condition: str) -> bool:
    from simpop.train.cotrain import OBJECTIVES

    base, plus, objective = condition.partition("+")
    return base in CONDITIONS and (not plus or (base in COTRAINED and objective in OBJECTIVES))


def condition_cotrain(condition: str, cotrain: CoTrainConfig) -> CoTrainConfig:
    """The co-training settings of ``condition``: population co-training as configured; ``cotrain`` the same with
    K = 1 and no pool; a ``+<objective>`` suffix replaces the objective (``+diverse`` also prunes the pool's most
    redundant snapshot instead of its oldest; raises ValueError where it cannot run)."""
    base, _, objective = condition.partition("+")
    changes: dict[str, Any] = {"objective": objective} if objective else {}
    if objective == "diverse":  # a population kept apart keeps distinct snapshots in its pool too
        changes["pool_prune"] = "redundant"
    if base == "cotrain":
        changes.update(population_size=1, pool_size=0, pool_sample_prob=0.0)
    config = dataclasses.replace(cotrain, **changes)
    if config.objective == "diverse" and config.population_size < 2:
        raise ValueError("objective 'diverse' pushes population members apart: run it as population+diverse "
                         "(population_size >= 2)")
    return config


# ============================================================================================ specs
def simulator_specs(condition: str, config: CollapseConfig) -> dict[str, str]:
    """Name -> spec of each training simulator of ``condition`` (the module docstring describes them)."""
    k = condition_cotrain(condition, config.cotrain).population_size if condition.partition("+")[0] in COTRAINED else 1
    if config.level == "act":
        return {
            "frozen": {"frozen-modal-greedy": "persuadee?decoding=greedy&personas=modal"},
            "verbalized": {"verbalized": f"verbalized:persuadee?temperature=1.0&floor={config.verbalized_floor!r}"
                                         f"&tau={config.verbalized_tau!r}"},
        }.get(condition) or {f"{condition.partition('+')[0]}-{i}": "trainable:persuadee?temperature=1.0"
                             for i in range(k)}
    model, tokens = config.sim_model or config.model.model, config.grpo.max_new_tokens
    return {
        "frozen": {"frozen-modal-greedy": f"frozen:{model}?max_new_tokens={tokens}&personas=modal"},
        "verbalized": {"verbalized": f"verbalized:{model}?k={config.verbalized_k}&tau={config.verbalized_tau!r}"
                                     f"&floor={config.verbalized_floor!r}&max_new_tokens={max(64, 8 * tokens)}"
                                     f"&fallback_max_new_tokens={tokens}"},
    }.get(condition) or {f"{condition.partition('+')[0]}-{i}": f"trainable:{model}?temperature=1.0"
                                                                f"&max_new_tokens={tokens}" for i in range(k)}


def panel_specs(config: CollapseConfig) -> dict[str, str]:
    """Name -> spec of each held-out panel member (the same for every condition and seed)."""
    personas = f"heldout-{config.heldout_personas}-{config.heldout_seed}"
    members = {f"heldout-{i}-T{t:g}": f"persuadee:heldout-{i}?temperature={t!r}&personas={personas}"
                                      f"&jitter={PANEL_JITTER!r}&model_seed={config.heldout_seed}"
               for i, t in enumerate(PANEL_TEMPERATURES)}
    if config.level == "text":
        model, tokens = config.sim_model or config.model.model, config.grpo.max_new_tokens
        members.update({f"llm-heldout-T{t:g}": f"frozen:{model}?temperature={t!r}&personas={personas}"
                                               f"&max_new_tokens={tokens}" for t in TEXT_PANEL_LLM_TEMPERATURES})
    return members


def robust_panel_specs(config: CollapseConfig) -> dict[str, str]:
    """Name -> spec of each robustness panel member: built by another procedure than :func:`panel_specs` (strategy
    effects permuted rather than jittered, :func:`~simpop.envs.persuasion.simulators.model_params`; personas with
    uniform attributes rather than from the population sampler; other temperatures)."""
    personas = f"uniform-{config.heldout_personas}-{ROBUST_SEED}"
    return {f"shuffled-{i}-T{t:g}": f"persuadee:shuffled-{i}?temperature={t!r}&personas={personas}"
                                    f"&model_seed={ROBUST_SEED}"
            for i, t in enumerate(ROBUST_PANEL_TEMPERATURES)}


def corpus_panel_specs(config: CollapseConfig) -> dict[str, str]:
    """Name -> spec of each corpus panel member: persuadees fitted to bootstrap resamples of the corpus in
    ``config.corpus_panel`` (``persuadee:fitted-<i>``), playing its real persuadees (persona set ``corpus:<dir>``)."""
    corpus = config.corpus_panel
    return {f"fitted-{i}-T{t:g}": f"persuadee:fitted-{i}?corpus={corpus}&personas=corpus:{corpus}&temperature={t!r}"
                                  f"&model_seed={CORPUS_SEED}"
            for i, t in enumerate(CORPUS_PANEL_TEMPERATURES)}


def extra_panels(config: CollapseConfig) -> dict[str, dict[str, str]]:
    """The panels evaluated besides the held-out one (name -> member specs): ``robust``, ``human``, ``corpus``."""
    from simpop.evaluation.panels import panel_definition

    panels = {}
    if config.robust_panel:
        panels["robust"] = robust_panel_specs(config)
    if config.human_panel != "none":
        panels["human"] = dict(panel_definition(config.human_panel).members)
    if config.corpus_panel:
        panels["corpus"] = corpus_panel_specs(config)
    return panels


def shared_model_members(config: CollapseConfig) -> list[str]:
    """Panel members that share the training simulators' model (text level: the LLM members)."""
    return [name for name in panel_specs(config) if name.startswith("llm-")]


def simulator_backends(config: CollapseConfig) -> dict[str, Any]:
    """Text level: the simulators' models loaded with the experiment's dtype and a prefix cache."""
    model = config.sim_model or config.model.model
    if config.level == "act" or model.startswith("openai:"):  # HTTP backends take no dtype
        return {}
    from simpop.agents import load_backend
    from simpop.agents.transformers_backend import TransformersBackend

    dtype, cache = config.model.dtype, config.model.prefix_cache
    return {model: load_backend(model, dtype=dtype, prefix_cache=cache),
            f"trainable:{model}": TransformersBackend(model, dtype=dtype, prefix_cache=cache)}


def build_trainer(condition: str, config: CollapseConfig, seed: int, env: Any,
                  backends: dict[str, Any] | None = None):
    """The trainer of one condition and seed: GRPO against the condition's simulator, or co-training
    (``backends``: the simulators' loaded models, :func:`simulator_backends`)."""
    from simpop.agents.policy import build_policy
    from simpop.simulators.registry import build_many
    from simpop.train.cotrain import CoTrainer
    from simpop.train.grpo import GRPOTrainer

    grpo = dataclasses.replace(config.grpo, seed=seed)
    model = dataclasses.replace(config.model, adapter=f"policy{seed}")
    policy = build_policy(env, model, grpo.sampling(), seed)
    simulators = build_many(simulator_specs(condition, config), env,
                            simulator_backends(config) if backends is None else backends)
    if condition in ("frozen", "verbalized"):
        return GRPOTrainer(config.env_id, policy, simulators[0], grpo, env_kwargs=config.env_kwargs())
    return CoTrainer(GRPOTrainer(config.env_id, policy, None, grpo, env_kwargs=config.env_kwargs()), simulators,
                     condition_cotrain(condition, config.cotrain))


def build_panel(config: CollapseConfig, env: Any, backends: dict[str, Any] | None = None, name: str = "heldout"):
    """The held-out :class:`~simpop.simulators.population.Panel` (same for every condition and seed), or the
    :func:`extra_panels` one called ``name``."""
    from simpop.simulators.registry import load_panel

    members = panel_specs(config) if name == "heldout" else extra_panels(config)[name]
    return load_panel({"name": f"p4g-{name}", "members": members}, env,
                      simulator_backends(config) if backends is None else backends)


def run_one(config: CollapseConfig, condition: str, seed: int, out: Path, resume: bool,
            report: Callable[[str, int, int, dict[str, float]], None] | None = None) -> Path:
    """Train and evaluate one (condition, seed) with :func:`simpop.train.loop.run`; returns its run folder.

    With ``resume``, continue from the run's newest checkpoint (a finished run is left as it is).
    """
    import torch

    from simpop import checkpoint
    from simpop.envs.registration import make
    from simpop.train.loop import LoopConfig, run

    run_dir = out / "runs" / condition / f"seed{seed}"
    saved = checkpoint.latest(run_dir) if resume else None
    if saved is not None and int(saved.stem.split("_")[1]) >= config.updates:
        return run_dir
    threads = torch.get_num_threads()
    # Act level: tiny matrices, where extra threads only spin (and crawl on a busy machine).
    torch.set_num_threads(config.threads or (1 if config.level == "act" else threads))
    try:
        torch.manual_seed(seed)
        env = make(config.env_id, **config.env_kwargs())
        backends = simulator_backends(config)  # one copy of the simulators' model for training and the panel
        trainer = build_trainer(condition, config, seed, env, backends)
        panel = build_panel(config, env, backends)
        panel.check_disjoint([trainer.training_simulator], shared_model=shared_model_members(config))
        extras = {name: build_panel(config, env, backends, name) for name in extra_panels(config)}
        for extra in extras.values():
            extra.check_disjoint([trainer.training_simulator])
        eval_seed = 1_000_003 + seed  # the same dialogues at every evaluation, for every condition

        def evaluation(step: int) -> dict[str, Any]:
            from simpop.evaluation.panel import evaluate

            record, held, train = evaluate_run(config.env_id, trainer, panel, config.eval_episodes, eval_seed,
                                               config.env_kwargs())
            # per dialogue, in a fixed order (the same scenarios and seeds at every evaluation)
            record = {**record, "heldout_outcomes": [int(r.success) for r in held.records],
                      "train_outcomes": [int(r.success) for r in train.records]}
            for name, extra in extras.items():
                result = evaluate(config.env_id, trainer.policy, extra, config.eval_episodes, eval_seed,
                                  config.env_kwargs())
                record.update({f"{name}_success": result.success,
                               f"{name}_outcomes": [int(r.success) for r in result.records],
                               **{f"{name}/{k}": v for k, v in result.per_member.items()}})
            if step == config.updates and config.level == "act":  # after training: nothing later depends on it
                record.update(training_realism(trainer.training_simulator, eval_seed))
            return record

        loop = LoopConfig(save_every=config.eval_every, keep_checkpoints=2, eval_every=config.eval_every,
                          tensorboard=False)
        run(trainer, config.updates, run_dir, config=loop, resume=resume, evaluate=evaluation,
            report=(lambda step, record: report(condition, seed, step, record)) if report is not None else None)
    finally:
        torch.set_num_threads(threads)
    return run_dir


def training_realism(simulator: Any, seed: int) -> dict[str, Any]:
    """The realism index of a run's training simulator(s) against the shipped people's statistics (act level)."""
    from simpop.evaluation.realism import conversations_of, score, shipped_reference

    result = score(conversations_of(simulator, "act", REALISM_EPISODES, seed), shipped_reference(), "act",
                   seed=seed)
    return {"realism_index": result.index, "realism_ci": list(result.ci)}


def evaluate_run(env_id: str, trainer: Any, panel: Any, episodes: int, seed: int,
                 env_kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
    """One evaluation of a run: the policy on the held-out ``panel`` and on its own training simulator (the same
    dialogues: ``seed``); the record's success, gap and entropy fields, and both results."""
    from simpop.evaluation.panel import evaluate

    held = evaluate(env_id, trainer.policy, panel, episodes, seed, env_kwargs)
    train = evaluate(env_id, trainer.policy, trainer.training_simulator, episodes, seed, env_kwargs)
    record = {"heldout_success": held.success, "train_success": train.success,
              "collapse_gap": train.success - held.success, "policy_entropy": held.entropy,
              **{f"heldout/{k}": v for k, v in held.per_member.items()}}
    return record, held, train


# ============================================================================================ summary
def read_records(out: Path, config: Any) -> list[dict[str, Any]]:
    """Every run's metrics, tagged with condition and seed, in (condition, seed, line) order (``config``: any
    experiment config with ``conditions`` and ``seed_list``)."""
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
    from simpop.evaluation.report import collapse_curve, judge_claims, judged, stat

    conditions: dict[str, Any] = {}
    for condition in config.conditions:
        values: dict[str, list[float]] = {}
        units: dict[str, list[list[float]] | None] = {}  # one seed: the dialogues / updates inside it
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
                   "initial_policy_entropy": first["policy_entropy"],
                   "train_rise": _rise([r["success"] for r in trains]),
                   "late_change": late_change([r["success"] for r in trains])}
            for name in extra_panels(config):
                row.update({f"{name}_success": last[f"{name}_success"],
                            f"initial_{name}_success": first[f"{name}_success"]})
            if "realism_index" in last:
                row["realism_index"] = last["realism_index"]
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
                  "eval_episodes": config.eval_episodes, "panel": panel_description(config),
                  "robust_panel": robust_panel_description(config) if config.robust_panel else None,
                  "human_panel": human_panel_description(config) if config.human_panel != "none" else None,
                  "corpus_panel": corpus_panel_description(config) if config.corpus_panel else None,
                  "config": to_dict(config)},
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
    mean over the 10% before (|change| <= :data:`~simpop.evaluation.report.CONVERGED_CHANGE`: flat)."""
    tenth = max(1, len(values) // 10)
    if len(values) < 2 * tenth or not values:
        return math.nan
    return float(np.mean(values[-tenth:]) - np.mean(values[-2 * tenth:-tenth]))


def _rise(values: Sequence[float]) -> float:
    """Mean of the second half of ``values`` minus the mean of the first half (0 with fewer than two)."""
    late, early = _halves(values)
    return float(np.mean(late) - np.mean(early)) if early else 0.0


def panel_description(config: CollapseConfig) -> str:
    """The held-out panel, for the report."""
    text = ("three native persuadee models training never uses (base act effects, modulations and trait "
            f"weights jittered by exp(N(0, {PANEL_JITTER}^2)), recalibrated to the corpus donor rate), "
            "sampled at temperatures " + ", ".join(f"{t:g}" for t in PANEL_TEMPERATURES)
            + ", each playing personas drawn from the persona sampler with a held-out seed (no training "
              "persona among them)")
    if config.level == "text":
        model = config.sim_model or config.model.model
        text += (f"; realised as text, plus LLM {model} sampled at temperature "
                 + ", ".join(f"{t:g}" for t in TEXT_PANEL_LLM_TEMPERATURES)
                 + " playing the same held-out personas (the training simulators' model: held out by persona and "
                   "decoding only)")
    return text


def robust_panel_description(config: CollapseConfig) -> str:
    """The robustness panel, for the report."""
    return ("three native persuadee models whose persuasive strategies' effects and persona modulations are "
            "permuted among the strategies (which strategy works is reassigned, not perturbed), recalibrated to the "
            "corpus donor rate, sampled at temperatures " + ", ".join(f"{t:g}" for t in ROBUST_PANEL_TEMPERATURES)
            + f", playing {config.heldout_personas} personas whose every attribute is uniform over its values (not "
              "the population sampler's marginals): built by another procedure than the held-out panel")


def human_panel_description(config: CollapseConfig) -> str:
    """The human-fitted panel, for the report."""
    from simpop.evaluation.panels import panel_definition

    return f"`{config.human_panel}`: " + panel_definition(config.human_panel).description


def corpus_panel_description(config: CollapseConfig) -> str:
    """The corpus panel, for the report."""
    return ("three native persuadee models fitted to bootstrap resamples of the P4G corpus in "
            f"{config.corpus_panel} (response acts from its annotated dialogues, strategy effects by logistic "
            "regression, calibrated to the resample's donor rate and mean donation), sampled at temperatures "
            + ", ".join(f"{t:g}" for t in CORPUS_PANEL_TEMPERATURES) + ", playing the corpus's real persuadees")


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
    }


def write_outputs(out: Path, config: CollapseConfig, wall_time_s: float) -> Path:
    """Merge run metrics into ``metrics.jsonl``; write ``summary.json``, plots and ``report.md``."""
    from simpop.evaluation.report import judge_claims, judged, plot_curves, plot_per_seed, render_report

    records = read_records(out, config)
    with (out / "metrics.jsonl").open("w") as f:
        for record in records:
            f.write(json.dumps(record, sort_keys=True) + "\n")
    summary = summarise(records, config, descriptions(config), wall_time_s)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default))
    plots = plot_curves(records, out, order=config.conditions) + plot_per_seed(records, out, order=config.conditions)
    verdicts = judge_claims(summary["conditions"]) if judged(summary["conditions"]) else []
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
    saved = to_dict(config)
    if resume and config_path.exists():
        # runs saved before the human-fitted panel existed had none: resuming them needs --human-panel none
        earlier = dataclasses.replace(CollapseConfig(level=config.level), human_panel="none")
        changed = changed_settings(json.loads(config_path.read_text()), config, earlier)
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
        from simpop.progress import progress_bar

        self.bar = progress_bar(total, "collapse", unit="update", disable=not enabled)
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

