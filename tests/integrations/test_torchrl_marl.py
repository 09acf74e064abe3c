"""TorchRL, unmodified, trains both seats of simpop/PersuasionAct-v0 (and the policy seat against a population).

Decision rules, fixed before the runs (300 seeds, 10000-10299; SE: standard error of a difference of two means):
- the policy seat learned if, against the frozen final user of its run, its sampled acts succeed more often than
  uniformly random acts by more than 2 SE (alone against a population: by at least 0.15 against the reference);
- the user seat learned if, facing a uniformly random persuader, its mean KL(user || reference persuadee) per turn
  (its objective, negated) is below a uniformly random user's (within the same realism mask) by more than 2 SE.
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
from simpop.integrations.torchrl_marl import MarlConfig, evaluate, make_marl_env, train_policy_seat  # noqa: E402
from tests.integrations.conftest import doc_example  # noqa: E402


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


def test_the_documented_example_trains_both_seats_and_the_policy_seat_alone(one_thread):
    run = {}
    exec(doc_example("torchrl_marl import"), run)  # docs/integrations/torchrl.md's example, as written
    for name in ("policy", "realism"):  # persuader vs random facing the final user; random - trained user's KL
        difference, se = run[name]
        assert difference > 2 * se, f"{name}: {difference:+.3f} is not above 2 SE ({se:.3f})"
    assert run["alone"].difference >= 0.15  # alone, vs the reference: at least 0.15 above random acts


def test_evaluation_scores_each_seat_on_fixed_seeds():
    first, again = evaluate(None, None, episodes=20), evaluate(None, None, episodes=20)
    assert np.array_equal(first.success, again.success) and np.array_equal(first.user_kl, again.user_kl)
    assert set(np.unique(first.success)) <= {0.0, 1.0} and (first.user_kl > 0).all()
    assert np.isnan(evaluate(None, "persuadee", episodes=5).user_kl).all()


def test_a_population_must_be_specs_or_a_factory():
    with pytest.raises(TypeError, match="factory"):
        train_policy_seat(42, MarlConfig(iterations=1))
