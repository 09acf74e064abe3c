"""``simpop openenv serve``: any registered env as an OpenEnv environment (:mod:`.openenv_server`).

    simpop openenv serve --env simpop/PersuasionAct-v0 --simulator persuadee --max-sessions 32
    simpop openenv serve --env simpop/Persuasion-v1 --simulator persuadee --simulator frozen:smollm2
    simpop openenv serve --env simpop/PersuasionAct-v0 --panel p4g-act-v1          # evaluation sessions
    simpop openenv serve --env simpop/PersuasionAct-v0 --simulator persuadee --workers 2 --max-sessions 512

``--workers N`` runs N server processes on one port (``SO_REUSEPORT``: the kernel spreads new connections over them);
a session is its WebSocket, so it stays in the process that accepted it. Each worker has its own models, limits
(``--max-sessions`` is per worker) and batches. ``--cotrain`` needs one worker: one trainer sees every episode.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import queue
import signal
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
    serve.add_argument("--max-sessions", type=integer(1, 100_000), default=defaults.max_sessions,
                       help="concurrent sessions (per worker)")
    serve.add_argument("--workers", type=integer(1, 256), default=1,
                       help="server processes sharing the port; each session stays in the one that accepted it")
    serve.add_argument("--max-pending", type=integer(1, 100_000), default=defaults.max_pending,
                       help="HTTP requests answered at once (429 beyond)")
    serve.add_argument("--session-idle-timeout", type=SECONDS, default=defaults.session_idle_s,
                       help="seconds an idle session is kept")
    add_http_arguments(serve, max_body_bytes=defaults.max_body_bytes, read_timeout_s=defaults.read_timeout_s,
                       keep_alive_s=defaults.keep_alive_s)
    from simpop.integrations.openenv_server import ModelCalls

    calls = ModelCalls()
    models = serve.add_argument_group("model calls: how concurrent sessions share the simulators' models")
    models.add_argument("--max-batch", type=integer(1, 4096), default=calls.max_batch,
                        help="most replies in one batched call of an in-process model")
    models.add_argument("--batch-window-ms", type=number(0, 60_000), default=calls.batch_window_s * 1000,
                        help="how long the oldest reply waits for batch mates with the model free (none once every open "
                             "session's reply waits)")
    models.add_argument("--max-inflight", type=integer(1, 100_000), default=calls.max_inflight,
                        help="most calls in flight at once to one model server (openai:, vllm: simulators)")
    models.add_argument("--prefix-cache-mb", type=number(0, 1_000_000), default=calls.prefix_cache_mb,
                        help="memory an in-process model keeps dialogues' keys and values in between their turns "
                             "(MiB; 0: the model's own setting, off for a plain model)")
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
    from simpop.user_input import error_line

    if args.workers > 1:
        return _run_workers(args)
    try:
        server, cotrainer = _build(args)
    except (ValueError, KeyError, TypeError, OSError) as error:
        print(f"simpop openenv serve: error: {error_line(error)}", file=sys.stderr)
        return 2
    _announce(args, server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.socket.close()
        if cotrainer is not None:
            cotrainer.close()
    return 0


def _build(args: argparse.Namespace, reuse_port: bool = False):
    """The bound server for ``args`` and its co-trainer (None without --cotrain)."""
    from simpop.envs.registration import parse_env_args
    from simpop.integrations.openenv_server import ModelCalls, ServerLimits, UserSeatSource, make_server

    cotrainer = None
    try:
        limits = ServerLimits(max_sessions=args.max_sessions, max_pending=args.max_pending,
                              max_body_bytes=args.max_body_bytes, read_timeout_s=args.read_timeout,
                              keep_alive_s=args.keep_alive_timeout, session_idle_s=args.session_idle_timeout)
        tokenizer = None
        if args.tokenizer:
            from simpop.agents import load_backend

            tokenizer = load_backend(args.tokenizer)
        calls = ModelCalls(args.max_batch, args.batch_window_ms / 1000, args.max_inflight, args.prefix_cache_mb)
        source = UserSeatSource(args.env, args.simulator or (), args.panel, parse_env_args(args.env_arg),
                                tokenizer=tokenizer, calls=calls)
        cotrainer = _cotrainer(args, source)
        server = make_server(source, args.host, args.port, limits=limits, api_key=args.api_key,
                             log_requests=args.log_requests, reuse_port=reuse_port,
                             environment=None if cotrainer is None else cotrainer.environment)
    except BaseException:
        if cotrainer is not None:  # its --cotrain-dir lock goes with it
            cotrainer.close()
        raise
    return server, cotrainer


def _announce(args: argparse.Namespace, url: str, workers: str = "") -> None:
    seat = f"panel {args.panel}" if args.panel else ", ".join(args.simulator)
    print(f"simpop openenv serve: {args.env} with {seat} in the user seat at {url} "
          f"(WebSocket {url.replace('http', 'ws', 1)}/ws{workers}; Ctrl-C stops)", flush=True)


def _run_workers(args: argparse.Namespace) -> int:
    """``--workers N``: N spawned processes serve the port the parent holds (see the module docstring)."""
    from simpop.integrations.openenv_server import reserve_port
    from simpop.user_input import error_line

    try:
        if args.cotrain:
            raise ValueError("--cotrain trains in one process, so that one trainer sees every episode: use --workers 1")
        holder = reserve_port(args.host, args.port)
    except (ValueError, OSError) as error:
        print(f"simpop openenv serve: error: {error_line(error)}", file=sys.stderr)
        return 2
    host, port = holder.getsockname()[:2]
    args.port = port
    context = multiprocessing.get_context("spawn")  # a fresh interpreter each: no forked model or thread state
    ready = context.Queue()
    workers = [context.Process(target=_worker, args=(args, ready), name=f"simpop-openenv-{i}")
               for i in range(args.workers)]
    for worker in workers:
        worker.start()
    stopped = signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a terminated server stops its workers too
    try:
        waiting = len(workers)
        while waiting:
            try:
                problem = ready.get(timeout=1.0)
            except queue.Empty:
                if any(not worker.is_alive() for worker in workers):
                    problem = "a worker process exited while starting (see the log)"
                else:
                    continue
            if problem is not None:
                print(f"simpop openenv serve: error: {problem}", file=sys.stderr)
                return 2
            waiting -= 1
        _announce(args, f"http://{host}:{port}", f", {args.workers} worker processes")
        for worker in workers:
            worker.join()
    except KeyboardInterrupt:
        pass
    finally:  # Ctrl-C, SIGTERM or a worker gone: the workers stop too (uvicorn exits cleanly on SIGTERM)
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
        holder.close()
        signal.signal(signal.SIGTERM, stopped)
    return 0


def _worker(args: argparse.Namespace, ready) -> None:
    """One ``--workers`` process: build its own server on the shared port, say whether it could, serve."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from simpop.user_input import error_line

    try:
        server, _ = _build(args, reuse_port=True)
    except (ValueError, KeyError, TypeError, OSError) as error:
        ready.put(error_line(error))
        return
    ready.put(None)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


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
