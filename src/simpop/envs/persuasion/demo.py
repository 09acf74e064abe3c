"""``simpop demo``: a few Persuasion-for-Good dialogues between a scripted persuader and the native persuadee.

The persuader follows :func:`~simpop.envs.persuasion.model.reference_persuader` (greeting, corpus-frequency
strategies, then a proposition), realised as text at the text level or as act ids at the act level.
"""

from __future__ import annotations

import argparse

import numpy as np

from simpop.envs.persuasion.acts import PERSUADER_ACTS, render_persuader
from simpop.envs.persuasion.env import MAX_TURNS
from simpop.envs.persuasion.model import reference_persuader
from simpop.envs.wrappers import make_user_seat
from simpop.user_input import SEED, integer


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=integer(1, 10_000), default=3, help="dialogues to run (default 3)")
    parser.add_argument("--seed", type=SEED, default=0, help="seed of the first dialogue (default 0)")
    parser.add_argument("--level", choices=("text", "act"), default="text",
                        help="text: Persuasion-v0 with free text; act: PersuasionAct-v0 over dialogue acts")
    parser.add_argument("--max-turns", type=integer(1, MAX_TURNS), default=10,
                        help="persuader turns per dialogue (default 10)")


def run(args: argparse.Namespace) -> int:
    env_id = "simpop/Persuasion-v0" if args.level == "text" else "simpop/PersuasionAct-v0"
    env = make_user_seat(env_id, max_turns=args.max_turns)
    successes = 0
    for episode in range(args.episodes):
        seed = args.seed + episode
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        persona = env.env.scenario.persona
        print(f"=== {env_id} episode {episode + 1}/{args.episodes} (seed {seed}, scenario {env.env.scenario.id}: "
              f"{int(persona.age)}-year-old {persona.sex.lower()}, {persona.ideology.lower()}, "
              f"care {persona.care:.1f}/6, income bracket {int(persona.income)})")
        reward, info, done = 0.0, {}, False
        for act in reference_persuader(rng, args.max_turns):
            action = render_persuader(act, rng) if args.level == "text" else PERSUADER_ACTS.index(act)
            _, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                done = True
                break
        for turn in env.env.transcript:
            act = f" ({turn.act})" if turn.act else ""
            print(f"  [{turn.seat}]{act} {turn.text}")
        donation = info.get("donation")
        outcome = "no decision" if donation is None else f"donated ${donation:.2f}" if donation > 0 else "declined"
        print(f"  -> {outcome}; persuader reward {reward:.0f}{'' if done else ' (dialogue still open)'}\n")
        successes += int(reward > 0)
    print(f"persuader success: {successes}/{args.episodes}")
    return 0
