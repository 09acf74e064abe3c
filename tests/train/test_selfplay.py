"""Self-play (user-seat kinds ``self`` and ``self@pool``): which parameters learn, per-seat rewards, exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import simpop
from simpop.agents.policy import ModelConfig, build_policy
from simpop.evaluation.metrics import WALL_CLOCK_KEYS
from simpop.seat import Simulator
from simpop.train import loop
from simpop.train.grpo import Batch, GRPOConfig
from simpop.train.selfplay import SelfPlayConfig, SelfPlayTrainer

ACT = "simpop/PersuasionAct-v0"


def _act(seed: int = 2, **config) -> SelfPlayTrainer:
    grpo = GRPOConfig(group_size=4, scenarios_per_update=4, epochs=1, seed=seed)
    policy = build_policy(simpop.make(ACT), ModelConfig(hidden_size=16), seed=seed)
    return SelfPlayTrainer(ACT, policy, "self", grpo, SelfPlayConfig(**{"user_reward": "opposed", **config}),
                           hidden_size=16)


def _weights(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _moved(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(a, p) for a, p in zip(before, module.parameters()))


def test_act_self_gradients_reach_both_seats_parameters():
    trainer = _act()
    policy, head = trainer.policy, trainer.seat.head
    assert head.n_actions == simpop.make(ACT).action_space("persuadee").n  # the user seat's own action space
    before_policy, before_head = _weights(policy), _weights(head)
    metrics = trainer.step()
    assert _moved(before_policy, policy) and _moved(before_head, head)
    assert all(p.grad is not None for p in [*policy.parameters(), *head.parameters()])
    assert metrics["grad_norm"] > 0 and metrics["user/grad_norm"] > 0
    # Each seat its own reward (opposed: zero-sum) and its own advantages within the same groups.
    assert metrics["user/reward_mean"] == -metrics["reward_mean"]
    assert metrics["user/success"] == pytest.approx(1 - metrics["success"])


@pytest.mark.parametrize("flags", [{"user_trainable": False}, {"policy_trainable": False}])
def test_act_per_seat_trainable_flags(flags):
    trainer = _act(**flags)
    before_policy, before_head = _weights(trainer.policy), _weights(trainer.seat.head)
    metrics = trainer.step()
    assert _moved(before_policy, trainer.policy) == flags.get("policy_trainable", True)
    assert _moved(before_head, trainer.seat.head) == flags.get("user_trainable", True)
    assert "user/reward_mean" in metrics and "reward_mean" in metrics  # both seats' rewards, learning or not
    assert ("user/loss" in metrics) == flags.get("user_trainable", True)


def test_env_reward_gives_the_p4g_persuadee_nothing_to_learn_from():
    metrics = _act(user_reward="env").step()
    assert metrics["user/reward_mean"] == 0 and metrics["user/zero_var_frac"] == 1 and metrics["user/grad_norm"] == 0


def test_bad_self_play_settings_are_refused():
    grpo = GRPOConfig(group_size=2, scenarios_per_update=1)
    policy = build_policy(simpop.make(ACT), ModelConfig(hidden_size=8))
    with pytest.raises(ValueError, match="unknown self-play user seat"):
        SelfPlayTrainer(ACT, policy, "self@past", grpo)
    with pytest.raises(ValueError, match="frozen snapshots in the user seat, which never learn"):
        SelfPlayTrainer(ACT, policy, "self@pool", grpo, SelfPlayConfig(user_trainable=True))
    with pytest.raises(ValueError, match="nothing would learn"):
        SelfPlayTrainer(ACT, policy, "self", grpo, SelfPlayConfig(policy_trainable=False, user_trainable=False))
    with pytest.raises(ValueError, match="text-level only"):
        SelfPlayTrainer(ACT, policy, "self@pool", grpo)
    with pytest.raises(ValueError, match="user_reward must be env or opposed"):
        SelfPlayConfig(user_reward="shared")


def _lines(run_dir) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_KEYS} for r in records]


def test_act_self_play_resumes_exactly(tmp_path):
    config = loop.LoopConfig(save_every=2, report_to="none")
    straight = _act()
    loop.run(straight, 5, tmp_path / "straight", config=config)
    loop.run(_act(), 2, tmp_path / "killed", config=config)
    resumed = _act()
    loop.run(resumed, 5, tmp_path / "killed", config=config, resume=True)
    assert _lines(tmp_path / "killed") == _lines(tmp_path / "straight")
    for a, b in zip(straight.seat.head.parameters(), resumed.seat.head.parameters()):
        assert torch.equal(a, b)
    other = _act(seed=3)
    loop.run(other, 1, tmp_path / "other", config=config)
    assert _lines(tmp_path / "other")[0] != _lines(tmp_path / "straight")[0]  # the comparison can fail


# ------------------------------------------------------------------------------------ text level (embedded model)
TEXT, TEXT_KWARGS = "simpop/Persuasion-v0", {"max_turns": 1}


def test_text_self_trains_the_llm_on_both_seats_and_self_at_pool_only_on_the_policys(tiny_model):
    from simpop.agents.policy import LLMPolicy
    from simpop.agents.transformers_backend import TransformersBackend

    grpo = GRPOConfig(group_size=2, scenarios_per_update=1, max_new_tokens=4, seed=3)
    backend = TransformersBackend(tiny_model, prefix_cache=True)
    policy = LLMPolicy(backend, grpo.sampling(), lora=True, lora_r=4, lora_alpha=8)

    # self: the same LLM in both seats; the user seat's own turns (recorded as generated) train its weights.
    trainer = SelfPlayTrainer(TEXT, policy, "self", grpo, env_kwargs=TEXT_KWARGS)
    batch = trainer.policy_trainer.collect()
    rows = trainer._rows(trainer.seat, batch, np.array([1.0, -1.0]), user=True)
    assert rows.trajectories and all(r.policy_seat == "persuadee" for r in rows.trajectories)
    for row in rows.trajectories:
        generated = [i for i, m in zip(row.token_ids, row.mask) if m]
        assert generated and row.token_ids[-len(generated):] == generated  # the reply, after its prompt
    before = [p.detach().clone() for p in policy.parameters()]
    update = trainer.user_trainer.update(rows)
    assert update["grad_norm"] > 0 and any(not torch.equal(a, p) for a, p in zip(before, policy.parameters()))
    assert trainer.user_trainer.optimizer is trainer.policy_trainer.optimizer  # one LLM, one optimiser

    # self@pool: frozen snapshots play the user seat; only the policy seat's turns train, snapshots never change.
    pool_trainer = SelfPlayTrainer(TEXT, policy, "self@pool", grpo, SelfPlayConfig(snapshot_every=1, pool_size=2),
                                   env_kwargs=TEXT_KWARGS)
    assert pool_trainer.user_trainer is None
    snapshot = pool_trainer.pool.members[0]
    saved = {k: v.clone() for k, v in pool_trainer._snapshots[0][1].items()}
    batch = pool_trainer.policy_trainer.collect()
    assert all(t.simulator == "self@0" for t in batch.trajectories)
    before = [p.detach().clone() for p in policy.parameters()]
    pool_trainer.policy_trainer.update(Batch(batch.trajectories, np.array([1.0, -1.0]), batch.stats))
    assert any(not torch.equal(a, p) for a, p in zip(before, policy.parameters()))
    assert all(p.grad is None and not p.requires_grad for p in snapshot.policy.parameters())
    assert all(torch.equal(saved[k], v) for k, v in snapshot.policy.lora.state_dict().items())
    metrics = pool_trainer.step()  # a real update: both seats' rewards reported, a new snapshot joins
    assert {"reward_mean", "user/reward_mean", "pool_size"} <= set(metrics) and "user/loss" not in metrics
    assert [m.name for m in pool_trainer.pool.members] == ["self@0", "self@1"]
    assert all(torch.equal(saved[k], v) for k, v in snapshot.policy.lora.state_dict().items())
    state = pool_trainer.state_dict()
    fresh = SelfPlayTrainer(TEXT, policy, "self@pool", grpo, SelfPlayConfig(snapshot_every=1, pool_size=2),
                            env_kwargs=TEXT_KWARGS)
    fresh.load_state_dict(state)
    for kept, restored in zip(pool_trainer.pool.members, fresh.pool.members):
        assert kept.name == restored.name
        for (k, a), b in zip(kept.policy.lora.state_dict().items(), restored.policy.lora.state_dict().values()):
            assert torch.equal(a, b), k


class _Scripted(Simulator):
    """A policy-seat player with the Simulator contract: act ``slot mod 14``, remembering what it was given."""

    name = "scripted"

    def __init__(self):
        self.scenarios, self.calls = [], []

    def reset_batch(self, scenarios, rngs):
        self.scenarios = list(scenarios)
        self.draws = [int(r.integers(1000)) for r in rngs]

    def act_batch(self, observations, slots):
        self.calls.append(list(slots))
        return [slot % 14 for slot in slots]


def test_a_simulator_can_play_the_policy_seat_of_the_rollout_engine():
    from simpop.envs.persuasion.simulators import native_act
    from simpop.rollout import RolloutEngine

    runs = []
    for _ in range(2):
        player = _Scripted()
        engine = RolloutEngine(ACT, player, native_act(simpop.make(ACT)))
        trajectories = engine.collect(3, group_size=2, seed=5)
        runs.append((player.draws, [t.actions["persuader"] for t in trajectories]))
        assert len(player.scenarios) == 6 and all(s.id == t.scenario_id for s, t in zip(player.scenarios, trajectories))
        for slot, t in enumerate(trajectories):
            assert set(t.actions["persuader"]) == {slot % 14}  # each dialogue got its own slot's actions
    assert runs[0] == runs[1]  # seeded: the same generators, the same dialogues


def test_simpop_train_selfplay_and_rotation_from_the_command_line(tmp_path, capsys):
    from simpop.cli import main

    common = ["--env", ACT, "--no-progress", "--no-export", "--group-size", "2", "--scenarios-per-update", "2",
              "--env-arg", "max_turns=4", "--hidden-size", "8", "--updates", "2", "--report-to", "none"]
    assert main(["train", "selfplay", *common, "--out", str(tmp_path / "sp"), "--user-reward", "opposed"]) == 0
    records = [json.loads(line) for line in (tmp_path / "sp" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and {"reward_mean", "user/reward_mean", "user/loss"} <= set(records[-1])
    assert main(["train", "grpo", *common, "--out", str(tmp_path / "rot"), "--simulator", "persuadee",
                 "--simulator", "persuadee:shuffled-0", "--population-rule", "rotate", "--rotate-every", "1"]) == 0
    records = [json.loads(line) for line in (tmp_path / "rot" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rotation_member"] for r in records] == ["persuadee", "persuadee:shuffled-0"]
    capsys.readouterr()
    for bad, message in ((["selfplay", "--simulator", "persuadee"], "selfplay's user seat is the policy"),
                         (["selfplay", "--simulator", "self@pool"], "self@pool is text-level only"),
                         (["grpo", "--population-rule", "rotate"], "needs a population")):
        assert main(["train", bad[0], *common, "--out", str(tmp_path / "bad"), *bad[1:]]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
