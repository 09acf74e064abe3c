"""Issue 44: MarlView never pays an invalid action more than a valid one; the TorchRL recipe's configs validate."""

from __future__ import annotations

import math

import numpy as np
import pytest

import simpop
from simpop.integrations.marl import MarlView

FLOOR = 0.02
SEEDS = range(5)
#: Actions a hand-written loop or an unmasked library may send: -1, out of range, a float, arrays, a bool.
INVALID = [-1, 161, 10**9, 3.0, np.array([3]), np.array([3, 4]), True]


def play(seed: int, persuader, persuadee) -> tuple[dict[str, float], list[tuple[str, dict, float]]]:
    """One episode of ``MarlView(PersuasionAct-v0, realism="persuadee")``, each seat's action from
    ``choose(rng, mask)``; returns each seat's return and (acting seat, its info after the step, its reward)."""
    view = MarlView(simpop.make("simpop/PersuasionAct-v0"), realism="persuadee", floor=FLOOR)
    rng = np.random.default_rng(seed)
    _, infos = view.reset(seed=seed)
    keys = {seat: set(info) for seat, info in infos.items()}
    returns, steps = {"persuader": 0.0, "persuadee": 0.0}, []
    while not view.dialogue.done:
        seat = view.dialogue.to_act
        choose = persuader if seat == "persuader" else persuadee
        _, rewards, _, _, infos = view.step({seat: choose(rng, infos[seat]["action_mask"])})
        assert {s: set(info) for s, info in infos.items()} == keys  # TorchRL builds its info spec at reset
        for s in rewards:
            returns[s] += rewards[s]
        steps.append((seat, infos[seat], rewards[seat]))
    return returns, steps


def uniform(rng, mask):
    """A valid action drawn uniformly from the whole action space (a loop that ignores the mask)."""
    return int(rng.integers(len(mask)))


def masked(rng, mask):
    """A valid action drawn uniformly from the mask (as TorchRL's MaskedCategorical does)."""
    return int(rng.choice(np.flatnonzero(mask)))


@pytest.mark.parametrize("bad", INVALID, ids=repr)
def test_an_invalid_user_reply_earns_less_than_valid_replies_and_cannot_stall_to_the_best_return(bad):
    for seed in SEEDS:
        valid, valid_steps = play(seed, uniform, uniform)
        stalled, stalled_steps = play(seed, uniform, lambda rng, mask: bad)
        worst_valid = min(r for seat, info, r in valid_steps if seat == "persuadee")
        user_steps = [(info, r) for seat, info, r in stalled_steps if seat == "persuadee"]
        assert user_steps and all(info["invalid_action"] == 1.0 for info, _ in user_steps)
        assert all(r == pytest.approx(math.log(FLOOR)) and r <= worst_valid for _, r in user_steps)
        assert all(info["invalid_action"] == 0.0 for seat, info, _ in valid_steps)
        assert stalled["persuadee"] < valid["persuadee"], (seed, stalled, valid)


@pytest.mark.parametrize("bad", [-1, 14, 2.0, np.array([1])], ids=repr)
def test_an_invalid_persuader_act_follows_the_same_rule(bad):
    """The benchmark pays a persuader step 0 until the outcome: an invalid act earns that, the worst a step earns,
    and a persuader that only sends invalid acts ends every dialogue at the cap with the worst return, 0."""
    stalled, valid = [], []
    for seed in SEEDS:
        returns, steps = play(seed, lambda rng, mask: bad, masked)
        assert all(seat == "persuader" and info["invalid_action"] == 1.0 and r == 0.0 for seat, info, r in steps)
        stalled.append(returns["persuader"])
        valid.append(play(seed, uniform, masked)[0]["persuader"])
    assert max(stalled) == 0.0 <= min(valid) and np.mean(stalled) < np.mean(valid), (stalled, valid)


def test_without_realism_the_flag_is_still_numeric_and_kept():
    view = MarlView(simpop.make("simpop/PersuasionAct-v0"))
    _, infos = view.reset(seed=0)
    assert infos["persuader"]["invalid_action"] == 0.0
    _, rewards, _, _, infos = view.step({"persuader": -1})
    assert infos["persuader"]["invalid_action"] == 1.0 and infos["persuadee"]["invalid_action"] == 0.0
    assert "must be an int" in view.dialogue.last_error["persuader"]


@pytest.mark.parametrize("config, field", [
    ({"lr": float("nan")}, "lr"), ({"lr": 0.0}, "lr"), ({"n_envs": 0}, "n_envs"),
    ({"minibatch_size": 0}, "minibatch_size"), ({"iterations": -1}, "iterations"), ({"iterations": 4.7}, "iterations"),
    ({"n_steps": 0}, "n_steps"), ({"epochs": 0}, "epochs"), ({"hidden_size": 0}, "hidden_size"),
    ({"gae_lambda": 1.5}, "gae_lambda"), ({"clip_eps": 0.0}, "clip_eps"), ({"ent_coef": -0.1}, "ent_coef"),
    ({"seed": -1}, "seed"), ({"env_id": 3}, "env_id"),
    ({"gamma": 1.5}, "gamma"), ({"vf_coef": -1.0}, "vf_coef"), ({"max_grad_norm": -1.0}, "max_grad_norm"),
])
def test_the_marl_config_refuses_bad_values_naming_the_field(config, field):
    from simpop.integrations.torchrl_marl import MarlConfig

    with pytest.raises(ValueError, match=rf"^MarlConfig: {field} ") as error:
        MarlConfig(**config)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("config, field", [
    ({"realism_floor": 0.0}, "realism_floor"), ({"realism_floor": float("nan")}, "realism_floor"),
    ({"user_entropy": -1.0}, "user_entropy"), ({"realism": 3}, "realism"),
])
def test_the_marl_config_refuses_bad_user_seat_settings(config, field):
    from simpop.integrations.torchrl_marl import MarlConfig

    with pytest.raises(ValueError, match=rf"^MarlConfig: {field} "):
        MarlConfig(**config)
