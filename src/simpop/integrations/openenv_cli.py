"""``simpop openenv serve``: any registered env as an OpenEnv environment (:mod:`.openenv_server`).

    simpop openenv serve --env simpop/PersuasionAct-v0 --simulator persuadee --max-sessions 32
    simpop openenv serve --env simpop/Persuasion-v1 --simulator persuadee --simulator frozen:smollm2
    simpop openenv serve --env simpop/PersuasionAct-v0 --panel p4g-act-v1          # evaluation sessions
"""

from __future__ import annotations

import argparse
import logging
import sys

from simpop.user_input import SECONDS, integer, number


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    serve = sub.add_parser("serve", help="serve an env over OpenEnv's HTTP/WebSocket API",
                           description="Serve an env over OpenEnv's HTTP/WebSocket API; the user seat is filled "
                                       "by simulators (a population if several) or a held-out panel.")
    from simpop.integrations.openenv_server import ServerLimits
    from simpop.serve.http import add_http_arguments

    defaults = ServerLimits()
    serve.add_argument("--env", required=True, help="a registered env id (simpop envs lists them)")
    seat = serve.add_mutually_exclusive_group(required=True)
    seat.add_argument("--simulator", action="append", metavar="SPEC",
                      help="simulator spec for the user seat; repeat for a uniform population")
    seat.add_argument("--panel", metavar="NAME", help="a named held-out panel (evaluation sessions)")
    serve.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="env constructor argument")
    serve.add_argument("--tokenizer", metavar="MODEL", help="the policy's model: its chat template turns observations "
                       "into token ids for clients that send theirs (text envs)")
    serve.add_argument("--max-sessions", type=integer(1, 100_000), default=defaults.max_sessions, help="concurrent sessions")
    serve.add_argument("--max-pending", type=integer(1, 100_000), default=defaults.max_pending,
                       help="HTTP requests answered at once (429 beyond)")
    serve.add_argument("--session-idle-timeout", type=SECONDS, default=defaults.session_idle_s,
                       help="seconds an idle session is kept")
    add_http_arguments(serve, max_body_bytes=defaults.max_body_bytes, read_timeout_s=defaults.read_timeout_s,
                       keep_alive_s=defaults.keep_alive_s)
    cotrain = serve.add_argument_group("co-training (--cotrain): the server trains its trainable simulators")
    cotrain.add_argument("--cotrain", action="store_true",
                         help="train the trainable --simulator(s) on the episodes served (CoTrainer's objectives)")
    cotrain.add_argument("--cotrain-objective", default="target", help="target | persona | realism | "
                         "adversarial | diverse (simpop.train.cotrain)")
    cotrain.add_argument("--cotrain-episodes", type=integer(1, 100_000), default=16, help="episodes per simulator update")
    cotrain.add_argument("--sim-lr", type=number(0, 10, above=True), default=0.05, help="the simulators' learning rate")
    cotrain.add_argument("--reference-data", help="reference dialogues (objectives realism, adversarial)")
    cotrain.add_argument("--cotrain-dir", help="checkpoint folder of the simulators")
    cotrain.add_argument("--resume", action="store_true", help="continue from --cotrain-dir's newest checkpoint")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from simpop.envs.registration import parse_env_args
    from simpop.integrations.openenv_server import ServerLimits, UserSeatSource, make_server
    from simpop.user_input import error_line

    cotrainer = None
    try:
        limits = ServerLimits(max_sessions=args.max_sessions, max_pending=args.max_pending,
                              max_body_bytes=args.max_body_bytes, read_timeout_s=args.read_timeout,
                              keep_alive_s=args.keep_alive_timeout, session_idle_s=args.session_idle_timeout)
        tokenizer = None
        if args.tokenizer:
            from simpop.agents import load_backend

            tokenizer = load_backend(args.tokenizer)
        source = UserSeatSource(args.env, args.simulator or (), args.panel, parse_env_args(args.env_arg),
                                tokenizer=tokenizer)
        cotrainer = _cotrainer(args, source)
        server = make_server(source, args.host, args.port, limits=limits, api_key=args.api_key,
                             log_requests=args.log_requests,
                             environment=None if cotrainer is None else cotrainer.environment)
    except (ValueError, KeyError, TypeError, OSError) as error:
        if cotrainer is not None:  # its --cotrain-dir lock goes with it
            cotrainer.close()
        print(f"simpop openenv serve: error: {error_line(error)}", file=sys.stderr)
        return 2
    seat = f"panel {args.panel}" if args.panel else ", ".join(args.simulator)
    print(f"simpop openenv serve: {args.env} with {seat} in the user seat at {server.url} "
          f"(WebSocket {server.url.replace('http', 'ws', 1)}/ws; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.socket.close()
        if cotrainer is not None:
            cotrainer.close()
    return 0


def _cotrainer(args: argparse.Namespace, source):
    """The server's co-trainer with --cotrain, else None (co-training flags without it are an error)."""
    if not args.cotrain:
        if args.resume or args.cotrain_dir:
            raise ValueError("--resume and --cotrain-dir apply to --cotrain")
        return None
    if args.resume and not args.cotrain_dir:
        raise ValueError("--resume needs --cotrain-dir (where the checkpoints are)")
    from simpop.integrations.openenv_cotrain import ServerCoTrainer
    from simpop.train.cotrain import CoTrainConfig

    config = CoTrainConfig(objective=args.cotrain_objective, sim_lr=args.sim_lr, reference_data=args.reference_data)
    return ServerCoTrainer(source, config, args.cotrain_episodes, args.cotrain_dir, args.resume)
