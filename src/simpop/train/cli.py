"""``simpop train TRAINER``: one entry that builds any trainer from its config classes and runs the loop.

::

    simpop train grpo --env simpop/PersuasionAct-v0 --simulator native --updates 50 --out runs/grpo
    simpop train grpo --env simpop/PersuasionAct-v0 --algorithm dapo --updates 50 --out runs/dapo
    simpop train grpo --env simpop/Persuasion-v1 --simulator frozen:smollm2 --updates 3 --out runs/text \\
        --env-arg max_turns=3 --max-new-tokens 24 --group-size 2 --scenarios-per-update 2 --lora
    simpop train grpo ... --config run.yaml --lr 3e-5      # YAML values, overridden by flags
    simpop train grpo ... --out runs/grpo --resume          # continue a killed run to --updates
    simpop train grpo ... --panel panel.yaml --eval-every 10   # held-out panel success in metrics.jsonl
    simpop train grpo --env simpop/PersuasionAct-v0 ... --panel p4g-act-v1   # a shipped named panel
    simpop train grpo --env simpop/PersuasionAct-v0 ... --ray --ray-workers 2   # rollouts in Ray workers
    simpop train cotrain --env simpop/PersuasionAct-v0 --simulator trainable:persuadee --updates 50 --out runs/co
    simpop train cotrain --env simpop/PersuasionAct-v0 --updates 50 --out runs/population \\
        --population-size 3 --pool-size 6 --pool-sample-prob 0.25 --snapshot-every 5
    simpop train cotrain --env simpop/Persuasion-v1 --simulator "trainable:smollm2?temperature=1.0" --lora \\
        --updates 3 --out runs/cotrain-text --env-arg max_turns=2 --max-new-tokens 16
    simpop train ppo --env simpop/PersuasionAct-v0 --updates 100 --out runs/ppo --n-envs 8 --n-steps 64

A trainer is one entry of :data:`TRAINERS`: its config classes (every field of each is a ``--flag``;
names are disjoint within a trainer, argparse refuses a clash) and a ``build`` function. The run folder
gets ``config.yaml`` (every config, by section; reusable with ``--config``, which also takes a flat
mapping), ``run.json`` (trainer, env, simulator, env arguments, panel: a named panel's name or the panel
file's absolute path, evaluation episodes, the panel's held-out check with what each look-alike member shares with
training), ``metrics.jsonl``, checkpoints under ``checkpoints/``
(:func:`simpop.train.loop.run`) and what ``--report-to`` chooses: TensorBoard events under ``tb/`` (the default),
a Weights & Biases run (``wandb``), both (``tensorboard,wandb``) or neither (``none``). A run holds the folder's
writer lock (:func:`simpop.files.run_lock`) from before it writes there to its end, so a second command on it (a
``--resume`` while the run lives) is refused with one line.

A run whose every GRPO group had equal rewards for :data:`~simpop.train.monitor.NO_GRADIENT_WINDOW` updates in a
row (no gradient) logs one warning line with what to change and a ``no_gradient_warning`` record
(:class:`~simpop.train.monitor.NoGradientWatch`), and the summary printed at the end repeats it.

When the loop finishes, the final policy is exported to ``final/`` (:func:`simpop.agents.export.export_policy`;
``--no-export`` skips it): a text policy as a standard HF model folder (a LoRA adapter merged into the base,
or with ``--export-adapter`` the PEFT adapter folder plus a reference to its base) that ``simpop eval``,
``simpop serve transformers:RUN/final`` and vLLM load; an act-level policy (GRPO's ``ActPolicy``, PPO's
actor-critic) as ``policy.pt`` + its constructor arguments in ``simpop_export.json`` (not an HF model;
:func:`simpop.agents.export.load_exported` reads it back). A resumed run that had nothing left to do
exports only if ``final/`` is missing (e.g. the process was killed while exporting).

A model server that fails mid-run (an OpenAI-compatible endpoint or vLLM, once the client's retries with back-off
are spent) ends the run with one line naming the failure and the last checkpoint kept, and exit code 1; rerunning
the same command with ``--resume`` once the server is back finishes the run as an uninterrupted one would.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simpop.user_input import THREADS, integer

#: What a trainer's build function gets: env id, env, simulator spec, {section: config}, env arguments.
Build = Callable[[str, Any, str, dict[str, Any], dict[str, Any]], Any]


@dataclass(frozen=True)
class TrainerEntry:
    """One ``simpop train`` subcommand.

    Attributes:
        help: One line for ``--help``.
        configs: Section name -> ``"module:Class"`` of a config dataclass; each field becomes a flag.
        build: ``"module:function"`` building the :class:`~simpop.train.loop.Trainer` (see :data:`Build`).
        default_simulator: ``--simulator`` when none is given.
        summary: Metrics printed after the run.
    """

    help: str
    configs: dict[str, str]
    build: str
    default_simulator: str = "native"
    summary: tuple[str, ...] = ("reward_mean", "success", "policy_entropy", "zero_var_frac")


_MODEL, _LOOP = "simpop.agents.policy:ModelConfig", "simpop.train.loop:LoopConfig"

#: trainer name -> entry. A new trainer (or variant with its own config) adds one entry here.
TRAINERS: dict[str, TrainerEntry] = {
    "grpo": TrainerEntry("multi-turn GRPO (or Dr. GRPO, DAPO, REINFORCE++: --algorithm) on the policy seat",
                         {"grpo": "simpop.train.grpo:GRPOConfig", "model": _MODEL, "loop": _LOOP,
                          "rollout": "simpop.rollout_ray:RayConfig"},
                         "simpop.train.cli:build_grpo", summary=("reward_mean", "success", "policy_entropy",
                                                                 "zero_var_frac", "kl", "loss")),
    "cotrain": TrainerEntry("co-training of the policy with trainable simulators (trainable:KIND or trainable:MODEL)",
                            {"grpo": "simpop.train.grpo:GRPOConfig", "cotrain": "simpop.train.cotrain:CoTrainConfig",
                             "model": _MODEL, "loop": _LOOP},
                            "simpop.train.cli:build_cotrain", default_simulator="trainable:persuadee",
                            summary=("reward_mean", "success", "policy_entropy", "sim_success", "sim_kl", "sim_loss")),
    "selfplay": TrainerEntry("self-play GRPO: the policy also fills the user seat (--simulator self or self@pool)",
                             {"grpo": "simpop.train.grpo:GRPOConfig", "selfplay": "simpop.train.selfplay:SelfPlayConfig",
                              "model": _MODEL, "loop": _LOOP},
                             "simpop.train.cli:build_selfplay", default_simulator="self",
                             summary=("reward_mean", "success", "user/reward_mean", "user/success", "loss",
                                      "user/loss")),
    "ppo": TrainerEntry("PPO on the policy seat of an act-level env", {"ppo": "simpop.train.ppo:PPOConfig",
                                                                       "loop": _LOOP},
                        "simpop.train.cli:build_ppo",
                        summary=("episode_return", "entropy", "policy_loss", "value_loss", "clip_frac")),
}


def _load(entry_point: str) -> Any:
    from simpop.envs.registration import load

    return load(entry_point)


def configure(parser: argparse.ArgumentParser) -> None:
    from simpop.train.config import add_arguments

    sub = parser.add_subparsers(dest="trainer", required=True, metavar="TRAINER")
    for name, entry in TRAINERS.items():
        p = sub.add_parser(name, help=entry.help, description=entry.help)
        run = p.add_argument_group("run")
        run.add_argument("--env", required=True, help="registered env id (see `simpop envs`)")
        run.add_argument("--simulator", action="append", default=None, metavar="SPEC",
                         help=f"user-seat simulator spec (default {entry.default_simulator}); repeat it for a uniform "
                              "population (cotrain: one trainable spec, built population-size times); see simpop.seat")
        run.add_argument("--population-rule", default="uniform",
                         choices=["uniform", "weighted", "prioritised", "rotate"],
                         help="how a population of several --simulator specs picks a member per dialogue "
                              "(simpop.simulators.population.Population); rotate: members take turns")
        run.add_argument("--rotate-every", type=integer(0, 1_000_000_000), default=0, metavar="N",
                         help="--population-rule rotate: the next member every N updates (0: round robin per dialogue)")
        run.add_argument("--panel", help="held-out simulators to evaluate on every --eval-every updates: a named "
                                         "panel (simpop.evaluation.panels, e.g. p4g-act-v1) or a panel YAML file "
                                         "(see simpop.simulators.registry)")
        run.add_argument("--strict-heldout", action="store_true",
                         help="refuse a --panel member that shares any axis (persona set, decoding, model) with the "
                              "training simulator, not only one that is a training simulator (Panel.check_disjoint)")
        run.add_argument("--eval-episodes", type=integer(1, 100_000), default=32, help="dialogues per panel member and evaluation")
        run.add_argument("--updates", type=integer(0, 1_000_000_000), required=True, help="total number of updates of the run")
        run.add_argument("--out", type=Path, required=True, help="run folder (metrics, checkpoints, config)")
        run.add_argument("--config", type=Path, help="YAML file of config fields, by section or flat (flags win)")
        run.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
        run.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                         help="env constructor argument (YAML value), repeatable, e.g. --env-arg max_turns=4")
        run.add_argument("--threads", type=THREADS, help="torch CPU threads (default: torch's choice; on a busy CPU, 1 "
                                                     "can be many times faster)")
        run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
        run.add_argument("--no-export", action="store_true", help="do not export the final policy to OUT/final")
        run.add_argument("--export-adapter", action="store_true",
                         help="LoRA policies: export the PEFT adapter + a base reference instead of merged weights")
        for cls in entry.configs.values():
            add_arguments(p, _load(cls))


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as held:  # what _run holds to the end: --out's writer lock
        return _run(args, held)


def _run(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    from simpop.agents.vllm_server import VLLMUnavailable
    from simpop.files import run_lock

    entry = TRAINERS[args.trainer]
    setup_errors: tuple[type[BaseException], ...] = (ValueError, KeyError, TypeError, OSError, VLLMUnavailable,
                                                     *backend_errors())
    try:  # setup errors are the user's to fix: say what, without a traceback
        import simpop
        from simpop.envs.registration import parse_env_args
        from simpop.evaluation.trackers import require as require_trackers

        check_run_flags(args)
        if args.threads is not None:
            import torch

            torch.set_num_threads(args.threads)
        configs = build_configs(entry, args)
        require_trackers(configs["loop"].report_to)
        kwargs = parse_env_args(args.env_arg)
        env = simpop.make(args.env, **kwargs)
        simulator = args.simulator or [entry.default_simulator]
        spec: Any = population_spec(simulator, args.population_rule, args.rotate_every)
        check_simulator_fits(spec, env, args.env)
        panel = resolve_panel(args.panel, args.env) if args.panel else ""
        trainer = _load(entry.build)(args.env, env, spec, configs, kwargs)
        evaluate, heldout = panel_evaluation(args, env, trainer, kwargs, panel) if panel else (None, None)
        trainer, probe, grow = monitor_hooks(args, env, trainer, kwargs, configs["loop"], panel)
        held.enter_context(run_lock(args.out))  # one writer per run folder, before it is touched
        try:
            prepare_run_dir(args.out, args.resume, configs, {"trainer": args.trainer, "env": args.env,
                                                             "simulator": spec, "env_kwargs": kwargs, "panel": panel,
                                                             "eval_episodes": args.eval_episodes,
                                                             **({"heldout_check": heldout} if heldout else {}),
                                                             **_model_dtype(trainer)})
        except OSError as error:
            raise ValueError(f"--out {args.out}: cannot write the run folder ({error})") from None
    except setup_errors as error:
        from simpop.user_input import error_line

        print(f"simpop train {args.trainer}: error: {error_line(error)}", file=sys.stderr)
        return 2
    from simpop.evaluation.trackers import TrackerError
    from simpop.train.loop import run as run_loop
    from simpop.train.monitor import no_gradient_note

    try:
        history = run_loop(trainer, args.updates, args.out, config=configs["loop"], resume=args.resume,
                           evaluate=evaluate, progress=not args.no_progress, desc=args.trainer, probe=probe,
                           grow=grow)
    except TrackerError as error:  # W&B could not start its run (not logged in, ...): nothing has been trained
        print(f"simpop train {args.trainer}: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk, a folder removed under the run: finished checkpoints are kept
        from simpop.user_input import error_line

        print(f"simpop train {args.trainer}: error: writing the run in {args.out} failed ({error_line(error)}); "
              f"its finished checkpoints are kept: fix that, then rerun the same command with --resume",
              file=sys.stderr)
        return 2
    except backend_errors() as error:  # a model server died mid-run (after its retries): the checkpoints are kept
        print(backend_failure(args, error), file=sys.stderr)
        return 1
    if not history:
        print(f"{args.out}: already at update {trainer.update_count} of {args.updates}; nothing to do")
    else:
        last = history[-1]
        print(f"{args.out}: update {trainer.update_count}/{args.updates}  "
              + "  ".join(f"{k}={last[k]:.4g}" for k in entry.summary if k in last))
    if note := no_gradient_note([json.loads(line) for line in (args.out / "metrics.jsonl").read_text().splitlines()
                                 if line.strip()]):
        print(f"{args.out}: {note}")
    if not args.no_export and (history or not (args.out / "final").exists()):
        try:
            export_final(trainer, args)
        except Exception as error:  # the run itself is complete and checkpointed: say how to retry the export
            print(f"simpop train {args.trainer}: error: exporting the final policy to {args.out / 'final'} failed: "
                  f"{type(error).__name__}: {error}. The run and its checkpoints are intact; rerun the same command "
                  f"with --resume to export again", file=sys.stderr)
            return 1
    return 0


def backend_errors() -> tuple[type[BaseException], ...]:
    """What a model server that fails mid-run raises once its retries are spent (an OpenAI-compatible endpoint,
    vLLM, a launched vLLM server that exited); also when raised in a Ray worker (Ray's error subclasses them)."""
    from simpop.agents.openai_backend import RemoteBackendError
    from simpop.agents.vllm_server import VLLMServerError

    return RemoteBackendError, VLLMServerError


def backend_failure(args: argparse.Namespace, error: BaseException) -> str:
    """The one line ``simpop train`` prints when a model server fails mid-run: what failed, the last checkpoint
    kept, and how to finish the run."""
    from simpop.checkpoint import by_step
    from simpop.user_input import error_line

    steps = by_step(args.out)
    kept = (f"the checkpoints up to update {max(steps)} are kept in {args.out}" if steps
            else f"no update had finished, so {args.out} holds no checkpoint")
    return (f"simpop train {args.trainer}: error: a model server failed during the run ({error_line(error)}); "
            f"{kept}: once the server is back, rerun the same command with --resume")


def export_final(trainer: Any, args: argparse.Namespace) -> Path:
    """Export the trainer's policy to ``OUT/final`` (replacing an older export atomically) and say where."""
    from simpop.agents.export import export_policy, read_manifest
    from simpop.train.ppo import ActorCritic

    policy = trainer.policy
    init_args = None
    if isinstance(policy, ActorCritic):
        # Rebuilt from its layer sizes; the value head is exported too (it is part of the module).
        first, last = policy.pi[0], policy.pi[-1]
        init_args = {"obs_dim": first.in_features, "n_actions": last.out_features, "hidden_size": first.out_features}
    out = export_policy(policy, args.out / "final", merge=not args.export_adapter, step=trainer.update_count,
                        overwrite=True, init_args=init_args,
                        metadata={"trainer": args.trainer, "env": args.env, "run": str(args.out.absolute())})
    manifest = read_manifest(out)
    what = {"merged": "HF model (LoRA merged)", "adapter": "PEFT adapter + base reference", "full": "HF model",
            "act-mlp": "act-level MLP (policy.pt, not an HF model)",
            "torch-module": f"{manifest['policy']} (policy.pt, not an HF model)"}[manifest["kind"]]
    print(f"{args.out}: exported the final policy (update {trainer.update_count}) to {out}: {what}")
    return out


# ------------------------------------------------------------------------------------------ builders
def build_grpo(env_id: str, env: Any, spec: Any, configs: dict[str, Any], kwargs: dict[str, Any]):
    from simpop.agents.policy import build_policy
    from simpop.simulators.registry import build_simulator
    from simpop.train.grpo import GRPOTrainer

    grpo = configs["grpo"]
    policy = build_policy(env, configs["model"], grpo.sampling(), grpo.seed)
    backends: dict[str, Any] = {}
    simulator = build_simulator(spec, env, backends)
    if getattr(policy, "generator", None) is not None:
        from simpop.agents.vllm_backend import on_policy_server

        served = on_policy_server(backends, policy)
        if served != backends:  # it uses the policy's base model: rebuilt to generate on the policy's server
            simulator = build_simulator(spec, env, served)
    trainer = GRPOTrainer(env_id, policy, simulator, grpo, env_kwargs=kwargs)
    if configs["rollout"].ray:  # the waves run in Ray workers that build their own envs and simulator from spec
        if isinstance(spec, dict) and spec.get("rule") == "rotate":
            raise ValueError("--ray builds a population in every worker, so a rotation's schedule would not be one; "
                             "run --population-rule rotate without --ray")
        from simpop.rollout_ray import RayRolloutEngine, import_ray

        try:
            import_ray()
        except ImportError as error:
            raise ValueError(f"--ray: {error}") from None
        trainer.engine = RayRolloutEngine(env_id, policy, simulator, grpo.n_envs, kwargs,
                                          config=configs["rollout"], simulator_spec=spec)
    return trainer


def build_cotrain(env_id: str, env: Any, spec: Any, configs: dict[str, Any], kwargs: dict[str, Any]):
    from simpop.seat import Trainable
    from simpop.simulators.registry import build_simulator
    from simpop.train.cotrain import CoTrainer

    if not isinstance(spec, str):
        raise ValueError("cotrain takes one --simulator spec (its population is population-size copies of it)")
    backends: dict[str, Any] = {}
    built = [build_simulator(spec, env, backends, name=f"cotrain-{i}") for i in range(configs["cotrain"].population_size)]
    simulators = [s for s in built if isinstance(s, Trainable)]
    if len(simulators) < len(built):
        raise ValueError(f"--simulator {spec} is not trainable; co-training needs trainable:KIND (e.g. "
                         f"trainable:persuadee on simpop/PersuasionAct-v0) or trainable:MODEL?temperature=1.0 "
                         f"(a LoRA adapter per simulator) on text envs")
    from simpop.agents.policy import build_policy
    from simpop.train.grpo import GRPOTrainer

    grpo = configs["grpo"]
    policy = build_policy(env, configs["model"], grpo.sampling(), grpo.seed)
    return CoTrainer(GRPOTrainer(env_id, policy, None, grpo, env_kwargs=kwargs), simulators, configs["cotrain"])


def build_selfplay(env_id: str, env: Any, spec: Any, configs: dict[str, Any], kwargs: dict[str, Any]):
    from simpop.agents.policy import build_policy
    from simpop.train.selfplay import SELF_KINDS, SelfPlayTrainer

    if spec not in SELF_KINDS:
        raise ValueError(f"selfplay's user seat is the policy: --simulator {' or '.join(SELF_KINDS)}, got {spec!r}")
    grpo, model = configs["grpo"], configs["model"]
    policy = build_policy(env, model, grpo.sampling(), grpo.seed)
    return SelfPlayTrainer(env_id, policy, spec, grpo, configs["selfplay"], env_kwargs=kwargs,
                           hidden_size=model.hidden_size)


def build_ppo(env_id: str, env: Any, spec: Any, configs: dict[str, Any], kwargs: dict[str, Any]):
    from simpop.simulators.registry import build_simulator
    from simpop.train.ppo import PPOTrainer

    # Each env copy gets its own simulator: copies step independently.
    return PPOTrainer(env_id, lambda: build_simulator(spec, env), configs["ppo"], env_kwargs=kwargs)


def resolve_panel(panel: str, env_id: str) -> str:
    """``--panel`` as stored in ``run.json``: a shipped panel's name (checked against the env), else the
    panel file's absolute path (it must exist)."""
    from simpop.evaluation.panels import named_panels, panel_definition

    if panel in named_panels():
        panel_definition(panel).check_env(env_id)
        return panel
    path = Path(panel).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"--panel {panel}: no such file, and not a named panel ({', '.join(named_panels())})")
    return str(path.resolve())


