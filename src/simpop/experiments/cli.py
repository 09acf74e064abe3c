"""``simpop experiment collapse``: the main job (see :mod:`simpop.experiments.collapse`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    from simpop.experiments.conditions import CollapseConfig
    from simpop.train.config import add_arguments

    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    p = sub.add_parser("collapse", help="frozen vs verbalized vs co-training vs population co-training on P4G",
                       description="Train the same policy against four kinds of simulator with equal budgets and "
                                   "seeds, evaluate on a held-out panel, and write metrics, summary, report, plots.")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default runs/collapse-<level>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out; finished runs are skipped")
    p.add_argument("--config", type=Path, default=None, help="YAML file of CollapseConfig fields (flags win)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_arguments(p, CollapseConfig)
    configure_adaptive(sub)


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
    p.add_argument("--out", type=Path, default=Path("runs/adaptive"), help="output folder (default runs/adaptive)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out; finished runs are skipped")
    p.add_argument("--config", type=Path, default=None, help="YAML file of AdaptiveConfig fields (flags win)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_arguments(p, AdaptiveConfig)
    m = sub.add_parser("monitor", help="calibrate the collapse early warning on the act-level collapse experiment",
                       description="Run frozen / verbalized / cotrain with the collapse monitor and report its lead "
                                   "time and false alarms with CIs over seeds.")
    m.add_argument("--out", type=Path, default=Path("runs/monitor"), help="output folder (default runs/monitor)")
    m.add_argument("--config", type=Path, default=None, help="YAML file of MonitorCalibrationConfig fields")
    m.add_argument("--resume", action="store_true", help="keep the finished runs in --out and run the others")
    add_arguments(m, MonitorCalibrationConfig)


def run(args: argparse.Namespace) -> int:
    from simpop.experiments.collapse import run_collapse
    from simpop.experiments.conditions import CollapseConfig
    from simpop.train.cli import check_out_dir
    from simpop.train.config import build

    if args.experiment in ("adaptive", "monitor"):
        return run_adaptive(args)

    try:  # setup errors are the user's to fix: one line naming the field or flag, exit code 2
        if args.config is not None and not Path(args.config).is_file():
            raise ValueError(f"--config {args.config}: no such file")
        config = build(CollapseConfig, args, yaml_path=args.config)
        out = args.out or Path("runs") / f"collapse-{config.level}"
        check_out_dir(out)
        if not args.resume and (out / "runs").exists():
            raise ValueError(f"--out {out} already holds a run: pass --resume to continue it, or choose another --out")
    except (ValueError, TypeError, OSError) as error:
        print(f"simpop experiment {args.experiment}: error: {error}", file=sys.stderr)
        return 2
    report = run_collapse(config, out, resume=args.resume, progress=not args.quiet)
    print(f"report: {report}")
    return 0


def run_adaptive(args: argparse.Namespace) -> int:
    """``simpop experiment adaptive|monitor``."""
    from simpop.experiments.adaptive import AdaptiveConfig, run_adaptive as adaptive
    from simpop.experiments.monitor_calibration import MonitorCalibrationConfig, run_calibration
    from simpop.train.cli import check_out_dir
    from simpop.train.config import build

    cls: Any = AdaptiveConfig if args.experiment == "adaptive" else MonitorCalibrationConfig
    try:
        if args.config is not None and not Path(args.config).is_file():
            raise ValueError(f"--config {args.config}: no such file")
        config = build(cls, args, yaml_path=args.config)
        check_out_dir(args.out)
        if not args.resume and (args.out / "runs").exists():
            raise ValueError(f"--out {args.out} already holds a run: pass --resume to continue it, or choose another "
                             f"--out")
    except (ValueError, TypeError, OSError) as error:
        print(f"simpop experiment {args.experiment}: error: {error}", file=sys.stderr)
        return 2
    if cls is AdaptiveConfig:
        report = adaptive(config, args.out, resume=args.resume, progress=not args.quiet)
    else:
        report = run_calibration(config, args.out, resume=args.resume)
    print(f"report: {report}")
    return 0
