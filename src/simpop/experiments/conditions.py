"""The collapse experiment's conditions, trainers and panels, which the other experiments build on.

The conditions (``frozen``, ``verbalized``, ``cotrain``, ``population``, their objective ablations, and the
simulator-choice variants ``prioritised``, ``rotation`` and ``failure``), their
training simulators and trainers, the held-out, robustness and corpus panels, the configuration that sizes them
(:class:`CollapseConfig`) and one evaluation of a run. What each condition and panel
is, and why: :mod:`simpop.experiments.collapse`, whose experiment runs them; :mod:`simpop.experiments.adaptive`
and :mod:`simpop.experiments.monitor_calibration` reuse them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from simpop.agents.policy import ModelConfig
from simpop.experiments.runs import Seeded
from simpop.train.cotrain import CoTrainConfig
from simpop.train.grpo import GRPOConfig
from simpop.validation import at_least_one, check_fields

CONDITIONS = ("frozen", "verbalized", "cotrain", "population", "prioritised", "rotation", "failure")
#: The conditions run when none are named (the paper's four).
DEFAULT_CONDITIONS = CONDITIONS[:4]
#: Conditions that co-train simulators; ``cotrain+<objective>`` runs one with another objective (an ablation).
COTRAINED = ("cotrain", "population", "prioritised")
#: Conditions only the act level runs (their simulators are native persuadees).
ACT_ONLY = ("rotation", "failure")
#: ``rotation``: updates each of its simulators drives before the next takes over (docs/selfplay.md's setting).
ROTATE_EVERY = 5
PANEL_TEMPERATURES = (0.8, 0.9, 1.2)
#: Spread (log-scale sd) of the held-out models' parameter jitter.
PANEL_JITTER = 0.35
#: The robustness panel (act level): strategy-shuffled models at these temperatures playing uniform personas.
ROBUST_PANEL_TEMPERATURES = (0.7, 1.1, 1.5)
ROBUST_SEED = 9091
#: The corpus panel (act level, with ``corpus_panel``): models fitted to corpus resamples, at these temperatures.
CORPUS_PANEL_TEMPERATURES = (0.9, 1.1, 1.3)
CORPUS_SEED = 2019
#: Text level: LLM members added to the panel (held-out personas, these temperatures); they share the
#: training simulators' model (the one embedded LLM), so they are held out by persona and decoding only.
TEXT_PANEL_LLM_TEMPERATURES = (0.7,)
ENV_IDS = {"act": "simpop/PersuasionAct-v0", "text": "simpop/Persuasion-v1"}
#: The persuadee the failure-driven pool starts from (and the sampled member of ``rotation``).
BASE_SPEC = "persuadee?temperature=1.0"
#: Updates between growth rounds of the failure-driven pool (:mod:`simpop.experiments.adaptive`).
GROW_EVERY = 10
#: The probe panel: persuadee models neither training nor the held-out panel uses, over the scenario personas.
PROBE_MODELS = ("heldout-10", "heldout-11")
PROBE_TEMPERATURE = 1.1
#: Defaults that depend on the level (fields left at None take these).
LEVEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "act": {"seeds": 12, "updates": 200, "eval_every": 20, "eval_episodes": 64, "max_turns": 10, "workers": 2,
            "conditions": DEFAULT_CONDITIONS, "robust_panel": True, "human_panel": "p4g-act-human-v1"},
    # Sized to finish within an hour on two CPU cores (docs/text-collapse.md has the measured run).
    "text": {"seeds": 1, "updates": 16, "eval_every": 8, "eval_episodes": 16, "max_turns": 2, "workers": 1,
             "conditions": ("frozen", "verbalized"), "robust_panel": False, "human_panel": "none"},
}


def default_grpo(level: str) -> GRPOConfig:
    """The policy trainer's settings at ``level`` when the experiment names none (the seed is set per run)."""
    if level == "act":  # lr 1e-2: the act-level rate every recorded collapse result used (GRPOConfig's is 3e-3)
        return GRPOConfig(group_size=8, scenarios_per_update=8, max_new_tokens=24, lr=1e-2)
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
    from simpop.agents.process_tuning import resolve_dtype

    return ModelConfig(lora=True, dtype=resolve_dtype("auto"))


