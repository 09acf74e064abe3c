"""``simpop experiment collapse``: the main job (see :mod:`simpop.experiments.collapse`); also ``adaptive``,
``monitor`` and ``defaults`` (:mod:`simpop.experiments.defaults`). ``--report-to`` (TRL's tracker names, :mod:`simpop.evaluation.trackers`) logs every (condition, seed)
run to TensorBoard (the default) or Weights & Biases (one W&B run each, grouped by the output folder's name, and
one more, ``report``, with the report's plots)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    from simpop.experiments.conditions import CollapseConfig
    from simpop.train.config import add_arguments
    from simpop.user_input import number

    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    p = sub.add_parser("collapse", help="frozen vs verbalized vs co-training vs population co-training on P4G",
                       description="Train the same policy against four kinds of simulator with equal budgets and "
                                   "seeds, evaluate on a held-out panel, and write metrics, summary, report, plots.")
    add_run_flags(p, CollapseConfig, None, "runs/collapse-<level>")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--plan", nargs="+", type=Path, default=None, metavar="PILOT",
                   help="run nothing: from finished pilot folders (or their summary.json), print the seeds and "
                        "evaluation sizes needed to detect --plan-difference against frozen with 80%% power, "
                        "Holm-corrected over the --conditions given (simpop.experiments.power)")
    p.add_argument("--plan-difference", type=number(0, 1, above=True), default=0.05, metavar="D",
                   help="with --plan: the paired difference in final success to detect (default 0.05)")
    add_report_to(p)
    add_arguments(p, CollapseConfig)
    configure_adaptive(sub)
    configure_defaults(sub)


def configure_adaptive(sub: Any) -> None:
    """``simpop experiment adaptive`` and ``simpop experiment monitor`` (:mod:`simpop.experiments.adaptive`,
    :mod:`simpop.experiments.monitor_calibration`)."""
    from simpop.experiments.adaptive import AdaptiveConfig
    from simpop.experiments.monitor_calibration import MonitorCalibrationConfig
    from simpop.train.config import add_arguments

    p = sub.add_parser("adaptive", help="fixed random pool vs failure-driven pool vs population co-training (P4G act)",
                       description="Train the act-level P4G policy against a fixed random simulator pool, a pool "
                                   "grown from its failures and pruned, and population co-training, with equal "
                                   "budgets; evaluate on the held-out panel; write summary, report and plots.")
    add_run_flags(p, AdaptiveConfig, Path("runs/adaptive"))
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_report_to(p)
    add_arguments(p, AdaptiveConfig)
    m = sub.add_parser("monitor", help="calibrate the collapse early warning on the act-level collapse experiment",
                       description="Run frozen / verbalized / cotrain with the collapse monitor and report its lead "
                                   "time and false alarms with CIs over seeds.")
    add_run_flags(m, MonitorCalibrationConfig, Path("runs/monitor"),
                  resume="keep the finished runs in --out and run the others")
    add_report_to(m)
    add_arguments(m, MonitorCalibrationConfig)


def configure_defaults(sub: Any) -> None:
    """``simpop experiment defaults`` (:mod:`simpop.experiments.defaults`)."""
    from simpop.experiments.defaults import DefaultsConfig
    from simpop.train.config import add_arguments

    p = sub.add_parser("defaults", help="the pre-registered grid that picks simpop train's defaults (act level)",
                       description="Run the GRPO and PPO grids of docs/defaults-study.md over the seeds, evaluate each "
                                   "run on the held-out panel before and after training, apply the rule, and write "
                                   "summary.json and table.md.")
    add_run_flags(p, DefaultsConfig, Path("runs/defaults"),
                  resume="continue the grid in --out; finished runs are skipped")
    add_arguments(p, DefaultsConfig)


def add_run_flags(parser: argparse.ArgumentParser, config: type, out: Path | None, shown: str | None = None,
                  resume: str = "continue the run in --out; finished runs are skipped") -> None:
    """An experiment's ``--out`` (default ``out``, named ``shown`` in the help), ``--resume`` and ``--config`` (a YAML
    file of ``config``'s fields)."""
    parser.add_argument("--out", type=Path, default=out, help=f"output folder (default {shown or out})")
    parser.add_argument("--resume", action="store_true", help=resume)
    parser.add_argument("--config", type=Path, default=None, help=f"YAML file of {config.__name__} fields (flags win)")


