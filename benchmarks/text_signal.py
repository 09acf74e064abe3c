"""Does text-level GRPO get a gradient? Informative groups and survey entropy per user simulator.

A GRPO group whose dialogues all get the same reward has zero advantage: it teaches nothing. With the
embedded SmolLM2-135M in both seats of ``simpop/Persuasion-v1`` (P4G with the closing survey), the same
policy (SmolLM2 sampling at temperature 1) plays the same scenarios with the same seeds against three
user simulators built from the same model and the same persona prompts:

- ``frozen-greedy``: :class:`~simpop.simulators.llm.LLMSimulator` at temperature 0 (replies and survey
  answer the argmax: the mode-collapsed simulator);
- ``temperature-1``: the same at temperature 1 (the survey answer drawn from the options' softmax);
- ``verbalized``: :class:`~simpop.simulators.verbalized.VerbalizedSimulator` (k candidates with
  probabilities under the JSON-schema constraint; the survey answer from its stated distribution).

Printed per simulator: the share of informative groups (reward variance > 0) and its ratio to
frozen-greedy, the success rate, how dialogues ended (decided in the dialogue vs the survey), the
survey-answer entropy (mean entropy in nats of the distribution each survey answer was drawn from,
recomputed for the dialogue's final observation; 0 for a greedy answer) and the entropy of the answers
given across all dialogues, the simulator's counted fallbacks, and wall seconds. The gap between
frozen-greedy and the others is the collapse mechanism at the text level: a deterministic simulator
makes a group's outcome depend on the policy's sampling alone. ``simpop/Persuasion-v0`` (no survey)
is not compared: an undecided dialogue scores 0 there, so its groups are almost all uninformative.

    python benchmarks/text_signal.py [--scenarios 8] [--group-size 4] [--max-turns 2] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter

import numpy as np

ENV = "simpop/Persuasion-v1"


def simulators(max_new_tokens: int, k: int) -> dict[str, str]:
    """Name -> spec of the compared simulators (same model, same personas: the scenario's)."""
    return {
        "frozen-greedy": f"frozen:smollm2?max_new_tokens={max_new_tokens}",
        "temperature-1": f"frozen:smollm2?temperature=1.0&max_new_tokens={max_new_tokens}",
        "verbalized": f"verbalized:smollm2?k={k}&max_new_tokens={max(64, 8 * max_new_tokens)}"
                      f"&fallback_max_new_tokens={max_new_tokens}",
    }


def entropy(probs: list[float]) -> float:
    return float(-sum(p * math.log(p) for p in probs if p > 0))


def survey_entropy(simulator, env, trajectories) -> list[float]:
    """Entropy of the distribution each survey answer was drawn from (recomputed: scoring and the
    constrained verbalized call are deterministic given the dialogue)."""
    from simpop.seat import survey_of

    values = []
    for t in trajectories:
        if t.infos[-1].get("outcome_source") != "survey":
            continue
        obs = t.observations[t.user_seat][-1]
        simulator.reset_batch([env.load_scenario(t.scenario_id)], [np.random.default_rng(t.seed)])
        (probs,) = simulator.survey_distribution([obs], [0], [survey_of(obs)])
        if probs is not None:
            values.append(entropy(probs))
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=8, help="GRPO groups per simulator")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--k", type=int, default=3, help="verbalized candidates")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    import simpop
    from simpop.agents.base import SamplingParams
    from simpop.agents.policy import ModelConfig, build_policy
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.rollout import RolloutEngine
    from simpop.simulators.registry import build_simulator

    torch.set_num_threads(args.threads)
    env_kwargs = {"max_turns": args.max_turns}
    env = simpop.make(ENV, **env_kwargs)
    policy = build_policy(env, ModelConfig(), SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens))
    backends = {"smollm2": TransformersBackend("smollm2")}
    print(f"{ENV} max_turns={args.max_turns}: {args.scenarios} groups x {args.group_size} dialogues per simulator, "
          f"SmolLM2 policy at temperature 1 (seed {args.seed})\n")
    header = (f"{'simulator':<15} {'informative':>11} {'vs greedy':>9} {'success':>8} {'survey':>7} "
              f"{'H(answer dist)':>14} {'H(answers)':>10} {'fallbacks':>9} {'wall s':>7}")
    print(header)
    print("-" * len(header))
    baseline = None
    for name, spec in simulators(args.max_new_tokens, args.k).items():
        simulator = build_simulator(spec, env, backends, name=name)
        start = time.perf_counter()
        trajectories = RolloutEngine(ENV, policy, simulator, env_kwargs=env_kwargs).collect(
            args.scenarios, group_size=args.group_size, seed=args.seed)
        wall = time.perf_counter() - start
        groups: dict[int, list[float]] = {}
        for t in trajectories:
            groups.setdefault(t.group, []).append(t.total_reward)
        informative = sum(np.var(r) > 0 for r in groups.values()) / len(groups)
        baseline = informative if baseline is None else baseline
        ratio = f"{informative / baseline:.2f}x" if baseline else "inf" if informative else "-"
        sources = Counter(t.infos[-1].get("outcome_source") for t in trajectories)
        answers = Counter(t.infos[-1].get("survey_answer") for t in trajectories if t.infos[-1].get("survey_answer"))
        dist_h = survey_entropy(simulator, env, trajectories)
        answer_h = entropy([n / sum(answers.values()) for n in answers.values()]) if answers else 0.0
        fallbacks = simulator.stats.get("fallbacks", 0) + simulator.stats.get("survey_fallbacks", 0)
        print(f"{name:<15} {informative:>11.2f} {ratio:>9} {np.mean([t.success for t in trajectories]):>8.2f} "
              f"{sources['survey'] / len(trajectories):>7.2f} {np.mean(dist_h) if dist_h else 0.0:>14.3f} "
              f"{answer_h:>10.3f} {fallbacks:>9d} {wall:>7.1f}")
        print(f"{'':<15} answers: {dict(answers.most_common())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
