"""Evaluate a policy on simulators: success per held-out panel member and overall, and policy entropy.

:func:`evaluate` runs ``episodes`` dialogues of the policy against each simulator (a panel member, or
the training simulator) with the :class:`~simpop.rollout.RolloutEngine`, sampling the policy as
it is trained. The same ``seed`` gives every call the same scenarios and env seeds, so conditions and
evaluation points are compared on common random numbers.

Policy entropy is measured on the policy's own decisions in those dialogues by the policy itself
(:class:`~simpop.agents.policy.Policy`): act level, the entropy of its action distribution at each
decision; text level, the mean per-token entropy of its generated tokens. Both are in nats; a policy
without an ``entropy`` method (a remote model, a scripted agent) reports nan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simpop.rollout import RolloutEngine, Trajectory
from simpop.seat import Simulator
from simpop.simulators.population import Panel


@dataclass
class EvalResult:
    """Success against each simulator and overall, and the policy's entropy.

    Attributes:
        success: Mean success over all dialogues (every member weighs the same: equal episode counts).
        per_member: Success per simulator name.
        entropy: Mean policy entropy (nats) over its decisions in all dialogues.
        episodes: Dialogues run in total.
    """

    success: float
    per_member: dict[str, float] = field(default_factory=dict)
    entropy: float = math.nan
    episodes: int = 0


def policy_entropy(policy: Any, trajectories: list[Trajectory]) -> float:
    """Mean entropy of ``policy`` at its own decisions in ``trajectories`` (its ``entropy`` method; nan if it
    has none, e.g. a remote or scripted policy)."""
    entropy = getattr(policy, "entropy", None)
    return float(entropy(trajectories)) if callable(entropy) else math.nan


def evaluate(env_id: str, policy: Any, simulators: Panel | Mapping[str, Simulator] | Simulator, episodes: int,
             seed: int = 0, env_kwargs: dict[str, Any] | None = None) -> EvalResult:
    """Run ``episodes`` dialogues against each simulator and summarise them.

    Args:
        env_id: The registered env.
        policy: The policy (act or text); it is sampled, not made greedy.
        simulators: A :class:`Panel`, a name -> simulator mapping, or one simulator.
        episodes: Dialogues per simulator (distinct scenarios while the env has enough).
        seed: Seeds scenario choice, env resets and the policy's sampling (same seed, same dialogues).
        env_kwargs: Env constructor arguments.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    members = (dict(simulators.members) if isinstance(simulators, Panel)
               else dict(simulators) if isinstance(simulators, Mapping) else {simulators.name: simulators})
    per_member, everything = {}, []
    for name, simulator in members.items():
        engine = RolloutEngine(env_id, policy, simulator, env_kwargs=env_kwargs)
        trajectories = engine.collect(episodes, group_size=1, seed=seed)
        per_member[name] = float(np.mean([t.success for t in trajectories]))
        everything += trajectories
    return EvalResult(float(np.mean([t.success for t in everything])), per_member,
                      policy_entropy(policy, everything), len(everything))
