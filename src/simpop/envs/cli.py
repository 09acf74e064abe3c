"""``simpop envs``: list the registered environment ids."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", "-v", action="store_true", help="also show entry points")


def run(args: argparse.Namespace) -> int:
    from simpop.envs import ids, spec

    for env_id in ids():
        print(f"{env_id}\t{spec(env_id).entry_point}" if args.verbose else env_id)
    return 0
