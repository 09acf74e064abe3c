"""TorchRL, unmodified, trains both seats of simpop/PersuasionAct-v0 (and the policy seat against a population).

Decision rules, fixed before the runs: the user seat learned if its realism reward (mean log-probability of its
replies under the reference persuadee) over the last 5 iterations is at least 0.15 nats above the first iteration's;
a policy seat learned if, against a frozen opponent (the final co-trained user; the population), its sampled
actions succeed at least 0.05 (both seats) / 0.15 (policy seat alone) more often than uniformly random ones on the
same 300 seeds. The joint-training policy seat does not meet its rule yet (docs/integrations.md, issue 26 stays
open): that test asserts the user seat's learning and prints the policy seat's success beside a random
persuader's, without claiming it.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torchrl", reason="pip install 'simpop[torchrl]' (part of `make setup`)")

import torch  # noqa: E402
from torchrl.envs import PettingZooWrapper  # noqa: E402

import simpop  # noqa: E402
from simpop.integrations.marl import MarlView  # noqa: E402
from simpop.seat import Simulator  # noqa: E402
from simpop.integrations.torchrl_marl import (MarlConfig, PPOConfig, make_marl_env, success_rate,  # noqa: E402
                                              train_both_seats, train_policy_seat)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_torchrl_wraps_the_view_unmodified():
    env = make_marl_env(MarlConfig())
    assert type(env) is PettingZooWrapper and set(env.group_map) == {"persuader", "persuadee"}
    rollout = env.rollout(30, break_when_any_done=False)  # random actions within the masks
    acting = rollout["persuadee", "info", "acting"].reshape(-1).bool()
    realism = rollout["next", "persuadee", "reward"].reshape(-1)
    assert acting.any() and (realism[acting] < 0).all() and (realism[~acting] == 0).all()


def test_the_view_masks_the_user_to_plausible_replies_and_rewards_realism():
    view = MarlView(simpop.make("simpop/PersuasionAct-v0"), realism="persuadee", floor=0.02)
    observations, infos = view.reset(seed=3)
    assert infos["persuader"]["action_mask"].all() and infos["persuadee"]["action_mask"].all()
    assert (infos["persuader"]["acting"], infos["persuadee"]["acting"]) == (1.0, 0.0)
    observations, rewards, _, _, infos = view.step({"persuader": 5, "persuadee": 0})
    mask = infos["persuadee"]["action_mask"].astype(bool)
    assert 1 < mask.sum() < 161 and infos["persuader"]["action_mask"].all() and infos["persuadee"]["acting"] == 1.0
    plausible = int(np.flatnonzero(mask)[0])
    _, rewards, _, _, _ = view.step({"persuader": 0, "persuadee": plausible})
    assert np.log(0.02) <= rewards["persuadee"] < 0 and rewards["persuader"] == 0


def test_the_view_refuses_what_it_cannot_serve():
    with pytest.raises(TypeError, match="needs Discrete actions"):
        MarlView(simpop.make("simpop/Persuasion-v1"))
    class Scripted(Simulator):  # acts, but states no reply distribution
        def reset_batch(self, scenarios, rngs):
            pass

        def act_batch(self, observations, slots):
            return [0 for _ in slots]

    with pytest.raises(TypeError, match="reply distribution"):
        MarlView(simpop.make("simpop/PersuasionAct-v0"), realism=Scripted())
    with pytest.raises(ValueError, match="floor"):
        MarlView(simpop.make("simpop/PersuasionAct-v0"), floor=0.0)


@pytest.mark.slow
def test_both_seats_train(one_thread):
    config = MarlConfig(iterations=30)
    trained = train_both_seats(config, log=lambda line: None)
    realism = [r["user_realism"] for r in trained.history]
    assert np.mean(realism[-5:]) >= realism[0] + 0.15, realism
    user = trained.policies["persuadee"]
    learned = success_rate(trained.policies["persuader"], user, config)
    random = success_rate(None, user, config)
    print(f"realism {realism[0]:.2f} -> {np.mean(realism[-5:]):.2f}; persuader {learned:.3f} vs random {random:.3f}")


@pytest.mark.slow
def test_the_policy_seat_learns_against_a_population(one_thread):
    population = ["persuadee", "persuadee?temperature=0.8"]
    trained = train_policy_seat(population, PPOConfig(iterations=20), log=lambda line: None)
    learned = success_rate(trained.policies["persuader"], "persuadee")
    random = success_rate(None, "persuadee")
    print(f"persuader {learned:.3f} vs random {random:.3f}")
    assert learned >= random + 0.15


def test_a_population_must_be_specs_or_a_factory():
    with pytest.raises(TypeError, match="factory"):
        train_policy_seat(42, PPOConfig(iterations=1))
