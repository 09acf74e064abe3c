"""``simpop eval``: benchmark a policy on a held-out simulator panel; ``simpop eval compare A B``.

Examples::

    simpop eval --env simpop/PersuasionAct-v0 --policy run:runs/grpo --panel p4g-act-v1 --episodes 200 \\
        --seed 0 --out evals/grpo
    simpop eval --env simpop/Tau2-mock-v0 --policy openai:http://127.0.0.1:8000/v1#my-agent \\
        --panel tau2-mock-v1 --num-trials 4 --concurrency 16 --out evals/agent
    simpop eval --env simpop/Persuasion-v1 --policy reference --panel my_panel.yaml --episodes 50 --out evals/ref
    simpop eval compare evals/ref evals/grpo

``--policy`` forms: :mod:`simpop.evaluation.policies`. ``--panel``: a shipped panel's name
(:mod:`simpop.evaluation.panels`) or a panel YAML file. Outputs and resuming: :mod:`simpop.evaluation.eval_run`.
With ``--run DIR`` (or a ``run:DIR`` policy) the panel must be held out from that training run's simulators
(:meth:`~simpop.simulators.population.Panel.check_disjoint`): a member that is a training simulator is refused; one
that only shares an axis (a decoding setting, the model or the persona set) is evaluated and the card and the
report name what it shares; ``--strict-heldout`` refuses any shared axis.

Exit codes: 0 done; 1 every episode failed; 2 bad input (unknown env, panel, policy, unreachable endpoint,
an ``--out`` holding another evaluation or something else, one another run is writing, a full disk, ...),
with a one-line message; 130 interrupted (finished episodes are kept: rerun with ``--resume``). Every limit:
``docs/limits.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from simpop.user_input import SEED, THREADS, integer, number

log = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("policy specs: openai:BASE_URL#MODEL | hf:PATH | transformers:PATH | smollm2 | run:DIR[@STEP] | "
                     "reference | module:attr\n"
                     "compare:      simpop eval compare A B   (two --out folders; paired B - A per member and task)")
    parser.add_argument("action", nargs="*", metavar="compare A B",
                        help="compare two evaluation folders instead of running one")
    parser.add_argument("--env", help="registered env id (simpop envs lists them)")
    parser.add_argument("--policy", help="what plays the policy seat (forms below)")
    parser.add_argument("--panel", help="a shipped panel's name (e.g. p4g-act-v1) or a panel YAML file")
    parser.add_argument("--episodes", type=integer(1, 1_000_000),
                        help="episodes per panel member (distinct scenarios while there are enough)")
    parser.add_argument("--num-trials", type=integer(1, 10_000), help="trials of every task per member (instead of --episodes; "
                                                       "τ² pass^k for k = 1..K)")
    parser.add_argument("--seed", type=SEED, default=0, help="seeds scenarios, env resets and sampling (default 0); "
                                                            "compare: the bootstrap's seed")
    parser.add_argument("--out", type=Path, help="output folder (compare: where to write compare.json/.md)")
    parser.add_argument("--resume", action="store_true", help="continue the evaluation in --out")
    parser.add_argument("--concurrency", type=integer(1, 4096), default=8, help="dialogues run side by side (default 8)")
    parser.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="env constructor argument (YAML value), repeatable, e.g. --env-arg max_turns=4")
    parser.add_argument("--run", type=Path, help="a simpop train run folder: check that the panel is held out from "
                                                 "its simulators (default: the run of a run:DIR policy)")
    parser.add_argument("--strict-heldout", action="store_true",
                        help="with a training run: refuse a panel member that shares any axis (persona set, decoding, "
                             "model) with a training simulator, not only one that is a training simulator")
    parser.add_argument("--temperature", type=number(0, 100), default=0.0, help="text policies' temperature (default 0)")
    parser.add_argument("--top-p", type=number(0, 1, above=True), default=1.0, help="text policies' nucleus mass (default 1)")
    parser.add_argument("--max-new-tokens", type=integer(1, 1_000_000), default=512, help="text policies' reply limit (default 512)")
    parser.add_argument("--resamples", type=integer(1, 10_000_000), default=10_000, help="compare: bootstrap resamples (default 10000)")
    parser.add_argument("--threads", type=THREADS, help="torch CPU threads")
    parser.add_argument("--ray", action="store_true", help="run the chunks in Ray rollout workers, one chunk per "
                                                           "worker at a time (pip install 'simpop[ray]'; same "
                                                           "records; the policy must be act-level, scripted or "
                                                           "openai:URL#MODEL)")
    parser.add_argument("--ray-address", help="a running Ray cluster to join (default: start a local one)")
    parser.add_argument("--ray-workers", type=integer(1, 4096), default=2, help="Ray rollout workers (default 2)")
    parser.add_argument("--ray-worker-cpus", type=number(0, 1024, above=True), default=1.0,
                        help="CPUs each Ray worker reserves (fractions share a core; default 1)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--sim-generator", default="", metavar="vllm:launch|vllm:URL",
                        help="LLM panel members generate on vLLM: a server launched per model (vllm:launch; "
                             "make vllm-env on a CPU) or a running one (vllm:http://HOST:PORT); all members run "
                             "in one wave, their calls of a tick sent together (default: in process, member by "
                             "member)")
    parser.add_argument("--waves", choices=("auto", "panel", "member"), default="auto",
                        help="panel: every member's dialogues of a chunk in one wave (one batched call per seat per "
                             "tick); member: member by member; auto (default): panel where that gives the member-"
                             "by-member records (a policy that draws nothing from its generator: tau2's gold "
                             "agent, greedy text policies) or with --sim-generator, else member")


def run(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="simpop eval: %(levelname)s: %(message)s")
    if args.action:
        return _compare(args)
    try:
        return _evaluate(args)
    except _InputError as error:
        print(f"simpop eval: error: {error}", file=sys.stderr)
        return 2


def _one_wave(args: argparse.Namespace) -> bool | None:
    """``evaluate_panel``'s ``one_wave`` for ``--waves`` (auto: decided by the policy, or yes with --sim-generator)."""
    if args.waves != "auto":
        return args.waves == "panel"
    return True if args.sim_generator else None


