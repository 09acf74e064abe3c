"""``simpop train``: train a policy (GRPO, co-training, PPO; a new trainer adds its subcommand to :data:`TRAINERS`).

::

    simpop train grpo --env simpop/PersuasionAct-v0 --simulator native --updates 50 --out runs/grpo
    simpop train grpo --env simpop/Persuasion-v0 --simulator frozen:smollm2 --updates 3 --out runs/text \\
        --env-arg max_turns=3 --max-new-tokens 24 --group-size 2 --scenarios-per-update 2
    simpop train grpo ... --config grpo.yaml --lr 3e-5      # YAML values, overridden by flags
    simpop train grpo ... --out runs/grpo --resume          # continue a killed run to --updates
    simpop train cotrain --env simpop/PersuasionAct-v0 --updates 50 --out runs/cotrain --sim-lr 0.05
    simpop train cotrain --env simpop/PersuasionAct-v0 --updates 50 --out runs/population \\
        --population-size 3 --pool-size 6 --pool-sample-prob 0.25 --snapshot-every 5
    simpop train cotrain --env simpop/Persuasion-v0 --simulator "frozen:smollm2?temperature=1.0" --lora \\
        --updates 3 --out runs/cotrain-text --env-arg max_turns=2 --max-new-tokens 16
    simpop train cotrain ... --config grpo.yaml --cotrain-config cotrain.yaml   # the two configs' YAML files
    simpop train ppo --env simpop/PersuasionAct-v0 --updates 100 --out runs/ppo --n-envs 8 --n-steps 64

Every field of the trainer's config dataclass is a flag (``--help`` lists them with their defaults
and documentation). The run folder gets ``config.yaml`` (the resolved config, reusable with
``--config``), ``run.json`` (env, simulator, env arguments), ``metrics.jsonl``, TensorBoard events
under ``tb/`` and checkpoints under ``checkpoints/``. ``cotrain`` has two configs: the policy's
:class:`~simpop.train.grpo.GRPOConfig` (``--config``, ``config.yaml``) and the simulators'
:class:`~simpop.train.cotrain.CoTrainConfig` (``--cotrain-config``, ``cotrain.yaml``); their field
names are disjoint, so both sets of flags are plain ``--field-name``. ``--resume`` works for every trainer.
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


def prepare_run_dir(out: Path, resume: bool, config: Any, run_info: dict[str, Any],
                    extra_configs: dict[str, tuple[str, Any]] | None = None) -> None:
    """Check that ``out`` fits a new or resumed run, then write ``config.yaml`` and ``run.json``.

    ``extra_configs`` (file name -> (its YAML flag, config)) are further configs of the run, e.g.
    ``{"cotrain.yaml": ("--cotrain-config", cotrain_config)}``, saved and checked like ``config``.
    """
    from simpop.train import checkpoint
    from simpop.train.config import load_yaml, save_yaml, to_dict

    configs = {"config.yaml": ("--config", config), **(extra_configs or {})}
    info_path = out / "run.json"
    if resume:
        for name, (flag, run_config) in configs.items():
            config_path = out / name
            if not config_path.exists():
                continue
            saved = load_yaml(config_path, type(run_config))
            changed = {k: (saved[k], v) for k, v in to_dict(run_config).items() if saved.get(k) != v}
            if changed:
                raise ValueError(f"--resume with different settings than the run in {out}: "
                                 + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
                                 + f"; pass the same flags (or {flag} {config_path}), or use a new --out")
        if info_path.exists():
            saved_info = json.loads(info_path.read_text())
            if saved_info != run_info:
                raise ValueError(f"--resume with a different env/simulator than the run in {out}: "
                                 f"{saved_info} vs {run_info}; use the same flags or a new --out")
    elif checkpoint.latest(out) is not None or (out / "metrics.jsonl").exists():
        raise ValueError(f"{out} already holds a run; pass --resume to continue it, or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    for name, (_, run_config) in configs.items():
        save_yaml(run_config, out / name)
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

    backend = TransformersBackend(config.model, dtype=config.dtype, trainable=not config.lora,
                                  prefix_cache=config.prefix_cache)
    return LLMPolicy(backend, config.sampling(), lora=config.lora, lora_r=config.lora_r, lora_alpha=config.lora_alpha)


def finish(args: argparse.Namespace, done: int, history: list[dict[str, float]], keys: tuple[str, ...]) -> int:
    """Print where the run stands: nothing to do, or the last update's ``keys``."""
    if not history:
        print(f"{args.out}: already at update {done} of {args.updates}; nothing to do")
    else:
        print(f"{args.out}: update {done}/{args.updates}  " + summarise(history, keys))
    return 0


