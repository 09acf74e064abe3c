"""Self-play: the policy also fills the user seat; each seat learns from its own turns and its own reward.

User-seat kinds (:data:`SELF_KINDS`, ``simpop train selfplay --simulator KIND``):

- ``self``: the current policy plays the user seat too. At the text level that is the same LLM with the user seat's
  own brief (:class:`~simpop.simulators.self_seat.PolicySeat`). On an env whose seats each read their own text format
  (``env.text_format_for(seat)``, CooperBench: both agents' JSON action language) the policy seat is played the same
  way, through its format, and its turns are scored as rows like the user seat's. At the act level the
  seats' action spaces differ, so it is a second policy head sized for the user seat
  (:class:`~simpop.simulators.self_seat.HeadSeat`) held and trained by this trainer.
- ``self@pool``: fictitious self-play: each dialogue's user seat is a frozen snapshot of the policy drawn from a
  :class:`~simpop.simulators.population.CheckpointPool` (text level: LoRA copies of the policy's adapter; one joins
  every ``snapshot_every`` updates, the newest sampled most); snapshots are never trained.

Which seats learn is :class:`SelfPlayConfig`'s per-seat ``policy_trainable`` / ``user_trainable``. One update:

1. **Collect** one GRPO batch (``group_size`` dialogues on each of ``scenarios_per_update`` scenarios).
2. **Policy seat**: the GRPO update (:meth:`~simpop.train.grpo.GRPOTrainer.update`) on its turns, its reward, its
   groups' advantages.
3. **User seat** (``self`` with ``user_trainable``): its own GRPO update on its own turns only, with its own reward
   per dialogue (``user_reward``: ``env`` = the seat's own return from the env, e.g. CooperBench's team reward;
   ``opposed`` = minus the policy seat's return, a zero-sum game, e.g. for P4G whose persuadee the env never rewards),
   its own advantages within the same groups (the algorithm's hook on its rewards). At the text level both seats are
   one LLM: the user seat's step follows the policy seat's on the same weights and optimiser (each of its turns is
   scored as one row: its prompt, then its reply); at the act level it steps the second head with its own optimiser.
4. Every ``snapshot_every`` updates (``self@pool``) the policy's snapshot joins the pool.

What act-level ``self`` does and does not mean: the second head shares no parameters with the policy and sees only the
user seat's observations, so it is two agents trained together by one trainer (independent learners on one batch),
not one network playing both roles; ``self@pool`` is text-level only (a pool of snapshots of a head that nothing
trains would hold its initial weights forever).

Metrics: the policy seat's as for GRPO, the user seat's as ``user/<metric>`` (``user/reward_mean`` and
``user/success`` always, so both seats' rewards are reported even when the user seat does not learn).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from simpop.agents.policy import ActPolicy, LLMPolicy
from simpop.rollout import RolloutEngine, Trajectory
from simpop.simulators.population import CheckpointPool
from simpop.simulators.self_seat import HeadSeat, PolicySeat
from simpop.train import objectives
from simpop.train.grpo import Batch, GRPOConfig, GRPOTrainer
from simpop.validation import at_least_one

#: The user-seat kinds of self-play (module docstring).
SELF_KINDS = ("self", "self@pool")
#: The metrics of a seat's update on rows that are reported (its outcomes are counted per dialogue).
_TRAIN_METRICS = ("loss", "kl", "clip_frac", "grad_norm", "policy_entropy")


@dataclass(frozen=True)
class SelfPlayConfig:
    """Self-play settings (the policy seat's GRPO settings are a :class:`~simpop.train.grpo.GRPOConfig`; the user
    seat's update uses the same).

    Attributes:
        policy_trainable: The policy seat learns from its turns.
        user_trainable: The user seat learns from its turns; None: yes under ``self``, no under ``self@pool``
            (whose snapshots never learn: True there is an error).
        user_reward: The user seat's reward per dialogue: ``env`` (its own return from the env) or ``opposed``
            (minus the policy seat's return: zero-sum).
        pool_size: ``self@pool``: snapshots kept (the oldest leaves first).
        snapshot_every: ``self@pool``: updates between snapshots (the pool starts with the initial policy).
        pool_recency: ``self@pool``: sampling weight decay per step of snapshot age, in (0, 1].
    """

    policy_trainable: bool = True
    user_trainable: bool | None = None
    user_reward: Literal["env", "opposed"] = "env"
    pool_size: int = 4
    snapshot_every: int = 2
    pool_recency: float = 0.7

    def __post_init__(self) -> None:
        if self.user_reward not in ("env", "opposed"):
            raise ValueError(f"SelfPlayConfig: user_reward must be env or opposed, got {self.user_reward!r}")
        at_least_one(self, ("pool_size", "snapshot_every"))
        if not 0 < self.pool_recency <= 1:
            raise ValueError(f"SelfPlayConfig: pool_recency must be in (0, 1], got {self.pool_recency}")


class SelfPlayTrainer:
    """Self-play GRPO (module docstring); a :class:`~simpop.train.loop.Trainer`.

    Args:
        env_id: A registered env id.
        policy: The policy seat's :class:`~simpop.agents.policy.LLMPolicy` (text) or
            :class:`~simpop.agents.policy.ActPolicy` (act level).
        kind: ``self`` or ``self@pool``.
        grpo: GRPO settings of both seats' updates.
        config: Self-play settings.
        env_kwargs: Env constructor arguments.
        hidden_size: Act level: width of the user seat's head (seeded by ``grpo.seed + 1``).

    Attributes:
        seat: The live user-seat simulator (:class:`PolicySeat` or :class:`HeadSeat`).
        player: Text envs with per-seat formats (CooperBench): the policy seat's player (a :class:`PolicySeat`
            through its format); None: the rollout engine's token ledger plays it.
        pool: ``self@pool``: the snapshots' pool; else None.
        policy_trainer: The policy seat's GRPO trainer (its simulator is the seat or the pool).
        user_trainer: The user seat's GRPO trainer (None when the user seat does not learn).
        update_count: Self-play updates completed.
    """

    def __init__(self, env_id: str, policy: ActPolicy | LLMPolicy, kind: str, grpo: GRPOConfig,
                 config: SelfPlayConfig | None = None, env_kwargs: dict[str, Any] | None = None,
                 hidden_size: int = 64):
        from simpop.envs.registration import make

        config = config or SelfPlayConfig()
        if kind not in SELF_KINDS:
            raise ValueError(f"unknown self-play user seat {kind!r}; choose one of {', '.join(SELF_KINDS)}")
        user_trainable = kind == "self" if config.user_trainable is None else config.user_trainable
        if kind == "self@pool" and user_trainable:
            raise ValueError("self@pool plays frozen snapshots in the user seat, which never learn: drop "
                             "user_trainable (or set it false), or use self")
        if not (config.policy_trainable or user_trainable):
            raise ValueError("neither seat is trainable: nothing would learn; set policy_trainable or user_trainable")
        self.text = isinstance(policy, LLMPolicy)
        env = make(env_id, **(env_kwargs or {}))
        self.seat: PolicySeat | HeadSeat
        #: The policy seat played through its own text format (its turns recorded as rows); None: the token ledger.
        self.player: PolicySeat | None = None
        formats = getattr(env, "text_format_for", None)
        if self.text and callable(formats):
            self.player = PolicySeat(policy, formats(env.policy_seat), name="policy")  # type: ignore[arg-type]
        if self.text:
            self.seat = PolicySeat(policy, getattr(env, "text_format", None))  # type: ignore[arg-type]
        else:
            if kind == "self@pool":
                raise ValueError("self@pool is text-level only: at the act level the user seat is a second head that "
                                 "learns only from its own turns, so a pool of its snapshots would never change; "
                                 "use self")
            self.seat = HeadSeat.for_env(env, hidden_size, grpo.seed + 1)
        self.kind, self.config, self.user_trainable = kind, config, user_trainable
        self.pool: CheckpointPool | None = None
        self._snapshots: list[tuple[int, dict[str, Any]]] = []
        if kind == "self@pool":
            self.pool = CheckpointPool(config.pool_size, config.pool_recency, name="self-pool")
            self._add_snapshot(0)
        self.policy_trainer = GRPOTrainer(env_id, policy, self.pool or self.seat, grpo, env_kwargs=env_kwargs)
        if self.player is not None:
            self.policy_trainer.engine = RolloutEngine(env_id, self.player, self.pool or self.seat, n_envs=grpo.n_envs,
                                                       env_kwargs=env_kwargs)
        self.user_trainer: GRPOTrainer | None = None
        if user_trainable:
            user_policy = policy if self.text else self.seat.head  # type: ignore[union-attr]
            self.user_trainer = GRPOTrainer(env_id, user_policy, None, grpo, env_kwargs=env_kwargs)
            if self.text:  # one LLM: both seats' steps move the same weights with one optimiser
                self.user_trainer.optimizer = self.policy_trainer.optimizer
        self.update_count = 0

    @property
    def policy(self) -> ActPolicy | LLMPolicy:
        return self.policy_trainer.policy

    @property
    def training_simulator(self) -> Any:
        return self.policy_trainer.simulator

    # ----------------------------------------------------------------- one update
    def step(self) -> dict[str, Any]:
        """Collect, update the trainable seats, snapshot when due; both seats' metrics."""
        for player in (self.seat, self.player):
            if isinstance(player, PolicySeat):
                player.clear()
        batch = self.policy_trainer.collect()
        metrics: dict[str, Any] = {
            **_outcomes([t.total_reward for t in batch.trajectories], [t.success for t in batch.trajectories],
                        batch.groups),
            "policy_turns": float(np.mean([t.policy_turns for t in batch.trajectories])),
            "user_rejected": float(sum(t.user_rejected for t in batch.trajectories)), "rollout_s": batch.stats.total_s}
        if self.config.policy_trainable and self.player is None:
            metrics = self.policy_trainer.update(batch)
        elif self.config.policy_trainable and self.player is not None:
            rows = self._rows(self.player, batch, batch.advantages, user=False)
            if rows.trajectories:
                update = self.policy_trainer.update(rows)
                metrics.update({k: update[k] for k in (*_TRAIN_METRICS, "update_s") if k in update})
        metrics.update({f"user/{k}": v for k, v in self._user_step(batch).items()})
        self.update_count += 1
        if self.pool is not None:
            if self.update_count % self.config.snapshot_every == 0:
                self._add_snapshot(self.update_count)
            metrics["pool_size"] = float(len(self.pool.members))
        return metrics

    def user_returns(self, trajectories: list[Trajectory]) -> tuple[list[float], list[bool]]:
        """The user seat's return and success per dialogue (:attr:`SelfPlayConfig.user_reward`)."""
        if self.config.user_reward == "opposed":
            return [-t.total_reward for t in trajectories], [not t.success for t in trajectories]
        returns = [float(sum(t.rewards[t.user_seat])) for t in trajectories]
        return returns, [r > 0 for r in returns]

    def _user_step(self, batch: Batch) -> dict[str, float]:
        """The user seat's update on its own turns (when it learns); its reward metrics always."""
        rewards, successes = self.user_returns(batch.trajectories)
        record = _outcomes(rewards, successes, batch.groups)
        if self.user_trainer is None:
            return record
        advantages = self.user_trainer.objective.advantages(rewards, list(batch.groups))
        seat_batch = self._rows(self.seat, batch, advantages, user=True) if self.text else Batch(  # type: ignore
            [_seat_swapped(t, r, s) for t, r, s in zip(batch.trajectories, rewards, successes)], advantages,
            batch.stats)
        if not seat_batch.trajectories:  # the user seat never spoke: nothing to learn from
            return record
        update = self.user_trainer.update(seat_batch)
        return {**record, **{k: update[k] for k in _TRAIN_METRICS if k in update}}

    @staticmethod
    def _rows(player: PolicySeat, batch: Batch, advantages: np.ndarray, user: bool) -> Batch:
        """One row per turn ``player`` recorded (its prompt, then its reply), with its dialogue's advantage; the
        row's ``policy_seat`` is the seat that played it (the user seat when ``user``)."""
        collected = batch.collected if batch.collected is not None else batch.trajectories
        if len(player.episodes) != len(collected):
            raise RuntimeError(f"{player.name!r} recorded {len(player.episodes)} dialogues but played {len(collected)}")
        kept = batch.kept if batch.kept is not None else range(len(batch.trajectories))
        rows, row_advantages = [], []
        for t, index, advantage in zip(batch.trajectories, kept, advantages):
            seats = (t.user_seat, t.policy_seat) if user else (t.policy_seat, t.user_seat)
            for turn in player.episodes[index].turns:
                prompt = len(turn.prompt_ids)
                rows.append(Trajectory(t.scenario_id, t.group, t.seed, *seats, {s: [] for s in seats},
                                       {s: [] for s in seats}, {s: [] for s in seats},
                                       token_ids=turn.prompt_ids + turn.token_ids,
                                       logprobs=[0.0] * prompt + turn.logprobs,
                                       mask=[0] * prompt + [1] * len(turn.token_ids), prompt_length=prompt))
                row_advantages.append(advantage)
        return Batch(rows, np.asarray(row_advantages, dtype=float), batch.stats)

    # ----------------------------------------------------------------- the pool
    def _add_snapshot(self, step: int, state: dict[str, Any] | None = None) -> None:
        """The policy as of ``step`` (or with adapter weights ``state``) joins the pool; a full pool drops its oldest."""
        assert self.pool is not None and isinstance(self.seat, PolicySeat)
        frozen = self.pool.add_snapshot(self.seat, step)
        if state is not None:
            frozen.policy.lora.load_state_dict(state)  # type: ignore[attr-defined]
        if len(self._snapshots) == self.config.pool_size:
            del self._snapshots[0]
        self._snapshots.append((step, frozen.policy.lora.state_dict()))  # type: ignore[attr-defined]

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Both seats' trainers, the pool's snapshots and the update counter (at the text level the user seat's
        weights and optimiser are the policy's, saved once)."""
        user: dict[str, Any] | None = None
        if self.user_trainer is not None:
            user = self.user_trainer.state_dict()
            if self.text:
                user = {"rng": user["rng"], "update_count": user["update_count"]}
        return {"policy_trainer": self.policy_trainer.state_dict(), "user_trainer": user,
                "snapshots": list(self._snapshots), "update_count": self.update_count,
                "config": dataclasses.asdict(self.config)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the pool's snapshots first (the policy trainer's checkpoint names its
        members), then both seats' trainers; a checkpoint whose user seat was (not) trainable is refused."""
        if self.pool is not None:  # first: the policy trainer's checkpoint names the pool's members
            self.pool = CheckpointPool(self.config.pool_size, self.config.pool_recency, name="self-pool")
            saved, self._snapshots = state["snapshots"], []
            for step, weights in saved:
                self._add_snapshot(step, weights)
            self.policy_trainer.use_simulator(self.pool)
        self.policy_trainer.load_state_dict(state["policy_trainer"])
        user = state["user_trainer"]
        if (user is None) != (self.user_trainer is None):
            raise ValueError("the checkpoint's user seat trainability differs from this run's; resume with the same "
                             "self-play settings")
        if self.user_trainer is not None:
            if self.text:
                self.user_trainer.rng.bit_generator.state = user["rng"]
                self.user_trainer.update_count = int(user["update_count"])
            else:
                self.user_trainer.load_state_dict(user)
        self.update_count = int(state["update_count"])


def _seat_swapped(t: Trajectory, reward: float, success: bool) -> Trajectory:
    """``t`` seen from the user seat: its observations and actions are the "policy" ones, its return the reward."""
    return dataclasses.replace(t, policy_seat=t.user_seat, user_seat=t.policy_seat, total_reward=reward,
                               success=success)


def _outcomes(rewards: list[float], successes: list[bool], groups: np.ndarray) -> dict[str, float]:
    r = np.asarray(rewards, dtype=float)
    return {"reward_mean": float(r.mean()), "reward_std": float(r.std()), "success": float(np.mean(successes)),
            "zero_var_frac": objectives.zero_variance_fraction(r, groups)}