class _InputError(Exception):
    """Bad input: printed as one line, exit code 2."""


def _one_line(error: BaseException) -> str:
    from simpop.user_input import error_line

    return error_line(error)


def _evaluate(args: argparse.Namespace) -> int:
    missing = [flag for flag, value in (("--env", args.env), ("--policy", args.policy), ("--panel", args.panel),
                                        ("--out", args.out)) if not value]
    if missing:
        raise _InputError(f"{', '.join(missing)} required (or: simpop eval compare A B)")
    if (args.episodes is None) == (args.num_trials is None):
        raise _InputError("give exactly one of --episodes N (per member) and --num-trials K (every task K times)")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    import yaml

    from simpop.agents.base import SamplingParams
    from simpop.agents.openai_backend import BackendUnavailable, RemoteBackendError
    from simpop.agents.vllm_server import VLLMServerError, VLLMUnavailable

    setup_errors = (ValueError, KeyError, TypeError, FileNotFoundError, ImportError, RemoteBackendError,
                    VLLMServerError, VLLMUnavailable, yaml.YAMLError, json.JSONDecodeError)
    try:
        import simpop
        from simpop.envs.registration import parse_env_args
        from simpop.evaluation.policies import load_policy

        kwargs = parse_env_args(args.env_arg)
        from simpop.rollout_ray import RayConfig, import_ray

        ray = RayConfig(args.ray, args.ray_address, args.ray_workers, args.ray_worker_cpus) if args.ray else None
        if ray is not None:
            import_ray()  # not installed: say how to install it, before anything runs
        env = simpop.make(args.env, **kwargs)
        backends = None
        if args.sim_generator:
            from simpop.agents.vllm_backend import ServedModels

            if not args.sim_generator.startswith("vllm:"):
                raise ValueError(f"--sim-generator must be vllm:launch or vllm:http://HOST:PORT, "
                                 f"got {args.sim_generator!r}")
            backends = ServedModels(args.sim_generator[len("vllm:"):])
        panel, card = load_panel_arg(args.panel, env, args.env, backends)
        print(card)
        print(f"policy: {args.policy}")
        sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
        policy = load_policy(args.policy, env, env_id=args.env, sampling=sampling, max_concurrency=args.concurrency)
        run_dir = args.run
        if run_dir is None and args.policy.startswith("run:"):
            run_dir = Path(args.policy[len("run:"):].rpartition("@")[0] or args.policy[len("run:"):])
        heldout = None
        if run_dir is not None:
            heldout = check_against_run(panel, run_dir, env, strict=args.strict_heldout)
            from simpop.evaluation.panels import heldout_lines

            print(heldout_lines(panel.name, heldout))
    except setup_errors as error:
        raise _InputError(_one_line(error)) from None

    from simpop.evaluation.eval_run import evaluate_panel
    from simpop.evaluation.eval_summary import REPORT

    try:
        summary = evaluate_panel(args.env, policy, panel, episodes=args.episodes, num_trials=args.num_trials,
                                 seed=args.seed, out=args.out, resume=args.resume, concurrency=args.concurrency,
                                 env_kwargs=kwargs, progress=not args.no_progress, policy_spec=args.policy,
                                 ray=ray, one_wave=_one_wave(args), heldout=heldout)
    except ValueError as error:  # settings: an --out holding another evaluation, a resume that does not match
        raise _InputError(_one_line(error)) from None
    except OSError as error:  # a full disk, a folder removed under the run: finished chunks are kept
        raise _InputError(f"writing {args.out} failed ({_one_line(error)}); the finished episodes are kept: fix "
                          f"that, then rerun the same command with --resume") from None
    except KeyboardInterrupt:
        print(f"\nsimpop eval: interrupted; finished episodes are kept in {args.out}; rerun with --resume",
              file=sys.stderr)
        return 130
    except BackendUnavailable as error:  # the model server died mid-run: not the policy's failure
        print(f"simpop eval: error: a model server failed during the run ({_one_line(error)}); the finished episodes "
              f"are kept in {args.out}: once the server is back, rerun the same command with --resume",
              file=sys.stderr)
        return 1
    report = (args.out / REPORT).read_text(encoding="utf-8")
    start = report.index("## Success")
    end = report.index("\n## ", start + 1)
    print(report[start:end].strip())
    if summary.get("tau2") and summary["tau2"].get("pass_hat_k"):
        print("pass^k: " + ", ".join(f"k={k}: {v:.3f}" for k, v in summary["tau2"]["pass_hat_k"].items()))
    print(f"wrote {args.out}/summary.json, report.md, success.png, episodes.jsonl")
    if summary["errors"]:
        print(f"simpop eval: {summary['errors']} of {summary['episodes']} episode(s) failed with an error "
              f"(see 'error' in episodes.jsonl); they count as failures", file=sys.stderr)
    if summary["episodes"] and summary["errors"] == summary["episodes"]:
        return 1
    return 0


