"""``simpop experiment collapse``: the main job (see :mod:`simpop.experiments.collapse`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    from simpop.experiments.collapse import CollapseConfig
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


def run(args: argparse.Namespace) -> int:
    from simpop.experiments.collapse import CollapseConfig, run_collapse
    from simpop.train.cli import check_out_dir
    from simpop.train.config import build

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
