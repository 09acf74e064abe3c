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
    from simpop.experiments.adaptive import AdaptiveConfig
    from simpop.experiments.conditions import CollapseConfig
    from simpop.experiments.defaults import DefaultsConfig
    from simpop.experiments.monitor_calibration import MonitorCalibrationConfig
    from simpop.user_input import number

    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    p = sub.add_parser("collapse", help="frozen vs verbalized vs co-training vs population co-training on P4G",
                       description="Train the same policy against four kinds of simulator with equal budgets and "
                                   "seeds, evaluate on a held-out panel, and write metrics, summary, report, plots.")
    add_run_flags(p, CollapseConfig, None, "runs/collapse-<level>", quiet=True)
    p.add_argument("--plan", nargs="+", type=Path, default=None, metavar="PILOT",
                   help="run nothing: from finished pilot folders (or their summary.json), print the seeds and "
                        "evaluation sizes needed to detect --plan-difference against frozen with 80%% power, "
                        "Holm-corrected over the --conditions given (simpop.experiments.power)")
    p.add_argument("--plan-difference", type=number(0, 1, above=True), default=0.05, metavar="D",
                   help="with --plan: the paired difference in final success to detect (default 0.05)")
    p = sub.add_parser("adaptive", help="fixed random pool vs failure-driven pool vs population co-training (P4G act)",
                       description="Train the act-level P4G policy against a fixed random simulator pool, a pool "
                                   "grown from its failures and pruned, and population co-training, with equal "
                                   "budgets; evaluate on the held-out panel; write summary, report and plots.")
    add_run_flags(p, AdaptiveConfig, Path("runs/adaptive"), quiet=True)
    p = sub.add_parser("monitor", help="calibrate the collapse early warning on the act-level collapse experiment",
                       description="Run frozen / verbalized / cotrain with the collapse monitor and report its lead "
                                   "time and false alarms with CIs over seeds.")
    add_run_flags(p, MonitorCalibrationConfig, Path("runs/monitor"),
                  resume="keep the finished runs in --out and run the others")
    p = sub.add_parser("defaults", help="the pre-registered grid that picks simpop train's defaults (act level)",
                       description="Run the GRPO and PPO grids of docs/defaults-study.md over the seeds, evaluate each "
                                   "run on the held-out panel before and after training, apply the rule, and write "
                                   "summary.json and table.md.")
    add_run_flags(p, DefaultsConfig, Path("runs/defaults"),
                  resume="continue the grid in --out; finished runs are skipped", trackers=False)


def add_run_flags(parser: argparse.ArgumentParser, config: type, out: Path | None, shown: str | None = None,
                  resume: str = "continue the run in --out; finished runs are skipped", quiet: bool = False,
                  trackers: bool = True) -> None:
    """An experiment's flags: ``config``'s fields, ``--out`` (default ``out``, named ``shown`` in the help),
    ``--resume``, ``--config`` (a YAML file of ``config``'s fields), with ``quiet`` ``--quiet`` and with ``trackers``
    ``--report-to``."""
    from simpop.evaluation.trackers import report_to_flag
    from simpop.train.config import add_arguments

    parser.add_argument("--out", type=Path, default=out, help=f"output folder (default {shown or out})")
    parser.add_argument("--resume", action="store_true", help=resume)
    parser.add_argument("--config", type=Path, default=None, help=f"YAML file of {config.__name__} fields (flags win)")
    if quiet:
        parser.add_argument("--quiet", action="store_true", help="no progress bar")
    if trackers:
        parser.add_argument("--report-to", type=report_to_flag, default="tensorboard", metavar="NAMES",
                            help="experiment trackers of every run, TRL's names: tensorboard (default), wandb (pip "
                                 "install 'simpop[wandb]'), both comma-separated, none, or all (every one installed)")
    add_arguments(parser, config)


def run(args: argparse.Namespace) -> int:
    from simpop.evaluation.trackers import TrackerError
    from simpop.experiments.runs import SettingsChanged

    setup = {"collapse": _collapse, "adaptive": _adaptive, "monitor": _adaptive, "defaults": _defaults}
    with contextlib.ExitStack() as held:  # what the experiment holds to the end: --out's writer lock
        try:  # setup errors are the user's to fix: one line naming the field or flag, exit code 2
            experiment = setup[args.experiment](args, held)
            if experiment is None:  # --plan: printed, nothing run
                return 0
        except (ValueError, TypeError, OSError) as error:
            return _error(args, error)
        try:
            print(f"report: {experiment()}")
        except (TrackerError, SettingsChanged) as error:  # a tracker that could not start (W&B not logged in, ...)
            return _error(args, error)
    return 0


def _error(args: argparse.Namespace, error: Exception) -> int:
    print(f"simpop experiment {args.experiment}: error: {error}", file=sys.stderr)
    return 2


def _collapse(args: argparse.Namespace, held: contextlib.ExitStack) -> Callable[[], Path] | None:
    """``simpop experiment collapse`` set up (``--out``'s writer lock held in ``held``), or its ``--plan`` printed."""
    from simpop.evaluation.trackers import require
    from simpop.experiments.collapse import run_collapse
    from simpop.experiments.conditions import CollapseConfig

    config = _config(CollapseConfig, args)
    if args.plan is not None:
        from simpop.experiments.power import plan

        print(plan(args.plan, args.plan_difference, max(1, len(set(config.conditions or ()) - {"frozen"}))), end="")
        return None
    require(args.report_to)
    out = _hold(args.out or Path("runs") / f"collapse-{config.level}", args, held)
    return lambda: run_collapse(config, out, resume=args.resume, progress=not args.quiet, report_to=args.report_to)


def _adaptive(args: argparse.Namespace, held: contextlib.ExitStack) -> Callable[[], Path]:
    """``simpop experiment adaptive|monitor`` set up, holding ``--out``'s writer lock in ``held``."""
    from simpop.evaluation.trackers import require
    from simpop.experiments.adaptive import AdaptiveConfig, run_adaptive
    from simpop.experiments.monitor_calibration import MonitorCalibrationConfig, run_calibration

    config = _config(AdaptiveConfig if args.experiment == "adaptive" else MonitorCalibrationConfig, args)
    require(args.report_to)
    _hold(args.out, args, held)
    if isinstance(config, AdaptiveConfig):
        return lambda: run_adaptive(config, args.out, resume=args.resume, progress=not args.quiet,
                                    report_to=args.report_to)
    return lambda: run_calibration(config, args.out, resume=args.resume, report_to=args.report_to)


def _defaults(args: argparse.Namespace, held: contextlib.ExitStack) -> Callable[[], Path]:
    """``simpop experiment defaults`` set up, holding ``--out``'s writer lock in ``held``."""
    from simpop.experiments.defaults import DefaultsConfig, run_defaults
    from simpop.train.cli import resolve_panel

    config = _config(DefaultsConfig, args)
    resolve_panel(config.panel, config.env)  # a named panel of the env
    _hold(args.out, args, held, marker="summary.json", holds="a grid")
    return lambda: run_defaults(config, args.out)


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