def load_panel_arg(name_or_path: str, env: Any, env_id: str, backends: Any = None) -> tuple[Any, str]:
    """The panel ``--panel`` names (a shipped panel or a YAML file) and its printable card (``backends``: the
    members' model cache, e.g. :class:`~simpop.agents.vllm_backend.ServedModels`)."""
    from simpop.evaluation.panels import panel_card, panel_definition
    from simpop.simulators.registry import load_panel

    definition = panel_definition(name_or_path)
    definition.check_env(env_id)
    panel = load_panel({"name": definition.name, "members": dict(definition.members)}, env, backends)
    return panel, panel_card(panel, definition.description or None)


def check_against_run(panel: Any, run_dir: Path, env: Any, strict: bool = False) -> dict[str, Any]:
    """Raise PanelOverlapError unless ``panel`` is held out from the simulators of training run ``run_dir``
    (``strict``: every axis differs); returns the check for the summary: ``run``, ``strict`` and ``look_alikes``
    (member label -> what it shares with training)."""
    from simpop.simulators.population import Population, look_alike_lines
    from simpop.simulators.registry import build_many, build_simulator

    info_path = Path(run_dir) / "run.json"
    if not info_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a simpop run folder (no run.json)")
    info = json.loads(info_path.read_text())
    if info.get("simulator"):  # simpop train
        training = build_simulator(info["simulator"], env)
        alike = panel.check_disjoint(training if isinstance(training, Population) else [training], strict=strict)
        return {"run": str(run_dir), "strict": strict, "look_alikes": look_alike_lines(alike)}
    specs = dict(info.get("simulators") or {})  # an experiment's run: name -> spec
    if info.get("trainer") == "adaptive-pool":  # the pool grew: its members at every kept checkpoint count too
        from simpop import checkpoint

        for path in checkpoint.by_step(Path(run_dir)).values():
            specs.update(checkpoint.load(path, restore_rng=False)[1].get("specs") or {})
    if not specs:
        raise ValueError(f"{info_path} names no training simulator")
    alike = panel.check_disjoint(build_many(specs, env), strict=strict)
    return {"run": str(run_dir), "strict": strict, "look_alikes": look_alike_lines(alike)}


def _compare(args: argparse.Namespace) -> int:
    if len(args.action) != 3 or args.action[0] != "compare":
        print(f"simpop eval: error: unknown arguments {' '.join(args.action)!r}; use simpop eval compare A B, or "
              f"simpop eval --env ... --policy ... --panel ...", file=sys.stderr)
        return 2
    from simpop.evaluation.eval_compare import compare_evaluations, compare_table

    try:
        result = compare_evaluations(args.action[1], args.action[2], resamples=args.resamples, seed=args.seed)
    except (ValueError, FileNotFoundError) as error:
        print(f"simpop eval compare: error: {_one_line(error)}", file=sys.stderr)
        return 2
    table = compare_table(result)
    print(table, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compare.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        (args.out / "compare.md").write_text(table, encoding="utf-8")
    return 0
