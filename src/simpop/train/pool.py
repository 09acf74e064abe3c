"""An adaptive training pool: GRPO against a population that grows from the policy's failures and is pruned.

- :class:`PoolGrower` runs one growth round: evaluate the policy on the probe panel, hand the dialogues it lost
  to the benchmark's failure model (:func:`simpop.simulators.generation.generate`: new simulators, checked
  against the held-out panel), add them to the pool, then reweight and prune it (:meth:`Population.reweight`,
  :meth:`Population.prune`) to ``cap`` members. It is also the loop's ``grow`` for
  ``simpop train --on-collapse add-simulators``.
- :class:`AdaptivePoolTrainer` wraps a :class:`~simpop.train.grpo.GRPOTrainer` whose simulator is a
  :class:`~simpop.simulators.population.Population`: every update it records each member's contribution
  (who drove which dialogue, in which group, with which reward) and every ``grow_every`` updates it grows and
  prunes the pool. Its checkpoints hold the pool's member specs, so a resumed run rebuilds the same pool.
"""

from __future__ import annotations

from collections.abc import Collection, MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from simpop.simulators.population import Panel, Population
from simpop.validation import at_least_one, check_fields


@dataclass(frozen=True)
class PoolConfig:
    """How an adaptive pool grows and is pruned.

    Attributes:
        cap: Most members kept after pruning.
        grow_count: Most simulators added per growth round.
        probe_episodes: Dialogues per probe member per round.
        min_informative: Members with a smaller share of informative groups are retired (once judged).
        min_dialogues: Dialogues a member needs before it is judged.
        weight_floor: Smallest weight :meth:`Population.reweight` gives.
    """

    cap: int = 4
    grow_count: int = 2
    probe_episodes: int = 32
    min_informative: float = 0.05
    min_dialogues: int = 16
    weight_floor: float = 0.05

    def __post_init__(self) -> None:
        check_fields(self)
        at_least_one(self, ("cap", "grow_count", "probe_episodes", "min_dialogues"))
        if not 0 < self.weight_floor <= 1 or not 0 <= self.min_informative < 1:
            raise ValueError("PoolConfig: weight_floor must be in (0, 1] and min_informative in [0, 1)")


class PoolGrower:
    """One growth round per call (module docstring); ``grower(step, record=None) -> what it did``.

    Args:
        env_id: The env the probe runs.
        env_kwargs: Its constructor arguments.
        env: An env instance (the failure model reads scenarios from it; simulators are built for it).
        trainer: Has ``policy`` and the pool (``training_simulator``).
        probe: The probe panel (never the held-out panel).
        heldout: The held-out panel new simulators must stay disjoint from (None: not checked).
        model: The benchmark's failure model (default: :func:`~simpop.simulators.generation.failure_model`).
        config: Growth and pruning settings.
        seed: Seeds the probe dialogues and the proposals.
        protected: Member names never pruned.
        shared_model: Held-out labels allowed to share the model.
        backends: Loaded-model cache.
    """

    def __init__(self, env_id: str, env: Any, trainer: Any, probe: Panel, heldout: Panel | None = None,
                 model: Any = None, config: PoolConfig | None = None, seed: int = 0, env_kwargs: dict | None = None,
                 protected: Collection[str] = (), shared_model: Collection[str] = (),
                 backends: MutableMapping[str, Any] | None = None):
        from simpop.simulators.generation import failure_model

        if not isinstance(trainer.training_simulator, Population):
            raise ValueError("an adaptive pool needs a Population as the training simulator")
        self.env_id, self.env, self.trainer, self.probe, self.heldout = env_id, env, trainer, probe, heldout
        self.model = model if model is not None else failure_model(env)
        self.config = config or PoolConfig()
        self.rng = np.random.default_rng([seed, 16])
        self.probe_seed = 2_000_003 + seed
        self.env_kwargs, self.protected, self.shared_model = env_kwargs or {}, set(protected), shared_model
        self.backends = backends if backends is not None else {}
        self.probe_dialogues = 0

    @property
    def pool(self) -> Population:
        return self.trainer.training_simulator

    def __call__(self, step: int, record: dict[str, Any] | None = None) -> dict[str, Any]:
        from simpop.evaluation.panel import evaluate
        from simpop.simulators.generation import generate

        result = evaluate(self.env_id, self.trainer.policy, self.probe, self.config.probe_episodes,
                          self.probe_seed + step, self.env_kwargs)
        self.probe_dialogues += result.episodes
        grown = generate(self.model, result.records, self.pool, self.env, count=self.config.grow_count,
                         panel=self.heldout, shared_model=self.shared_model, rng=self.rng, backends=self.backends)
        removed = self.pool.prune(self.config.cap, self.config.min_informative, self.config.min_dialogues,
                                  protected=self.protected)
        weights = self.pool.reweight(self.config.weight_floor)
        return {"probe_success": result.success, **{f"probe/{k}": v for k, v in result.per_member.items()},
                **grown.record(), "removed": removed, "pool_size": len(self.pool.members),
                "pool_members": [m.name for m in self.pool.members], "weights": weights,
                "probe_dialogues": self.probe_dialogues}


