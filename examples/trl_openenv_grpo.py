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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile

ENV = "simpop/Persuasion-v1"
POPULATION = ["persuadee?temperature=0.5", "persuadee?decoding=greedy"]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running simpop OpenEnv server (default: start one in this process)")
    parser.add_argument("--steps", type=int, default=2, help="GRPO updates")
    parser.add_argument("--group", type=int, default=4, help="dialogues per scenario (GRPO group)")
    parser.add_argument("--max-turns", type=int, default=2, help="persuader turns per dialogue (in-process server)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens per policy turn")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="TRL's output directory (default: a temporary one)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    from trl import GRPOConfig, GRPOTrainer

    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.integrations.openenv_server import UserSeatSource, make_server
    from simpop.integrations.openenv_trl import make_rollout_func
    from simpop.train.trl_adapter import env_reward, scenario_dataset

    env_kwargs = {"max_turns": args.max_turns}
    with contextlib.ExitStack() as stack:
        url = args.url
        if url is None:
            server = make_server(UserSeatSource(ENV, POPULATION, env_kwargs=env_kwargs), port=0).start()
            stack.callback(server.close)
            url = server.url
        out = args.out or stack.enter_context(tempfile.TemporaryDirectory())
        backend = TransformersBackend("smollm2", trainable=True)
        rollout = make_rollout_func(url, backend, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                    system_prompt="You are raising money for Save the Children. Ask the user to "
                                                  "donate part of their $2 payment, briefly and kindly.")
        batches: list[dict] = []

        def recording(prompts, trainer):
            batches.append(rollout(prompts, trainer))
            return batches[-1]

        config = GRPOConfig(output_dir=out, per_device_train_batch_size=args.group, num_generations=args.group,
                            max_steps=args.steps, learning_rate=args.lr, logging_steps=1, report_to=[],
                            use_cpu=True, save_strategy="no", bf16=False, disable_tqdm=True, seed=args.seed)
        trainer = GRPOTrainer(model=backend.model, processing_class=backend.tokenizer, reward_funcs=env_reward,
                              train_dataset=scenario_dataset(ENV, n=4 * args.steps, env_kwargs=env_kwargs,
                                                             seed=args.seed),
                              rollout_func=recording, args=config)
        before = {n: p.detach().clone() for n, p in backend.model.named_parameters() if p.requires_grad}
        trainer.train()
        moved = max(float((p.detach() - before[n]).abs().max()) for n, p in backend.model.named_parameters()
                    if p.requires_grad)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for log in logs:
        print(json.dumps({k: v for k, v in log.items() if isinstance(v, (int, float))}), flush=True)
    summary = {"updates": trainer.state.global_step, "max_weight_change": moved,
               "reward_per_update": [log["reward"] for log in logs],
               "policy_token_share": [sum(map(sum, b["env_mask"])) / max(1, sum(map(len, b["completion_ids"])))
                                      for b in batches],
               "simulators": sorted({s for b in batches for s in b["simulator"]})}
    print(json.dumps(summary), flush=True)
    return {"summary": summary, "logs": logs, "batches": batches}


if __name__ == "__main__":
    main()