def set_threads(args: argparse.Namespace) -> None:
    """Apply ``--threads`` (torch CPU threads) if given."""
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)


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
    import simpop
    from simpop.train.config import build
    from simpop.train.grpo import GRPOConfig, GRPOTrainer

    set_threads(args)
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
    if remaining > 0:
        trainer.train(remaining, progress=not args.no_progress)
    return finish(args, trainer.update_count, trainer.history if remaining > 0 else [],
                  ("reward_mean", "success", "policy_entropy", "zero_var_frac", "kl", "loss"))


TRAINERS["grpo"] = (configure_grpo, run_grpo, "multi-turn GRPO on the policy seat (text or act level)")


# --------------------------------------------------------------------- shared by cotrain and ppo
def run_updates(args: argparse.Namespace, step: Callable[[], dict[str, float]],
                state_dict: Callable[[], dict[str, Any]], load_state_dict: Callable[[dict[str, Any]], None],
                save_every: int = 1, keep: int = 3) -> tuple[int, list[dict[str, float]]]:
    """Run ``step`` (one update -> its metrics) until ``--updates``; ``(updates done, metrics of this call)``.

    With ``--resume`` the trainer first loads the newest checkpoint in ``--out``. Each update's metrics
    go to ``metrics.jsonl`` (+ TensorBoard); a checkpoint is written every ``save_every`` updates and
    after the last one, so that a killed run loses at most ``save_every - 1`` updates.
    """
    from tqdm import tqdm

    from simpop.evaluation.metrics import MetricsLogger
    from simpop.train import checkpoint

    start = None
    if args.resume and (path := checkpoint.latest(args.out)) is not None:
        start, state = checkpoint.load(path)
        load_state_dict(state)
    logger = MetricsLogger(args.out, resume_step=start)
    done, history = start or 0, []
    bar = tqdm(total=args.updates, initial=min(done, args.updates), desc=args.trainer, unit="update",
               disable=args.no_progress)
    try:
        while done < args.updates:
            metrics = step()
            done += 1
            history.append(metrics)
            logger.log(done, metrics)
            if done % save_every == 0 or done == args.updates:
                checkpoint.save(args.out, done, state_dict(), keep=keep)
            bar.update(1)
    finally:
        bar.close()
        logger.close()
    return done, history


# ---------------------------------------------------------------------------------------- cotrain
COTRAIN_DESCRIPTION = (
    "Co-training: the policy (GRPO) and trainable simulator(s) learn from the same rollouts "
    "(simpop.train.cotrain). --simulator names the simulators' starting point: native (the default) on "
    "simpop/PersuasionAct-v0 trains the act-level persuadee's parameters; frozen:MODEL?temperature=1.0 on a "
    "text env gives each simulator its own LoRA adapter on MODEL (embedded name or local HF folder). "
    "GRPOConfig fields (the policy) come from --config, CoTrainConfig fields (the simulators; no name is "
    "shared with GRPOConfig) from --cotrain-config; flags of either win. The run folder gets config.yaml and "
    "cotrain.yaml.")


def configure_cotrain(parser: argparse.ArgumentParser) -> None:
    from simpop.train.config import add_arguments
    from simpop.train.cotrain import CoTrainConfig
    from simpop.train.grpo import GRPOConfig

    parser.description = COTRAIN_DESCRIPTION
    add_run_arguments(parser)
    parser.add_argument("--cotrain-config", type=Path, help="YAML file of CoTrainConfig fields (flags given here win)")
    add_arguments(parser, GRPOConfig)
    add_arguments(parser, CoTrainConfig)  # argparse refuses a flag defined twice, so names cannot clash silently