def panel_evaluation(args: argparse.Namespace, env: Any, trainer: Any, kwargs: dict[str, Any], panel_ref: str):
    """``(evaluate, heldout)``: ``evaluate(step)`` gives success on the ``--panel`` members and on the training
    simulator, and policy entropy; ``heldout`` is the panel's check against the training simulator (``--strict-
    heldout``: every axis differs), printed here and kept in ``run.json`` (None for a trainer without one)."""
    from simpop.envs.registration import make
    from simpop.evaluation.panel import EnvPool, evaluate
    from simpop.evaluation.panels import heldout_lines
    from simpop.simulators.population import look_alike_lines

    panel = load_any_panel(panel_ref, env, args.env)
    heldout = None
    if trainer.training_simulator is not None:
        alike = panel.check_disjoint([trainer.training_simulator], strict=args.strict_heldout)
        heldout = {"run": str(args.out), "strict": args.strict_heldout, "look_alikes": look_alike_lines(alike)}
        print(heldout_lines(panel.name, heldout))

    pool = EnvPool(lambda: make(args.env, **kwargs))  # one set of envs for every evaluation

    def evaluation(step: int) -> dict[str, Any]:
        held = evaluate(args.env, trainer.policy, panel, args.eval_episodes, seed=1_000_003, env_kwargs=kwargs,
                        pool=pool, records=False)
        train = evaluate(args.env, trainer.policy, trainer.training_simulator, args.eval_episodes, seed=1_000_003,
                         env_kwargs=kwargs, pool=pool, records=False)
        return {"heldout_success": held.success, "train_success": train.success,
                "collapse_gap": train.success - held.success, "policy_entropy": held.entropy,
                **{f"heldout/{k}": v for k, v in held.per_member.items()}}

    return evaluation, heldout


