"""The ``simpop`` command.

Each subcommand lives with the code it drives: a module that defines ``configure(parser)`` (add
arguments to an ``argparse`` parser) and ``run(args) -> int``. Modules are imported only when their
subcommand runs, so ``simpop envs`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from simpop.user_input import ArgumentParser, UsageError, error_line

#: subcommand -> (module, one-line help). The module provides ``configure(parser)`` and ``run(args)``.
COMMANDS: dict[str, tuple[str, str]] = {
    "envs": ("simpop.envs.cli", "list the registered environment ids"),
    "train": ("simpop.train.cli", "train a policy (GRPO/PPO/co-training)"),
    "demo": ("simpop.envs.persuasion.demo", "run a few Persuasion-for-Good dialogues with the native persuadee"),
    "serve": ("simpop.serve.server", "serve a backend over an OpenAI-compatible HTTP API"),
    "experiment": ("simpop.experiments.cli", "run an experiment (collapse)"),
    "audit": ("simpop.evaluation.audit", "measure how diverse simulators' replies are on fixed P4G histories"),
    "fit-p4g": ("simpop.evaluation.p4g_fit", "fit simpop's shipped P4G persuadees and human statistics to a corpus"),
    "eval": ("simpop.evaluation.eval_cli", "benchmark a policy on held-out simulator panels"),
    "study": ("simpop.study.cli", "run a blinded human study of policies in the browser, and report it"),
    "openenv": ("simpop.integrations.openenv_cli", "serve any env as an OpenEnv environment (TRL trains through it)"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="simpop", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen subcommand's module is imported (its arguments are needed to parse).
        if argv and argv[0] == name:
            importlib.import_module(module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as exited:  # --help exits 0; a usage error (printed in one line) is returned, as below
        if exited.code == 2:
            return 2
        raise
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except UsageError as error:
        print(f"simpop {args.command}: error: {error_line(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