def build_trainable_simulators(spec_text: str, env: Any, grpo: Any, count: int) -> list[Any]:
    """``count`` trainable simulators starting from ``spec_text`` (see :data:`COTRAIN_DESCRIPTION`)."""
    from gymnasium import spaces

    from simpop.simulators.spec import SimulatorSpec, resolve_personas

    spec = SimulatorSpec.parse(spec_text)
    act_level = isinstance(env.action_space(env.policy_seat), spaces.Discrete)
    if spec.kind == "native" and act_level:
        from simpop.envs.persuasion.simulators import ActPersuadee
        from simpop.simulators.trainable import TrainableActPersuadee

        if isinstance(build_simulator(spec_text, env), ActPersuadee):
            return [TrainableActPersuadee(temperature=1.0, name=f"cotrain-{i}") for i in range(count)]
    if spec.kind == "frozen" and not act_level:
        from simpop.agents.base import SamplingParams
        from simpop.agents.transformers_backend import TransformersBackend
        from simpop.simulators.trainable import TrainableLLMSimulator

        decoding = dict(spec.decoding)
        if decoding["temperature"] <= 0:
            raise ValueError(f"trainable simulators must sample (their replies' log-probabilities are what they "
                             f"learn from): use --simulator frozen:{spec.model}?temperature=1.0")
        params = SamplingParams(max_new_tokens=decoding["max_new_tokens"], temperature=decoding["temperature"],
                                top_p=decoding["top_p"])
        personas = resolve_personas(spec.personas, env)
        # One base model, one adapter per simulator.
        backend = TransformersBackend(spec.model, dtype=grpo.dtype, prefix_cache=grpo.prefix_cache)
        return [TrainableLLMSimulator(backend, adapter=f"cotrain{i}", params=params, lora_r=grpo.lora_r,
                                      lora_alpha=grpo.lora_alpha, name=f"cotrain-{i}", personas=personas,
                                      persona_set=spec.personas if personas is not None else None)
                for i in range(count)]
    raise ValueError(f"cannot co-train --simulator {spec_text} on this env: supported are --simulator native on "
                     f"simpop/PersuasionAct-v0 (the trainable act-level persuadee) and --simulator "
                     f"frozen:MODEL?temperature=1.0 on text envs (a LoRA adapter per simulator)")


def run_cotrain(args: argparse.Namespace) -> int:
    import simpop
    from simpop.train.config import build
    from simpop.train.cotrain import CoTrainConfig, CoTrainer
    from simpop.train.grpo import GRPOConfig

    set_threads(args)
    try:  # setup errors are the user's to fix: say what, without a traceback
        grpo = build(GRPOConfig, args, yaml_path=args.config)
        config = build(CoTrainConfig, args, yaml_path=args.cotrain_config)
        kwargs = env_kwargs(args.env_arg)
        env = simpop.make(args.env, **kwargs)
        simulators = build_trainable_simulators(args.simulator, env, grpo, config.population_size)
        trainer = CoTrainer(args.env, build_policy(env, grpo), simulators, grpo, config, env_kwargs=kwargs)
        prepare_run_dir(args.out, args.resume, grpo,
                        {"trainer": "cotrain", "env": args.env, "simulator": args.simulator, "env_kwargs": kwargs},
                        extra_configs={"cotrain.yaml": ("--cotrain-config", config)})
    except (ValueError, KeyError, TypeError, FileNotFoundError) as error:
        print(f"simpop train cotrain: error: {error}", file=sys.stderr)
        return 2
    done, history = run_updates(args, trainer.step, trainer.state_dict, trainer.load_state_dict,
                                save_every=grpo.save_every, keep=grpo.keep_checkpoints)
    return finish(args, done, history,
                  ("reward_mean", "success", "policy_entropy", "sim_success", "sim_kl", "sim_loss"))


# -------------------------------------------------------------------------------------------- ppo
def configure_ppo(parser: argparse.ArgumentParser) -> None:
    from simpop.train.config import add_arguments
    from simpop.train.ppo import PPOConfig

    add_run_arguments(parser)
    add_arguments(parser, PPOConfig)


def run_ppo(args: argparse.Namespace) -> int:
    import simpop
    from simpop.train.config import build
    from simpop.train.ppo import PPOConfig, PPOTrainer

    set_threads(args)
    try:  # setup errors are the user's to fix: say what, without a traceback
        config = build(PPOConfig, args, yaml_path=args.config)
        kwargs = env_kwargs(args.env_arg)
        env = simpop.make(args.env, **kwargs)
        # Each env copy gets its own simulator: copies step independently.
        trainer = PPOTrainer(args.env, lambda: build_simulator(args.simulator, env), config, env_kwargs=kwargs)
        prepare_run_dir(args.out, args.resume, config,
                        {"trainer": "ppo", "env": args.env, "simulator": args.simulator, "env_kwargs": kwargs})
    except (ValueError, KeyError, TypeError, FileNotFoundError) as error:
        print(f"simpop train ppo: error: {error}", file=sys.stderr)
        return 2
    done, history = run_updates(args, lambda: trainer.update(trainer.collect()), trainer.state_dict,
                                trainer.load_state_dict)
    return finish(args, done, history, ("episode_return", "entropy", "policy_loss", "value_loss", "clip_frac"))


TRAINERS["cotrain"] = (configure_cotrain, run_cotrain,
                       "co-training of the policy (GRPO) with trainable simulators (act level; text via LoRA)")
TRAINERS["ppo"] = (configure_ppo, run_ppo, "PPO on the policy seat of an act-level env")