def load_any_panel(ref: str, env: Any, env_id: str):
    """A named panel or a panel YAML file."""
    from simpop.evaluation.panels import load_named_panel, named_panels
    from simpop.simulators.registry import load_panel

    return load_named_panel(ref, env, env_id=env_id) if ref in named_panels() else load_panel(ref, env)


def monitor_hooks(args: argparse.Namespace, env: Any, trainer: Any, kwargs: dict[str, Any], loop: Any,
                  panel_ref: str) -> tuple[Any, Any, Any]:
    """``(trainer, probe, grow)`` for the collapse monitor (:mod:`simpop.train.monitor`) from the ``--monitor``,
    ``--probe-*`` and ``--on-collapse`` flags. With ``add-simulators`` the trainer's simulator becomes a
    population and the trainer an :class:`~simpop.train.pool.AdaptivePoolTrainer` (member contributions recorded
    every update, the grown pool checkpointed, so ``--resume`` rebuilds it)."""
    if not loop.monitor:
        return trainer, None, None
    if not loop.probe_panel:
        raise ValueError("--monitor needs --probe-panel (a named panel or panel YAML, not the --panel)")
    probe_ref = resolve_panel(loop.probe_panel, args.env)
    if probe_ref == panel_ref:
        raise ValueError("--probe-panel must differ from --panel: acting on the held-out panel leaks the test")
    from simpop.evaluation.panel import evaluate

    probe_panel = load_any_panel(probe_ref, env, args.env)

    def probe(step: int) -> dict[str, float]:
        return evaluate(args.env, trainer.policy, probe_panel, loop.probe_episodes, seed=2_000_003,
                        env_kwargs=kwargs).per_member

    if loop.on_collapse != "add-simulators":
        return trainer, probe, None
    from simpop.simulators.population import Population
    from simpop.train.pool import AdaptivePoolTrainer, PoolGrower

    if not isinstance(trainer.training_simulator, Population):
        if not callable(getattr(trainer, "use_simulator", None)):
            raise ValueError(f"--on-collapse add-simulators needs a trainer whose simulator can become a pool "
                             f"(grpo); {args.trainer} has none")
        trainer.use_simulator(Population([trainer.training_simulator], name="pool"))
    heldout = load_any_panel(panel_ref, env, args.env) if panel_ref else None
    grower = PoolGrower(args.env, env, trainer, probe_panel, heldout, env_kwargs=kwargs)
    pooled = AdaptivePoolTrainer(trainer, grower, grow_every=None, env=env)  # the loop grows it on a warning
    return pooled, probe, lambda step, record: {k: v for k, v in grower(step, record).items() if k != "weights"}


