"""P4G text episodes with the embedded model in both seats (frozen and verbalized persuadee)."""

from __future__ import annotations

import pytest

import simpop
from simpop.agents.base import SamplingParams
from simpop.envs.dialogue import parse_observation
from simpop.envs.wrappers import UserSeat
from simpop.simulators.registry import build_simulator


@pytest.fixture(scope="module")
def backends(smollm2):
    """One embedded backend shared by both seats and every simulator."""
    return {"smollm2": smollm2}


def persuader_reply(backend, observation: str, seed: int) -> str:
    """The embedded model as persuader: its instructions and its view of the chat."""
    view = parse_observation(observation)
    chat = [{"role": "system", "content": view["instructions"]}, *view["messages"]]
    text = backend.generate([chat], SamplingParams(max_new_tokens=12, temperature=1.0, seed=seed))[0].text.strip()
    return text or "Would you donate to Save the Children?"


@pytest.mark.parametrize("spec", ["frozen:smollm2?max_new_tokens=12",
                                  "verbalized:smollm2?k=3&max_new_tokens=24&fallback_max_new_tokens=12"])
def test_text_episode_with_the_embedded_model_in_both_seats(backends, spec):
    env = simpop.make("simpop/Persuasion-v0", max_turns=2)
    simulator = build_simulator(spec, env=env, backends=backends)
    assert simulator.backend is backends["smollm2"]
    seat = UserSeat(env, simulator)
    obs, _ = seat.reset(seed=5)
    done, steps, reward = False, 0, 0.0
    while not done:
        obs, reward, terminated, truncated, info = seat.step(persuader_reply(backends["smollm2"], obs, steps))
        done, steps = terminated or truncated, steps + 1
    seats = [t.seat for t in env.transcript]
    assert seats[0] == "persuader" and all(a != b for a, b in zip(seats, seats[1:]))
    persuadee = [t.text for t in env.transcript if t.seat == "persuadee"]
    assert persuadee and all(text.strip() for text in persuadee)
    assert reward in (0.0, 1.0) and steps <= 2
    if spec.startswith("verbalized"):
        assert simulator.stats["calls"] == len(persuadee)
        assert 0 <= simulator.stats["fallbacks"] <= simulator.stats["calls"]


def test_native_kind_builds_the_envs_own_simulator():
    from simpop.envs.persuasion.simulators import ActPersuadee, TextPersuadee

    assert isinstance(build_simulator("native", env=simpop.make("simpop/Persuasion-v0")), TextPersuadee)
    assert isinstance(build_simulator("native:simpop/PersuasionAct-v0"), ActPersuadee)
    with pytest.raises(ValueError, match="no native simulator"):
        build_simulator("native", env=object())
