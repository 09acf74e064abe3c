"""Train SmolLM2 with TRL's GRPOTrainer against a simpop simulator population served over OpenEnv.

The server side is ``simpop openenv serve``: a Persuasion-for-Good env whose user seat is a population of
native persuadees. The trainer side is plain TRL: ``GRPOTrainer(rollout_func=...)`` with simpop's OpenEnv
``rollout_func`` (:mod:`simpop.integrations.openenv_trl`), which plays each dialogue in its own server
session and masks the user's turns out of the loss. By default the server runs in this process on a free
loopback port; ``--url`` trains against one already running::

    simpop openenv serve --env simpop/Persuasion-v1 --env-arg max_turns=2 \\
        --simulator "persuadee?temperature=0.5" --simulator "persuadee?decoding=greedy" &
    python examples/trl_openenv_grpo.py --url http://127.0.0.1:8000 --steps 2

Prints one JSON line per update (TRL's logs: reward, loss, completion length, ...) and a summary line.
``--report-to`` is TRL's ``report_to`` with simpop's names (``tensorboard``, the default, under ``--out``; ``wandb``;
both comma-separated; ``none``; ``all``), e.g. ``WANDB_MODE=offline ... --report-to wandb``.

With ``--eval-n N`` the policy also plays N seeds of each native member of the held-out panel
``p4g-text-v1`` (a second, panel-mode server; held-out persuadee models and personas) before and after
training, with the same sampling seeds, and the summary reports held-out success before, after, and their
paired difference with a 95% CI (the decision rule in docs/results/integrations.md), and the same for the held-out
persuadees' expected success (their decision's probability of a donation). ``--reward expected`` trains on each
dialogue's expected success (``simpop.train.trl_adapter.expected_reward``) instead of the env's 0/1 reward.
The learning run there::

    python examples/trl_openenv_grpo.py --simulator persuadee --steps 24 --group 8 --max-new-tokens 24 \
        --lr 5e-5 --lr-scheduler constant --eval-n 40
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile

ENV = "simpop/Persuasion-v1"
POPULATION = ["persuadee?temperature=0.5", "persuadee?decoding=greedy"]
EVAL_PANEL = "p4g-text-v1"
EVAL_MEMBERS = ["heldout-0-T0.8", "heldout-1-T0.9", "heldout-2-T1.2"]  # the panel's native persuadees
SYSTEM_PROMPT = "You are raising money for Save the Children. Ask the user to donate part of their $2 payment, " \
                "briefly and kindly."


def paired_difference(before: list[float], after: list[float], clusters: int | None = None) -> dict[str, float]:
    """Mean of after - before over paired dialogues, with its normal 95% CI; with ``clusters`` the dialogues are
    that many equal runs of clusters (dialogue ``i`` in cluster ``i % clusters``: one held-out seed played by
    every member, which shares the seed's persona and draws) and the CI is over the clusters' mean differences."""
    import numpy as np

    diff = np.asarray(after, dtype=float) - np.asarray(before, dtype=float)
    if clusters is not None:
        diff = diff.reshape(-1, clusters).mean(axis=0)
    half = 1.96 * float(diff.std(ddof=1)) / np.sqrt(len(diff)) if len(diff) > 1 else float("nan")
    return {"mean": float(diff.mean()), "ci95": [float(diff.mean()) - half, float(diff.mean()) + half], "n": len(diff)}


def trend(values: list[float]) -> dict[str, float]:
    """Least-squares slope of ``values`` against the update index, with its normal 95% CI."""
    import numpy as np

    y = np.asarray(values, dtype=float)
    x = np.arange(len(y), dtype=float)
    if len(y) < 3:
        return {"slope": float("nan"), "ci95": [float("nan"), float("nan")]}
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    se = float(np.sqrt(residual.var(ddof=2) / ((x - x.mean()) ** 2).sum()))
    return {"slope": float(slope), "ci95": [float(slope) - 1.96 * se, float(slope) + 1.96 * se]}


def main(argv: list[str] | None = None) -> dict:
    from simpop.evaluation.trackers import TrackerError, report_to_flag, require, trackers_named

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running simpop OpenEnv server (default: start one in this process)")
    parser.add_argument("--steps", type=int, default=2, help="GRPO updates")
    parser.add_argument("--group", type=int, default=4, help="dialogues per scenario (GRPO group)")
    parser.add_argument("--prompts-per-step", type=int, default=1, help="scenarios per GRPO update")
    parser.add_argument("--max-turns", type=int, default=2, help="persuader turns per dialogue (in-process server)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens per policy turn")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--lr-scheduler", default="linear", help="TRL's lr_scheduler_type (linear, constant, ...)")
    parser.add_argument("--simulator", action="append", dest="population",
                        help=f"a user-seat simulator spec of the in-process server, repeatable (default: {POPULATION})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="TRL's output directory (default: a temporary one)")
    parser.add_argument("--report-to", type=report_to_flag, default="tensorboard", metavar="NAMES",
                        help="TRL's report_to: tensorboard (default), wandb (pip install 'simpop[wandb]'), both "
                             "comma-separated, none, or all (every one installed)")
    parser.add_argument("--eval-n", type=int, default=0,
                        help=f"held-out seeds per native member of {EVAL_PANEL}, played before and after training")
    parser.add_argument("--eval-seed", type=int, default=10_000, help="first held-out seed")
    parser.add_argument("--eval-batch", type=int, default=50, help="held-out dialogues generated together")
    parser.add_argument("--reward", choices=("env", "expected"), default="env",
                        help="train on the env's reward, or on the persuadee's expected success (its decision's "
                             "probability of a donation, the same expectation without the draw)")
    args = parser.parse_args(argv)
    try:
        require(args.report_to)
    except TrackerError as error:
        parser.error(str(error))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    from trl import GRPOConfig, GRPOTrainer

    from simpop.agents.base import SamplingParams
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.integrations.openenv_server import ServerLimits, UserSeatSource, make_server
    from simpop.integrations.openenv_trl import make_rollout_func, play_dialogues
    from simpop.train.trl_adapter import env_reward, expected_reward, scenario_dataset

    env_kwargs = {"max_turns": args.max_turns}
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            server = make_server(UserSeatSource(ENV, args.population or POPULATION, env_kwargs=env_kwargs),
                                 port=0).start()
            stack.callback(server.close)
            url = server.url
        out = args.out or stack.enter_context(tempfile.TemporaryDirectory())
        backend = TransformersBackend("smollm2", trainable=True)
        rollout = make_rollout_func(url, backend, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                    system_prompt=SYSTEM_PROMPT)
        evaluate, held_out_before = None, {}
        if args.eval_n > 0:
            panel = make_server(UserSeatSource(ENV, panel=EVAL_PANEL, env_kwargs=env_kwargs), port=0,
                                limits=ServerLimits(max_sessions=args.eval_batch)).start()
            stack.callback(panel.close)
            resets = [{"seed": args.eval_seed + i, "member": m} for m in EVAL_MEMBERS for i in range(args.eval_n)]
            # The training sampling (TRL's default temperature 1.0), the same seeds before and after: paired.
            sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, logprobs=True)

            def evaluate() -> dict[str, list]:
                played = [play_dialogues(panel.url, backend, resets[at:at + args.eval_batch], sampling,
                                         [args.seed, 999, at], SYSTEM_PROMPT) for at in range(0, len(resets), args.eval_batch)]
                return {"success": [s for p in played for s in p.successes],
                        "expected": [e for p in played for e in p.expected]}

            held_out_before = evaluate()
        batches: list[dict] = []

        def recording(prompts, trainer):
            batches.append(rollout(prompts, trainer))
            return batches[-1]

        config = GRPOConfig(output_dir=out, per_device_train_batch_size=args.group * args.prompts_per_step,
                            num_generations=args.group,
                            max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type=args.lr_scheduler,
                            logging_steps=1, report_to=list(trackers_named(args.report_to)),
                            use_cpu=True, save_strategy="no", bf16=False, disable_tqdm=True, seed=args.seed)
        reward = expected_reward if args.reward == "expected" else env_reward
        trainer = GRPOTrainer(model=backend.model, processing_class=backend.tokenizer, reward_funcs=reward,
                              train_dataset=scenario_dataset(ENV, n=args.prompts_per_step * args.steps, env_kwargs=env_kwargs,
                                                             seed=args.seed),
                              rollout_func=recording, args=config)
        before = {n: p.detach().clone() for n, p in backend.model.named_parameters() if p.requires_grad}
        trainer.train()
        if "wandb" in config.report_to:  # TRL leaves its W&B run open until the process exits: finish it here
            import wandb

            wandb.finish()
        moved = max(float((p.detach() - before[n]).abs().max()) for n, p in backend.model.named_parameters()
                    if p.requires_grad)
        held_out_after = evaluate() if evaluate is not None else None
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for log in logs:
        print(json.dumps({k: v for k, v in log.items() if isinstance(v, (int, float))}), flush=True)
    trained_on = "expected_success" if args.reward == "expected" else "env_reward"
    summary = {"updates": trainer.state.global_step, "max_weight_change": moved, "reward": args.reward,
               "reward_per_update": [log["reward"] for log in logs],
               "success_per_update": [sum(b["success"]) / len(b["success"]) for b in batches],
               "policy_token_share": [sum(map(sum, b["env_mask"])) / max(1, sum(map(len, b["completion_ids"])))
                                      for b in batches],
               "simulators": sorted({s for b in batches for s in b["simulator"]}),
               "zero_variance_groups": sum(len(set(b[trained_on][g:g + args.group])) == 1
                                           for b in batches for g in range(0, len(b[trained_on]), args.group)),
               "reward_trend": trend([log["reward"] for log in logs])}
    if held_out_after is not None:
        before, after = held_out_before["success"], held_out_after["success"]
        summary["held_out"] = {"panel": EVAL_PANEL, "members": EVAL_MEMBERS, "seeds_per_member": args.eval_n,
                               "before": sum(before) / len(before), "after": sum(after) / len(after),
                               "difference": paired_difference(before, after),
                               "difference_by_seed": paired_difference(before, after, clusters=args.eval_n)}
        before, after = held_out_before["expected"], held_out_after["expected"]
        if None not in before + after:
            summary["held_out"].update(expected_before=sum(before) / len(before), expected_after=sum(after) / len(after),
                                       expected_difference=paired_difference(before, after),
                                       expected_difference_by_seed=paired_difference(before, after, args.eval_n))
    print(json.dumps(summary), flush=True)
    return {"summary": summary, "logs": logs, "batches": batches}


if __name__ == "__main__":
    main()