# ------------------------------------------------------------------------------------------ helpers
def check_run_flags(args: argparse.Namespace) -> None:
    """Refuse a missing ``--config`` and an ``--out`` that cannot be written, before anything is built (numeric
    flags are checked against their ranges as they are parsed)."""
    if args.config is not None and not Path(args.config).is_file():
        raise ValueError(f"--config {args.config}: no such file")
    check_out_dir(args.out)


def check_out_dir(out: Path, flag: str = "--out") -> None:
    """Raise a ``ValueError`` naming ``flag`` if ``out`` is not a folder that exists or can be made and written."""
    import os
    import tempfile

    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"{flag} {out}: exists and is not a folder")
    existing = out
    while not existing.exists():  # the nearest folder that exists: out is made in it
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {out}: cannot make the folder, {existing} is not a folder")
    try:  # a real write (as root, or on a read-only file system, permission bits do not tell)
        os.rmdir(tempfile.mkdtemp(prefix=".simpop-write-check-", dir=existing))
    except OSError as error:
        raise ValueError(f"{flag} {out}: cannot write in {existing.absolute()} ({error.strerror or error})") from None


def population_spec(simulators: list[str], rule: str, rotate_every: int) -> Any:
    """The ``--simulator`` specs as one spec: a single spec, a uniform population (a list) or a population
    mapping with another rule (:func:`simpop.simulators.registry.build_simulator`)."""
    if rotate_every < 0:
        raise ValueError(f"--rotate-every must be >= 0 (0: round robin per dialogue), got {rotate_every}")
    if rotate_every and rule != "rotate":
        raise ValueError("--rotate-every only applies with --population-rule rotate")
    if rule != "uniform" and len(simulators) < 2:
        raise ValueError(f"--population-rule {rule} needs a population: repeat --simulator (e.g. one spec per model)")
    if len(simulators) == 1:
        return simulators[0]
    if rule == "uniform":
        return list(simulators)
    return {"members": list(simulators), "rule": rule, **({"rotate_every": rotate_every} if rule == "rotate" else {})}


