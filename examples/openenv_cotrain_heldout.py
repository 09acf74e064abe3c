"""An outside-trained policy against a co-training OpenEnv server vs a frozen one, scored on a held-out panel.

The policy trainer here is deliberately not simpop's: a linear softmax policy over the 14 persuader acts of
``simpop/PersuasionAct-v0``, trained with REINFORCE (batch-mean baseline, Adam) through OpenEnv's client
only. It trains against ``simpop openenv serve --simulator trainable:persuadee``, once with ``--cotrain``
(the server trains the persuadee on the episodes it hosts, objective ``target``) and once without (the
same simulator, frozen), with the same seeds. Each trained policy then plays the held-out panel
``p4g-act-v1`` on a panel server (members the training never saw). Printed per seed and condition: the
simulator's movement (max |theta - base|) and versions, training success, held-out success per member.

Decision rule, fixed before running: co-training "helps" (or "hurts") the held-out success only if the
mean difference over seeds exceeds twice its standard error; otherwise the result is reported as no
detectable difference at this size::

    python examples/openenv_cotrain_heldout.py [--seeds 3] [--train-episodes 600] [--eval-episodes 300]
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch

ENV = "simpop/PersuasionAct-v0"
N_ACTS = 14


def run_episodes(url: str, policy: torch.nn.Module, episodes: int, seed: int, learn: torch.optim.Optimizer | None,
                 batch: int = 20) -> dict:
    """Play ``episodes`` through the server (REINFORCE updates every ``batch`` episodes when ``learn``)."""
    from simpop.integrations.openenv_client import SimpopEnvClient

    generator = torch.Generator().manual_seed(seed)
    successes: list[float] = []
    members: dict[str, list[float]] = {}
    versions: dict[str, int] = {}
    logps: list[torch.Tensor] = []
    rewards: list[float] = []
    with SimpopEnvClient(base_url=url, message_timeout_s=120.0).sync() as env:
        for episode in range(episodes):
            result = env.reset(seed=seed * 100_000 + episode)
            versions = result.metadata.get("simulator_versions", versions)
            logp, total = torch.zeros(()), 0.0
            while not result.done:
                observation = torch.tensor(json.loads(result.observation.text), dtype=torch.float32)
                dist = torch.distributions.Categorical(logits=policy(observation))
                act = torch.multinomial(dist.probs, 1, generator=generator)[0]
                logp = logp + dist.log_prob(act)
                result = env.step(int(act))
                total += float(result.reward or 0.0)
            info = result.metadata.get("info", {})
            success = float(info["success"]) if "success" in info else float(total > 0)
            successes.append(success)
            members.setdefault(result.metadata["simulator"], []).append(success)
            logps.append(logp)
            rewards.append(success)
            if learn is not None and len(logps) == batch:
                r = torch.tensor(rewards)
                loss = -((r - r.mean()) * torch.stack(logps)).mean()
                learn.zero_grad()
                loss.backward()
                learn.step()
                logps, rewards = [], []
            elif learn is None:
                logps, rewards = [], []
    return {"success": float(np.mean(successes)), "per_member": {k: float(np.mean(v)) for k, v in members.items()},
            "versions": versions}


def one_seed(seed: int, cotrain: bool, train_episodes: int, eval_episodes: int, episodes_per_update: int) -> dict:
    from simpop.integrations.openenv_cotrain import ServerCoTrainer
    from simpop.integrations.openenv_server import UserSeatSource, make_server

    torch.manual_seed(seed)
    policy = torch.nn.Linear(40, N_ACTS)
    torch.nn.init.zeros_(policy.weight)
    torch.nn.init.zeros_(policy.bias)
    source = UserSeatSource(ENV, ["trainable:persuadee"])
    cotrainer = ServerCoTrainer(source, episodes_per_update=episodes_per_update) if cotrain else None
    environment = None if cotrainer is None else cotrainer.environment
    with make_server(source, port=0, environment=environment).start() as server:
        train = run_episodes(server.url, policy, train_episodes, seed, torch.optim.Adam(policy.parameters(), lr=0.05))
    moved = 0.0
    if cotrainer is not None:
        cotrainer.close()
        master = cotrainer.masters["trainable:persuadee"]
        base = torch.as_tensor(master.base.to_vector(), dtype=master.theta.dtype)
        moved = float((master.theta.detach() - base).abs().max())
    with make_server(UserSeatSource(ENV, panel="p4g-act-v1"), port=0).start() as server, torch.no_grad():
        heldout = run_episodes(server.url, policy, eval_episodes, 10_000 + seed, None)
    return {"seed": seed, "cotrain": cotrain, "train_success": train["success"],
            "simulator_versions": train["versions"], "simulator_moved": moved,
            "heldout_success": heldout["success"], "heldout_per_member": heldout["per_member"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--train-episodes", type=int, default=600)
    parser.add_argument("--eval-episodes", type=int, default=300)
    parser.add_argument("--episodes-per-update", type=int, default=16, help="the server's simulator batch")
    args = parser.parse_args(argv)
    rows = []
    for seed in range(args.seeds):
        for cotrain in (False, True):
            rows.append(one_seed(seed, cotrain, args.train_episodes, args.eval_episodes, args.episodes_per_update))
            print(json.dumps(rows[-1]), flush=True)
    frozen = np.array([r["heldout_success"] for r in rows if not r["cotrain"]])
    cotrained = np.array([r["heldout_success"] for r in rows if r["cotrain"]])
    diff = cotrained - frozen
    se = float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else float("nan")
    verdict = ("helps" if diff.mean() > 2 * se else "hurts" if diff.mean() < -2 * se
               else "no detectable difference at this size")
    summary = {"heldout_success_frozen": float(frozen.mean()), "heldout_success_cotrain": float(cotrained.mean()),
               "difference": float(diff.mean()), "standard_error": se, "verdict": verdict,
               "simulator_moved_mean": float(np.mean([r["simulator_moved"] for r in rows if r["cotrain"]]))}
    print(json.dumps(summary), flush=True)
    return {"rows": rows, "summary": summary}


if __name__ == "__main__":
    main()