@dataclass(frozen=True)
class CollapseConfig(Seeded):
    """Settings of ``simpop experiment collapse`` (flags are generated from these fields; the nested
    trainer configs' fields are ``--grpo.lr``, ``--cotrain.sim-lr``, ``--model.dtype``, ...).

    Attributes:
        level: ``act`` (P4G dialogue acts, minutes on a CPU) or ``text`` (free text with LLMs).
        seeds: Seeds per condition (the same seeds for every condition); None: act 12, text 1 (one seed: CIs
            are bootstraps over the evaluation dialogues, see :mod:`simpop.experiments.collapse_report`).
        first_seed: The first seed; seeds are ``first_seed .. first_seed + seeds - 1``.
        conditions: Conditions to run, from frozen, verbalized, cotrain, population, prioritised (population
            co-training choosing its members by the failure-prioritised rule), rotation and failure (act level: the
            fixed simulators taking turns; the failure-driven pool), and ablations of the co-trained ones,
            ``cotrain+<objective>`` / ``population+<objective>`` (the same condition with another
            :attr:`CoTrainConfig.objective <simpop.train.cotrain.CoTrainConfig.objective>`, e.g.
            ``cotrain+persona``, ``population+diverse``); None: the first four at the act level, frozen and
            verbalized at the text level (what fits in an hour on two CPU cores).
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
        check_fields(self)
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
             f"({', '.join(f'{c}+<objective>' for c in COTRAINED)}); unknown: {unknown}")
        need(len(set(self.conditions)) == len(self.conditions), "conditions must not repeat")
        act_only = [c for c in self.conditions if c in ACT_ONLY]
        need(self.level == "act" or not act_only, f"conditions {act_only} run at the act level only")
        for condition in self.conditions:
            if condition.partition("+")[0] in COTRAINED:
                try:
                    condition_cotrain(condition, self.cotrain)
                except ValueError as error:
                    need(False, f"condition {condition}: {error}")
        at_least_one(self, ("seeds", "updates", "eval_every", "eval_episodes", "max_turns", "heldout_personas",
                            "workers", "verbalized_k"))
        populations = [c for c in self.conditions if c.partition("+")[0] in ("population", "prioritised")]
        need(self.cotrain.pool_size >= 1 and self.cotrain.pool_sample_prob > 0 or not populations,
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

    def env_kwargs(self) -> dict[str, Any]:
        """The env arguments every run uses."""
        return {"max_turns": self.max_turns}


def _known_condition(condition: str) -> bool:
    from simpop.train.cotrain import OBJECTIVES

    base, plus, objective = condition.partition("+")
    return base in CONDITIONS and (not plus or (base in COTRAINED and objective in OBJECTIVES))


def condition_cotrain(condition: str, cotrain: CoTrainConfig) -> CoTrainConfig:
    """The co-training settings of ``condition``: population co-training as configured; ``prioritised`` the same
    choosing each dialogue's driver by the failure-prioritised rule; ``cotrain`` the same with K = 1 and no pool; a
    ``+<objective>`` suffix replaces the objective (``+diverse`` also prunes the pool's most redundant snapshot
    instead of its oldest; raises ValueError where it cannot run)."""
    base, _, objective = condition.partition("+")
    changes: dict[str, Any] = {"objective": objective} if objective else {}
    if base == "prioritised":
        changes["draw_rule"] = "prioritised"
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
        fixed = {
            "frozen": {"frozen-modal-greedy": "persuadee?decoding=greedy&personas=modal"},
            "verbalized": {"verbalized": f"verbalized:persuadee?temperature=1.0&floor={config.verbalized_floor!r}"
                                         f"&tau={config.verbalized_tau!r}"},
            "failure": {"base": BASE_SPEC},
        }
        fixed["rotation"] = {**fixed["frozen"], **fixed["verbalized"], "sampled": BASE_SPEC}
        return fixed.get(condition) or {f"{condition.partition('+')[0]}-{i}": "trainable:persuadee?temperature=1.0"
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


@contextlib.contextmanager
def one_server(config: CollapseConfig) -> Iterator[CollapseConfig]:
    """``config`` with ``--model.generator vllm:launch`` made one vLLM server for all its runs (started here,
    stopped on leaving): each run's policy, simulators and panel LLM members generate there (the policy and
    co-trained simulators under their versioned adapters); any other config as it is. The server takes the
    largest adapter rank, as many adapters in a batch as :func:`served_adapters` counts, and on a GPU
    ``TRAINER_GPU_SHARE`` of its memory (the runs train on the same GPU)."""
    if config.level != "text" or config.model.generator != "vllm:launch":
        yield config
        return
    from simpop.agents.vllm_backend import lora_rank_limit
    from simpop.agents.vllm_server import TRAINER_GPU_SHARE, VLLMServer
    from simpop.seat import SimulatorSpec

    specs = [SimulatorSpec.parse(spec) for c in config.conditions for spec in simulator_specs(c, config).values()]
    rank = max([config.model.lora_r] + [spec.params["lora_r"] for spec in specs if spec.kind == "trainable"])
    server = VLLMServer(config.model.model, max_loras=served_adapters(config), max_lora_rank=lora_rank_limit(rank),
                        gpu_memory_utilization=TRAINER_GPU_SHARE).start()
    try:
        yield dataclasses.replace(config, model=dataclasses.replace(config.model, generator=f"vllm:{server.url}"))
    finally:
        server.stop()


def served_adapters(config: CollapseConfig) -> int:
    """The most LoRA adapters ``config``'s runs generate under at once on one server: per run its policy, its
    co-trained simulators and their checkpoint pool's snapshots (each loaded while it is in the pool), times the
    runs that go at once (``workers``)."""
    def per_run(condition: str) -> int:
        if condition.partition("+")[0] not in COTRAINED:
            return 1
        cotrain = condition_cotrain(condition, config.cotrain)
        return 1 + cotrain.population_size + cotrain.pool_size

    runs = min(config.workers, len(config.conditions) * config.seeds)
    return runs * max(per_run(condition) for condition in config.conditions)


def policy_configs(config: CollapseConfig, seed: int) -> tuple[ModelConfig, GRPOConfig]:
    """The policy model and GRPO settings of one seed's runs (every condition)."""
    return dataclasses.replace(config.model, adapter=f"policy{seed}"), dataclasses.replace(config.grpo, seed=seed)