def check_simulator_fits(spec: Any, env: Any, env_id: str) -> None:
    """Refuse, before any rollout, simulator specs that write text (LLM kinds) for an env whose user seat takes
    discrete acts (``frozen:smollm2`` on ``simpop/PersuasionAct-v0``)."""
    from simpop.seat import SimulatorSpec
    from simpop.simulators.registry import check_fits

    specs = ([spec] if isinstance(spec, str) else list(spec) if isinstance(spec, (list, tuple))
             else list(spec.get("members", [])) if isinstance(spec, dict) else [])
    for text in specs:
        if not isinstance(text, str) or text in ("self", "self@pool"):  # self-play: the policy, not a kind
            continue
        try:
            check_fits(SimulatorSpec.parse(text), env, env_id)
        except ValueError as error:
            raise ValueError(f"--simulator {text}: {error}") from None


def build_configs(entry: TrainerEntry, args: argparse.Namespace) -> dict[str, Any]:
    """Each of the trainer's configs from ``--config`` (by section or flat) and the flags given."""
    from simpop.train.config import build

    classes = {section: _load(cls) for section, cls in entry.configs.items()}
    yaml_values = _yaml_sections(args.config, classes) if args.config else {}
    return {section: build(cls, args, values=yaml_values.get(section, {})) for section, cls in classes.items()}


