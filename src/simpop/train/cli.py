"""``simpop train``: train a policy (GRPO; other trainers add their subcommand to :data:`TRAINERS`).

::

    simpop train grpo --env simpop/PersuasionAct-v0 --simulator native --updates 50 --out runs/grpo
    simpop train grpo --env simpop/Persuasion-v0 --simulator frozen:smollm2 --updates 3 --out runs/text \\
        --env-arg max_turns=3 --max-new-tokens 24 --group-size 2 --scenarios-per-update 2
    simpop train grpo ... --config grpo.yaml --lr 3e-5      # YAML values, overridden by flags
    simpop train grpo ... --out runs/grpo --resume          # continue a killed run to --updates

Every field of the trainer's config dataclass is a flag (``--help`` lists them with their defaults
and documentation). The run folder gets ``config.yaml`` (the resolved config, reusable with
``--config``), ``run.json`` (env, simulator, env arguments), ``metrics.jsonl``, TensorBoard events
under ``tb/`` and checkpoints under ``checkpoints/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: trainer name -> (configure(parser), run(args) -> int, one-line help).
TRAINERS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]] = {}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trainer", required=True, metavar="TRAINER")
    for name, (configure_trainer, _, help_text) in TRAINERS.items():
        configure_trainer(sub.add_parser(name, help=help_text, description=help_text))


def run(args: argparse.Namespace) -> int:
    return TRAINERS[args.trainer][1](args)


# ------------------------------------------------------------------------ shared by every trainer
def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every training run has besides its config: env, simulator, budget, output."""
    run = parser.add_argument_group("run")
    run.add_argument("--env", required=True, help="registered env id (see `simpop envs`)")
    run.add_argument("--simulator", default="native",
                     help="user-seat simulator spec, e.g. native (the env's own; the default), frozen:smollm2, "
                          "verbalized:smollm2?k=5 (see simpop.simulators.spec)")
    run.add_argument("--updates", type=int, required=True, help="total number of updates of the run")
    run.add_argument("--out", type=Path, required=True, help="run folder (metrics, checkpoints, config)")
    run.add_argument("--config", type=Path, help="YAML file of config fields (flags given here win)")
    run.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    run.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="env constructor argument (YAML value), repeatable, e.g. --env-arg max_turns=4")
    run.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice; on a busy CPU, 1 "
                                                 "can be many times faster)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def env_kwargs(pairs: list[str]) -> dict[str, Any]:
    """``["max_turns=4", ...]`` -> ``{"max_turns": 4}`` (values parsed as YAML scalars)."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-arg takes KEY=VALUE (e.g. max_turns=4), got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


def prepare_run_dir(out: Path, resume: bool, config: Any, run_info: dict[str, Any]) -> None:
    """Check that ``out`` fits a new or resumed run, then write ``config.yaml`` and ``run.json``."""
    from simpop.train import checkpoint
    from simpop.train.config import load_yaml, save_yaml, to_dict

    config_path, info_path = out / "config.yaml", out / "run.json"
    if resume:
        if config_path.exists():
            saved = load_yaml(config_path, type(config))
            changed = {k: (saved[k], v) for k, v in to_dict(config).items() if saved.get(k) != v}
            if changed:
                raise ValueError(f"--resume with different settings than the run in {out}: "
                                 + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
                                 + f"; pass the same flags (or --config {config_path}), or use a new --out")
        if info_path.exists():
            saved_info = json.loads(info_path.read_text())
            if saved_info != run_info:
                raise ValueError(f"--resume with a different env/simulator than the run in {out}: "
                                 f"{saved_info} vs {run_info}; use the same flags or a new --out")
    elif checkpoint.latest(out) is not None or (out / "metrics.jsonl").exists():
        raise ValueError(f"{out} already holds a run; pass --resume to continue it, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    save_yaml(config, config_path)
    info_path.write_text(json.dumps(run_info, indent=2) + "\n")


def build_simulator(spec: str, env: Any):
    """The user-seat simulator for a spec string (``native`` = the env's registered default)."""
    from simpop.simulators.spec import build_simulator as build

    return build(spec, env=env)


def build_policy(env: Any, config: Any):
    """An :class:`ActPolicy` for ``Discrete`` policy seats, else an :class:`LLMPolicy` on ``config.model``."""
    from gymnasium import spaces

    from simpop.train.grpo import ActPolicy, LLMPolicy

    if isinstance(env.action_space(env.policy_seat), spaces.Discrete):
        return ActPolicy.for_env(env, config.hidden_size, config.seed)
    from simpop.agents.transformers_backend import TransformersBackend

    backend = TransformersBackend(config.model, dtype=config.dtype, trainable=not config.lora)
    return LLMPolicy(backend, config.sampling(), lora=config.lora, lora_r=config.lora_r, lora_alpha=config.lora_alpha)


def summarise(history: list[dict[str, float]], keys: tuple[str, ...]) -> str:
    """A one-line view of the last update's metrics."""
    last = history[-1] if history else {}
    return "  ".join(f"{k}={last[k]:.4g}" for k in keys if k in last)


# ------------------------------------------------------------------------------------------- grpo
def configure_grpo(parser: argparse.ArgumentParser) -> None:
    from simpop.train.config import add_arguments
    from simpop.train.grpo import GRPOConfig

    add_run_arguments(parser)
    add_arguments(parser, GRPOConfig)


def run_grpo(args: argparse.Namespace) -> int:
    import torch

    import simpop
    from simpop.train.config import build
    from simpop.train.grpo import GRPOConfig, GRPOTrainer

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:  # setup errors are the user's to fix: say what, without a traceback
        config = build(GRPOConfig, args, yaml_path=args.config)
        kwargs = env_kwargs(args.env_arg)
        env = simpop.make(args.env, **kwargs)
        simulator = build_simulator(args.simulator, env)
        prepare_run_dir(args.out, args.resume, config,
                        {"trainer": "grpo", "env": args.env, "simulator": args.simulator, "env_kwargs": kwargs})
    except (ValueError, KeyError, TypeError, FileNotFoundError) as error:
        print(f"simpop train grpo: error: {error}", file=sys.stderr)
        return 2
    trainer = GRPOTrainer(args.env, build_policy(env, config), simulator, config,
                          env_kwargs=kwargs, run_dir=args.out, resume=args.resume)
    remaining = args.updates - trainer.update_count
    if remaining <= 0:
        print(f"{args.out}: already at update {trainer.update_count} of {args.updates}; nothing to do")
        return 0
    trainer.train(remaining, progress=not args.no_progress)
    print(f"{args.out}: update {trainer.update_count}/{args.updates}  "
          + summarise(trainer.history, ("reward_mean", "success", "policy_entropy", "zero_var_frac", "kl", "loss")))
    return 0


TRAINERS["grpo"] = (configure_grpo, run_grpo, "multi-turn GRPO on the policy seat (text or act level)")
