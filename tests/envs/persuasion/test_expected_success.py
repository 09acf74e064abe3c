"""The text persuadee's expected success: the probability of a donation in the distribution its decision was drawn
from, reported by ``UserSeat`` (``info["expected_success"]``) and the run loop (``Trajectory.expected_success``)."""

from __future__ import annotations

import numpy as np
import pytest

import simpop
from simpop.envs.persuasion.model import PersuadeeModel
from simpop.envs.persuasion.simulators import TextPersuadee
from simpop.envs.wrappers import make_user_seat
from simpop.rollout import Job, RolloutEngine
from simpop.seat import Player
from simpop.simulators.population import Population

ENV = "simpop/Persuasion-v1"
APPEAL = "Every dollar makes a real difference for children in need."  # logical appeal: never asks
ASK = "Would you donate $1 today?"  # proposition of donation: the persuadee decides now


def play(view, seed: int, lines: list[str]) -> tuple[float, dict]:
    view.reset(seed=seed)
    for line in lines:
        _, reward, terminated, truncated, info = view.step(line)
        if terminated or truncated:
            return reward, info
    raise AssertionError("the dialogue did not end")


@pytest.mark.parametrize("lines", [[APPEAL, APPEAL], [APPEAL, ASK]], ids=["survey", "asked"])
def test_expected_success_is_the_donation_probability_of_the_deciding_distribution(lines):
    sim = TextPersuadee()
    view = make_user_seat(ENV, simulator=sim, max_turns=2)
    model = PersuadeeModel()
    for seed in range(5):
        _, info = play(view, seed, lines)
        assert info["outcome_source"] == ("survey" if lines[-1] == APPEAL else "decided_in_dialogue")
        # The model's own probability of giving in the final state (the survey asks nothing new; an ask's
        # state already includes it): what the decision was drawn from.
        assert info["expected_success"] == pytest.approx(model.donate_probability(sim.state(0)), abs=1e-12)
        assert 0.0 < info["expected_success"] < 1.0


@pytest.mark.parametrize("lines", [[APPEAL, APPEAL], [APPEAL, ASK]], ids=["survey", "asked"])
def test_expected_success_has_the_rewards_mean_over_draws(lines):
    view = make_user_seat(ENV, simulator=TextPersuadee(), max_turns=2)
    rewards, expected = np.array([[*play(view, seed, lines)] for seed in range(1500)], dtype=object).T
    rewards, expected = rewards.astype(float), np.array([info["expected_success"] for info in expected])
    se = rewards.std() / np.sqrt(len(rewards))
    assert abs(rewards.mean() - expected.mean()) < 4 * se
    assert expected.std() < rewards.std()  # the draw's noise is gone, the persona's and the words' stay


def test_greedy_persuadee_expects_exactly_what_it_did():
    view = make_user_seat(ENV, simulator=TextPersuadee(decoding="greedy"), max_turns=2)
    for seed in range(20):
        for lines in ([APPEAL, APPEAL], [ASK]):
            reward, info = play(view, seed, lines)
            assert info["expected_success"] == reward


def test_no_expectation_before_a_decision_or_after_a_reset():
    sim = TextPersuadee()
    env = simpop.make(ENV, max_turns=2)
    observations, _ = env.reset(seed=0)
    sim.reset(env.scenario, env.user_rng())
    observations, *_ = env.step({"persuader": APPEAL})
    sim.act(observations["persuadee"])
    assert sim.success_probability(0) is None  # an appeal decides nothing
    observations, *_ = env.step({"persuadee": "I see."})
    observations, *_ = env.step({"persuader": ASK})
    sim.act(observations["persuadee"])
    assert sim.success_probability(0) is not None
    sim.reset(env.scenario, np.random.default_rng(1))
    assert sim.success_probability(0) is None


def test_a_survey_whose_options_are_not_amounts_gets_the_decisions_own_probability():
    """A survey of another env (no option reads as an amount) is answered from the decision distribution."""
    from simpop.seat import Survey

    sim = TextPersuadee()
    env = simpop.make(ENV, max_turns=2)
    env.reset(seed=0)
    sim.reset(env.scenario, env.user_rng())
    sim.answer_survey([None], [0], [Survey(question="Which colour?", options=("red", "blue"))])
    assert sim.success_probability(0) == pytest.approx(PersuadeeModel().donate_probability(sim.state(0)))


def test_populations_report_the_member_that_played():
    members = [TextPersuadee(name="warm", temperature=0.5), TextPersuadee(name="greedy", decoding="greedy")]
    view = make_user_seat(ENV, simulator=Population(members), max_turns=2)
    seen = set()
    for seed in range(12):
        reward, info = play(view, seed, [APPEAL, APPEAL])
        member = view.simulator.member(0)
        seen.add(member.name)
        assert info["expected_success"] == member.success_probability(0)
        if member.name == "greedy":
            assert info["expected_success"] == reward
    assert seen == {"warm", "greedy"}


class Appealing(Player):
    """A text policy that always makes the same logical appeal."""

    def act_batch(self, observations, slots):
        return [APPEAL] * len(observations)


def test_the_run_loop_records_it_on_text_trajectories_as_the_single_agent_view_does():
    jobs = [Job(scenario_id=f"p4g-{i:04d}", group=i, seed=i) for i in range(6)]
    trajectories = RolloutEngine(ENV, Appealing(), TextPersuadee(), env_kwargs={"max_turns": 2}).run(
        jobs, np.random.default_rng(0))
    view = make_user_seat(ENV, simulator=TextPersuadee(), max_turns=2)
    for job, trajectory in zip(jobs, trajectories):
        view.reset(seed=job.seed, options={"scenario_id": job.scenario_id})
        info = {}
        while not view.env.done:
            info = view.step(APPEAL)[4]
        assert trajectory.expected_success == info["expected_success"]
        assert 0.0 < trajectory.expected_success < 1.0


def test_trls_expected_reward_takes_the_expectation_where_there_is_one():
    from simpop.train.trl_adapter import expected_reward

    assert expected_reward([None] * 3, env_reward=[1.0, 0.0, 1.0], expected_success=[0.25, None, 0.75]) == [
        0.25, 0.0, 0.75]
    with pytest.raises(ValueError):
        expected_reward([None], env_reward=[1.0], expected_success=[0.5, 0.5])