def _yaml_sections(path: Path, classes: dict[str, type]) -> dict[str, dict[str, Any]]:
    """``--config`` values per section; a flat mapping is split by field name (names are disjoint)."""
    from simpop.user_input import load_yaml_file

    data = load_yaml_file(path) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config file must be a YAML mapping (by section, or of field: value)")
    fields = {section: {f.name for f in dataclasses.fields(cls)} for section, cls in classes.items()}
    if set(data) <= set(classes) and all(isinstance(v, dict) for v in data.values()):
        out = {section: dict(values) for section, values in data.items()}
    else:
        out = {}
        for key, value in data.items():
            section = next((s for s, names in fields.items() if key in names), None)
            if section is None:
                raise ValueError(f"{path}: unknown field {key!r}; valid: {', '.join(sorted(set().union(*fields.values())))}")
            out.setdefault(section, {})[key] = value
    for section, values in out.items():
        unknown = sorted(set(values) - fields[section])
        if unknown:
            raise ValueError(f"{path}: unknown {section} fields {unknown}; valid: {', '.join(sorted(fields[section]))}")
    return out


def _model_dtype(trainer: Any) -> dict[str, str]:
    """``{"model_dtype": ...}``: a text policy's weights dtype as resolved (``--dtype auto``); {} otherwise."""
    dtype = getattr(getattr(trainer.policy, "backend", None), "dtype", None)
    return {"model_dtype": dtype} if dtype else {}