def write_card(run_dir: Path, config: CollapseConfig, condition: str, seed: int, experiment: str = "collapse") -> None:
    """The run folder's ``config.yaml`` and ``run.json`` (:func:`simpop.train.loop.write_run_card`)."""
    from simpop.train.loop import write_run_card

    trainer = {"failure": "adaptive-pool"}.get(condition, "cotrain" if condition.partition("+")[0] in COTRAINED
                                               else "grpo")
    write_run_card(run_dir, {"trainer": trainer, "env": config.env_id, "env_args": config.env_kwargs(),
                             "experiment": experiment, "condition": condition, "seed": seed,
                             "simulators": simulator_specs(condition, config)},
                   *policy_configs(config, seed))


def build_trainer(condition: str, config: CollapseConfig, seed: int, env: Any,
                  backends: dict[str, Any] | None = None):
    """The trainer of one condition and seed: GRPO against the condition's simulator or rotation, the failure-driven
    pool (:func:`pool_trainer`), or co-training (``backends``: the simulators' loaded models,
    :func:`simulator_backends`)."""
    from simpop.agents.policy import build_policy
    from simpop.agents.vllm_backend import on_policy_server
    from simpop.seat import Trainable
    from simpop.simulators.population import Population
    from simpop.simulators.registry import build_many
    from simpop.train.cotrain import CoTrainer
    from simpop.train.grpo import GRPOTrainer

    model, grpo = policy_configs(config, seed)
    policy = build_policy(env, model, grpo.sampling(), seed)
    backends = on_policy_server(simulator_backends(config) if backends is None else backends, policy)
    if condition == "failure":
        return pool_trainer(config, seed, env, policy, grpo, simulator_specs("failure", config), "failure-pool")
    simulators = build_many(simulator_specs(condition, config), env, backends)
    if condition in ("frozen", "verbalized"):
        return GRPOTrainer(config.env_id, policy, simulators[0], grpo, env_kwargs=config.env_kwargs())
    if condition == "rotation":
        rotation = Population(simulators, rule="rotate", rotate_every=ROTATE_EVERY, name="rotation")
        return GRPOTrainer(config.env_id, policy, rotation, grpo, env_kwargs=config.env_kwargs())
    trainable = [s for s in simulators if isinstance(s, Trainable)]
    if len(trainable) != len(simulators):
        raise TypeError(f"condition {condition}: co-training needs trainable simulators, got "
                        f"{[type(s).__name__ for s in simulators if not isinstance(s, Trainable)]}")
    return CoTrainer(GRPOTrainer(config.env_id, policy, None, grpo, env_kwargs=config.env_kwargs()), trainable,
                     condition_cotrain(condition, config.cotrain))