def add_report_to(parser: argparse.ArgumentParser) -> None:
    """The ``--report-to`` flag of an experiment."""
    from simpop.evaluation.trackers import report_to_flag

    parser.add_argument("--report-to", type=report_to_flag, default="tensorboard", metavar="NAMES",
                        help="experiment trackers of every run, TRL's names: tensorboard (default), wandb (pip "
                             "install 'simpop[wandb]'), both comma-separated, none, or all (every one installed)")


def run(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as held:  # what the experiment holds to the end: --out's writer lock
        return _run(args, held)


def _run(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    from simpop.evaluation.trackers import require
    from simpop.experiments.collapse import run_collapse
    from simpop.experiments.conditions import CollapseConfig

    if args.experiment in ("adaptive", "monitor"):
        return run_adaptive(args, held)
    if args.experiment == "defaults":
        return run_defaults(args, held)

    try:  # setup errors are the user's to fix: one line naming the field or flag, exit code 2
        config = _config(CollapseConfig, args)
        if args.plan is not None:
            from simpop.experiments.power import plan

            print(plan(args.plan, args.plan_difference, max(1, len(set(config.conditions or ()) - {"frozen"}))), end="")
            return 0
        require(args.report_to)
        out = _hold(args.out or Path("runs") / f"collapse-{config.level}", args, held)
    except (ValueError, TypeError, OSError) as error:
        print(f"simpop experiment {args.experiment}: error: {error}", file=sys.stderr)
        return 2
    return finish(args, lambda: run_collapse(config, out, resume=args.resume, progress=not args.quiet,
                                             report_to=args.report_to))


def run_adaptive(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    """``simpop experiment adaptive|monitor``, holding ``--out``'s writer lock in ``held``."""
    from simpop.evaluation.trackers import require
    from simpop.experiments.adaptive import AdaptiveConfig, run_adaptive as adaptive
    from simpop.experiments.monitor_calibration import MonitorCalibrationConfig, run_calibration

    cls: Any = AdaptiveConfig if args.experiment == "adaptive" else MonitorCalibrationConfig
    try:
        config = _config(cls, args)
        require(args.report_to)
        _hold(args.out, args, held)
    except (ValueError, TypeError, OSError) as error:
        print(f"simpop experiment {args.experiment}: error: {error}", file=sys.stderr)
        return 2
    if cls is AdaptiveConfig:
        return finish(args, lambda: adaptive(config, args.out, resume=args.resume, progress=not args.quiet,
                                             report_to=args.report_to))
    return finish(args, lambda: run_calibration(config, args.out, resume=args.resume, report_to=args.report_to))


def run_defaults(args: argparse.Namespace, held: contextlib.ExitStack) -> int:
    """``simpop experiment defaults``, holding ``--out``'s writer lock in ``held``."""
    from simpop.experiments.defaults import DefaultsConfig, run_defaults as grid
    from simpop.train.cli import resolve_panel

    try:
        config = _config(DefaultsConfig, args)
        resolve_panel(config.panel, config.env)  # a named panel of the env
        _hold(args.out, args, held, marker="summary.json", holds="a grid")
    except (ValueError, TypeError, OSError) as error:
        print(f"simpop experiment defaults: error: {error}", file=sys.stderr)
        return 2
    return finish(args, lambda: grid(config, args.out))


def _config(cls: Any, args: argparse.Namespace) -> Any:
    """``cls`` from ``--config`` (a YAML file) and the flags (flags win)."""
    from simpop.train.config import build

    if args.config is not None and not Path(args.config).is_file():
        raise ValueError(f"--config {args.config}: no such file")
    return build(cls, args, yaml_path=args.config)


def _hold(out: Path, args: argparse.Namespace, held: contextlib.ExitStack, marker: str = "runs",
          holds: str = "a run") -> Path:
    """Hold ``out``'s writer lock in ``held`` (one writer per run folder, before it is touched); refused when ``out``
    already holds ``marker`` and ``--resume`` is off."""
    from simpop.files import run_lock
    from simpop.train.cli import check_out_dir

    check_out_dir(out)
    held.enter_context(run_lock(out))
    if not args.resume and (out / marker).exists():
        raise ValueError(f"--out {out} already holds {holds}: pass --resume to continue it, or choose another --out")
    return out


def finish(args: argparse.Namespace, experiment: Callable[[], Path]) -> int:
    """Run ``experiment`` and print its report's path (0), or the one line of a tracker that could not start its
    run (W&B not logged in, ...: 2)."""
    from simpop.evaluation.trackers import TrackerError

    try:
        report = experiment()
    except TrackerError as error:
        print(f"simpop experiment {args.experiment}: error: {error}", file=sys.stderr)
        return 2
    print(f"report: {report}")
    return 0