def prepare_run_dir(out: Path, resume: bool, configs: dict[str, Any], run_info: dict[str, Any]) -> None:
    """Check that ``out`` fits a new or resumed run, then write ``config.yaml`` and ``run.json``."""
    import yaml

    from simpop import checkpoint
    from simpop.train.config import changed_settings, to_dict
    from simpop.user_input import load_yaml_file

    resolved = {section: to_dict(config) for section, config in configs.items()}
    config_path, info_path = out / "config.yaml", out / "run.json"
    if resume:
        if config_path.exists():
            saved = load_yaml_file(config_path) or {}
            changed = [f"{section}.{change}" for section, config in configs.items()
                       for change in changed_settings(saved.get(section) or {}, config, type(config)(), values=True)]
            if changed:
                raise ValueError(f"--resume with different settings than the run in {out}: " + ", ".join(changed)
                                 + f"; pass the same flags (or --config {config_path}), or use a new --out")
        if info_path.exists():
            saved_info = json.loads(info_path.read_text())
            # A run.json from before a field existed does not record it: compare what it does record; such a
            # run stored --panel as typed (relative to where it was started, taken to be here).
            if saved_info.get("panel") and "eval_episodes" not in saved_info:
                saved_info["panel"] = str(Path(saved_info["panel"]).expanduser().resolve())
            # model_dtype is what --dtype auto resolved to on the machine: a resume may run elsewhere.
            # heldout_check follows from the compared panel and simulator (and --strict-heldout, which may change).
            compared = [k for k in run_info if k in saved_info and k not in ("model_dtype", "heldout_check")]
            if {k: run_info[k] for k in compared} != {k: saved_info[k] for k in compared}:
                raise ValueError(f"--resume with a different env/simulator/panel than the run in {out}: "
                                 f"{saved_info} vs {run_info}; use the same flags or a new --out")
    elif checkpoint.latest(out) is not None or (out / "metrics.jsonl").exists():
        raise ValueError(f"{out} already holds a run; pass --resume to continue it, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(resolved, sort_keys=False))
    info_path.write_text(json.dumps(run_info, indent=2) + "\n")