def reply_diversity(trajectories: Any) -> float:
    """Distinct simulator replies over all simulator replies in a batch (1: never the same twice; nan: none)."""
    replies = [repr(a) for t in trajectories for a in t.actions.get(t.user_seat, [])]
    return len(set(replies)) / len(replies) if replies else float("nan")


class AdaptivePoolTrainer:
    """GRPO against a population that records contributions every update and grows every ``grow_every`` updates.

    Args:
        inner: A :class:`~simpop.train.grpo.GRPOTrainer` whose simulator is a Population.
        grower: The growth round (None: a fixed pool whose contributions are only recorded).
        grow_every: Updates between growth rounds; None: the trainer never grows the pool itself (someone else
            calls ``grower``, e.g. the loop on a collapse warning); the grower's state is still checkpointed.
        env: Rebuilds pool members from their specs on :meth:`load_state_dict`.
        backends: Loaded-model cache for rebuilding.
    """

    def __init__(self, inner: Any, grower: PoolGrower | None = None, grow_every: int | None = 10, env: Any = None,
                 backends: MutableMapping[str, Any] | None = None):
        if not isinstance(inner.training_simulator, Population):
            raise ValueError("AdaptivePoolTrainer needs a GRPO trainer whose simulator is a Population")
        if grow_every is not None and grow_every < 1:
            raise ValueError(f"grow_every must be >= 1, got {grow_every}")
        self.inner, self.grower, self.grow_every = inner, grower, grow_every
        self.env, self.backends = env, backends if backends is not None else {}
        self.last_growth: dict[str, Any] = {}

    @property
    def policy(self) -> Any:
        return self.inner.policy

    @property
    def update_count(self) -> int:
        return self.inner.update_count

    @update_count.setter
    def update_count(self, value: int) -> None:
        self.inner.update_count = value

    @property
    def training_simulator(self) -> Population:
        return self.inner.training_simulator

    def step(self) -> dict[str, float]:
        """One update of the inner trainer; records each member's contribution (informative groups, outcomes) and runs
        a growth round every ``grow_every`` updates.
        """
        batch = self.inner.collect()
        metrics = self.inner.update(batch)
        pool = self.training_simulator
        trajectories = batch.collected if getattr(batch, "collected", None) else batch.trajectories
        pool.record_groups([t.simulator for t in trajectories], [t.group for t in trajectories],
                           [t.total_reward for t in trajectories], [t.success for t in trajectories])
        metrics["pool_size"] = float(len(pool.members))
        metrics["reply_diversity"] = reply_diversity(trajectories)
        if self.grower is not None and self.grow_every is not None and self.update_count % self.grow_every == 0:
            self.last_growth = self.grower(self.update_count)
            metrics.update({"pool_added": float(self.last_growth["added"]),
                            "pool_removed": float(len(self.last_growth["removed"])),
                            "pool_size": float(len(pool.members)),
                            "probe_success": float(self.last_growth["probe_success"]),
                            "probe_dialogues": float(self.last_growth["probe_dialogues"]),
                            "pool_members": self.last_growth["pool_members"],
                            "pool_removed_names": self.last_growth["removed"],
                            "pool_added_specs": self.last_growth["added_specs"]})
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The inner trainer's state, the pool (members' specs, weights, records) and the grower's state."""
        pool = self.training_simulator
        return {"inner": self.inner.state_dict(), "pool": pool.pool_state(),
                "specs": {m.name: str(m.spec) for m in pool.members},
                "probe_dialogues": self.grower.probe_dialogues if self.grower is not None else 0,
                "grower_rng": self.grower.rng.bit_generator.state if self.grower is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the inner trainer and rebuild the pool's members from their specs."""
        from simpop.simulators.registry import build_simulator

        specs = state["specs"]
        self.training_simulator.load_pool_state(  # first: the inner trainer's population state names grown members
            state["pool"], lambda name: build_simulator(specs[name], self.env, self.backends, name=name))
        self.inner.load_state_dict(state["inner"])
        if self.grower is not None:
            self.grower.probe_dialogues = state["probe_dialogues"]
            if state["grower_rng"] is not None:
                self.grower.rng.bit_generator.state = state["grower_rng"]