def pool_trainer(config: CollapseConfig, seed: int, env: Any, policy: Any, grpo: GRPOConfig, members: dict[str, str],
                 name: str, heldout: Any = None, pool: Any = None, grow_every: int = GROW_EVERY, protected: Any = (),
                 grow: bool = True):
    """GRPO against a pool of simulators (``members``: name -> spec) with :class:`~simpop.train.pool.PoolGrower`'s
    failure-driven growth (``grow``): every ``grow_every`` updates the policy's losses on the probe panel
    (:func:`probe_specs`) become new members, checked against the held-out panel (``heldout``; default
    :func:`build_panel`); the pool reweighted and pruned by ``pool`` (default :class:`~simpop.train.pool.PoolConfig`),
    never the ``protected`` members. The ``failure`` condition is its defaults on the base persuadee;
    :mod:`simpop.experiments.adaptive` varies it."""
    from simpop.simulators.population import Population
    from simpop.simulators.registry import build_many, load_panel
    from simpop.train.grpo import GRPOTrainer
    from simpop.train.pool import AdaptivePoolTrainer, PoolConfig, PoolGrower

    inner = GRPOTrainer(config.env_id, policy, Population(build_many(members, env), name=name), grpo,
                        env_kwargs=config.env_kwargs())
    grower = None
    if grow:
        probe = load_panel({"name": "probe", "members": probe_specs()}, env)
        grower = PoolGrower(config.env_id, env, inner, probe, build_panel(config, env) if heldout is None else heldout,
                            config=pool or PoolConfig(), seed=seed, env_kwargs=config.env_kwargs(), protected=protected)
    return AdaptivePoolTrainer(inner, grower, grow_every, env=env)


def probe_specs() -> dict[str, str]:
    """Name -> spec of each member of the probe panel (the failure-driven pool grows from the policy's losses there)."""
    return {f"probe-{m}": f"persuadee:{m}?temperature={PROBE_TEMPERATURE!r}" for m in PROBE_MODELS}


def build_panel(config: CollapseConfig, env: Any, backends: dict[str, Any] | None = None, name: str = "heldout"):
    """The held-out :class:`~simpop.simulators.population.Panel` (same for every condition and seed), or the
    :func:`extra_panels` one called ``name``."""
    from simpop.simulators.registry import load_panel

    members = panel_specs(config) if name == "heldout" else extra_panels(config)[name]
    return load_panel({"name": f"p4g-{name}", "members": members}, env,
                      simulator_backends(config) if backends is None else backends)


def evaluate_run(env_id: str, trainer: Any, panel: Any, episodes: int, seed: int, env_kwargs: dict[str, Any],
                 pool: Any = None) -> tuple[dict[str, Any], Any, Any]:
    """One evaluation of a run: the policy on the held-out ``panel`` and on its own training simulator (the same
    dialogues: ``seed``); the record's success, gap and entropy fields, and both results (outcomes, no episode
    records). ``pool``: the run's :class:`~simpop.evaluation.panel.EnvPool`, reused from one evaluation to the
    next."""
    from simpop.evaluation.panel import evaluate

    held = evaluate(env_id, trainer.policy, panel, episodes, seed, env_kwargs, pool=pool, records=False)
    train = evaluate(env_id, trainer.policy, trainer.training_simulator, episodes, seed, env_kwargs, pool=pool,
                     records=False)
    record = {"heldout_success": held.success, "train_success": train.success,
              "collapse_gap": train.success - held.success, "policy_entropy": held.entropy,
              **{f"heldout/{k}": v for k, v in held.per_member.items()}}
    return record, held, train
