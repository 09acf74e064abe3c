"""``simpop study``: run a human study in the browser (``serve``) and report it (``report``).

Examples::

    simpop study serve --env simpop/Persuasion-v1 --policy A=run:runs/grpo --policy B=run:runs/cotrain \\
        --out studies/p4g
    simpop study report studies/p4g

``serve`` prints the link to give participants (``http://127.0.0.1:8765/?token=...``); it binds to 127.0.0.1
unless ``--host`` says otherwise. Policy specs are ``simpop eval``'s (:mod:`simpop.evaluation.policies`).
Restarting ``serve`` with the same ``--out`` and settings continues the study. Exit codes: 0 done; 2 bad input.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
from pathlib import Path

from simpop.user_input import PORT, SECONDS, SEED, integer, number


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("Examples::", 1)[1].split("``serve`` prints")[0].rstrip()
    sub = parser.add_subparsers(dest="study_command", required=True, metavar="serve|report")
    serve = sub.add_parser("serve", help="serve the study's web app")
    serve.add_argument("--env", required=True, help="a registered text env (e.g. simpop/Persuasion-v1)")
    serve.add_argument("--policy", action="append", required=True, metavar="LABEL=SPEC",
                       help="a policy of the study (repeat: A=SPEC, B=SPEC; participants never see the label)")
    serve.add_argument("--scenarios", nargs="+", metavar="ID", help="scenario ids to draw from (default: all)")
    serve.add_argument("--out", type=Path, required=True, help="the study folder (chats, study.json, reports)")
    serve.add_argument("--seed", type=SEED, default=0, help="seeds the blinded assignment and env resets (default 0)")
    serve.add_argument("--chats-per-participant", type=integer(1, 1000),
                       help="chats each participant has (default: one per policy, in random order)")
    serve.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                       help="env constructor argument (YAML value), repeatable, e.g. --env-arg max_turns=6")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=PORT, default=8765, help="port (default 8765)")
    serve.add_argument("--token", help="the study token participants need (default: $SIMPOP_STUDY_TOKEN, "
                                       "else a random one, printed)")
    serve.add_argument("--max-message-chars", type=integer(1, 100_000), default=1000, help="longest message (default 1000)")
    serve.add_argument("--message-rate", default="1/second;20/minute",
                       help="messages allowed per chat (default '1/second;20/minute')")
    serve.add_argument("--idle-timeout", type=SECONDS, default=900.0,
                       help="seconds without a reply before a chat is abandoned (default 900)")
    serve.add_argument("--temperature", type=number(0, 100), default=0.0, help="text policies' temperature (default 0)")
    serve.add_argument("--max-new-tokens", type=integer(1, 1_000_000), default=512, help="text policies' reply limit (default 512)")
    report = sub.add_parser("report", help="success and ratings per policy, paired comparison")
    report.add_argument("dir", type=Path, help="the study folder")
    report.add_argument("--seed", type=SEED, default=0, help="the bootstrap's seed (default 0)")


def run(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="simpop study: %(levelname)s: %(message)s")
    try:
        return _serve(args) if args.study_command == "serve" else _report(args)
    except (ValueError, KeyError, FileNotFoundError, ImportError) as error:
        from simpop.user_input import error_line

        print(f"simpop study: error: {error_line(error)}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    from simpop.agents.base import SamplingParams
    from simpop.envs.registration import parse_env_args
    from simpop.study.study import open_study, parse_policies

    token = args.token or os.environ.get("SIMPOP_STUDY_TOKEN") or secrets.token_urlsafe(16)
    policies = parse_policies(args.policy)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    study = open_study(args.out, args.env, policies, scenarios=args.scenarios, seed=args.seed,
                       chats_per_participant=args.chats_per_participant, env_kwargs=parse_env_args(args.env_arg),
                       sampling=sampling, idle_timeout_s=args.idle_timeout)
    from simpop.study.app import create_app, serve

    app = create_app(study, token, max_message_chars=args.max_message_chars, message_rate=args.message_rate)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.warning("binding %s: anyone who can reach this address and holds the token can join", args.host)
    print(f"study {args.out}: {len(policies)} policies, {len(study.settings['scenarios'])} scenario(s), "
          f"{study.settings['chats_per_participant']} chat(s) per participant")
    print(f"participants join at: http://{args.host}:{args.port}/?token={token}")
    print(f"stop with Ctrl-C; then: simpop study report {args.out}")
    serve(app, args.host, args.port)
    return 0


def _report(args: argparse.Namespace) -> int:
    from simpop.evaluation.eval_run import REPORT
    from simpop.study.report import write_report

    summary = write_report(args.dir, seed=args.seed)
    report = (args.dir / REPORT).read_text(encoding="utf-8")
    print(report[report.index("## Success"):report.index("\n![")].strip())
    print(f"wrote {args.dir}/summary.json, report.md, success.png ({summary['chats']} chat(s))")
    return 0
