"""Multi-model rotation (population rule ``rotate``): its schedule, its per-update log, and exact kill and resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

import simpop
from simpop import checkpoint
from simpop.agents.policy import ModelConfig, build_policy
from simpop.evaluation.metrics import WALL_CLOCK_KEYS
from simpop.simulators.population import Population
from simpop.simulators.registry import build_simulator
from simpop.train import loop
from simpop.train.cli import population_spec
from simpop.train.grpo import GRPOConfig, GRPOTrainer

ENV = "simpop/PersuasionAct-v0"
#: Three members of different model families (the P4G persuadee's base and two strategy-shuffled models).
MEMBERS = ["persuadee", "persuadee:shuffled-0", "persuadee:shuffled-1"]


def _rotation(every: int) -> Population:
    return build_simulator({"members": MEMBERS, "rule": "rotate", "rotate_every": every}, simpop.make(ENV))


def test_round_robin_per_dialogue_continues_across_batches():
    population, env = _rotation(0), simpop.make(ENV)
    env.reset(seed=0)
    drove = []
    for size in (2, 3, 4):  # three waves of different sizes
        population.reset_batch([env.scenario] * size, [np.random.default_rng(i) for i in range(size)])
        drove += [population.member(slot).name for slot in range(size)]
    assert drove == [MEMBERS[i % 3] for i in range(9)]
    assert population.position == 9 and population.probabilities() == [1 / 3] * 3


def test_rotation_every_n_updates_and_bad_settings():
    population = _rotation(2)
    order = []
    for _ in range(6):
        order.append(population.members[population.rotation_index()].name)
        population.end_update(["x"], [True])
    assert order == [MEMBERS[0], MEMBERS[0], MEMBERS[1], MEMBERS[1], MEMBERS[2], MEMBERS[2]]
    assert population.probabilities() == [1.0, 0.0, 0.0]  # update 6 is member 0's again
    with pytest.raises(ValueError, match="rotate_every must be an integer >= 0"):
        Population(population.members, rule="rotate", rotate_every=-1)
    with pytest.raises(ValueError, match="needs a population"):
        population_spec(["persuadee"], "rotate", 2)
    with pytest.raises(ValueError, match="only applies with --population-rule rotate"):
        population_spec(MEMBERS, "uniform", 2)
    assert population_spec(MEMBERS, "rotate", 3) == {"members": MEMBERS, "rule": "rotate", "rotate_every": 3}


def _trainer(every: int, seed: int = 3) -> GRPOTrainer:
    env = simpop.make(ENV)
    config = GRPOConfig(group_size=4, scenarios_per_update=2, epochs=1, seed=seed)
    return GRPOTrainer(ENV, build_policy(env, ModelConfig(hidden_size=16), seed=seed), _rotation(every), config)


def _lines(run_dir) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_KEYS} for r in records]


@pytest.mark.parametrize("every", [0, 2])
def test_rotation_schedule_is_exact_across_a_kill_and_resume(tmp_path, every):
    config = loop.LoopConfig(save_every=2, report_to="none")
    straight = _trainer(every)
    loop.run(straight, 7, tmp_path / "straight", config=config)

    dying = _trainer(every)
    step, calls = dying.step, []

    def dies_in_update_6():
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt("killed")
        return step()

    dying.step = dies_in_update_6  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        loop.run(dying, 7, tmp_path / "killed", config=config)
    assert checkpoint.latest(tmp_path / "killed").name == "step_0000004.pt"  # update 5 ran but was not saved
    resumed = _trainer(every)
    loop.run(resumed, 7, tmp_path / "killed", config=config, resume=True)

    expected, got = _lines(tmp_path / "straight"), _lines(tmp_path / "killed")
    assert got == expected and resumed.training_simulator.position == straight.training_simulator.position
    if every:  # one member per update, in turn, with its success logged
        assert [r["rotation_member"] for r in expected] == [MEMBERS[(u // every) % 3] for u in range(7)]
        assert all(r[f"rotation_success/{r['rotation_member']}"] == r["success"] for r in expected)
    else:  # 8 dialogues per update, round robin: every member plays in every update
        assert all(sorted(r["rotation_member"]) == sorted(MEMBERS) for r in expected)
        assert expected[0]["rotation_member"][:3] == MEMBERS and expected[1]["rotation_member"][0] == MEMBERS[2]
    # A fresh trainer that is not resumed starts the schedule again (the comparison can fail).
    fresh = _trainer(every)
    loop.run(fresh, 1, tmp_path / "fresh", config=config)
    assert fresh.training_simulator.position != resumed.training_simulator.position
