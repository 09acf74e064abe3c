"""The collapse experiment's simulator-choice conditions: prioritised, rotation, failure (issue 46), and its cost."""

from __future__ import annotations

import json

import pytest

from simpop.envs import make
from simpop.experiments.collapse import Cost, descriptions, run_collapse
from simpop.experiments.conditions import (ACT_ONLY, CONDITIONS, DEFAULT_CONDITIONS, ROTATE_EVERY, CollapseConfig,
                                           build_panel, build_trainer, condition_cotrain, simulator_specs)
from simpop.simulators.population import Population
from simpop.train.cotrain import CoTrainConfig, CoTrainer
from simpop.train.pool import AdaptivePoolTrainer

TINY = dict(seeds=1, updates=2, eval_every=2, eval_episodes=2, max_turns=3, heldout_personas=40, workers=1,
            grpo={"group_size": 2, "scenarios_per_update": 2},
            cotrain={"population_size": 2, "pool_size": 2, "snapshot_every": 1})


def test_new_conditions_are_named_but_not_run_by_default():
    assert set(CONDITIONS) - set(DEFAULT_CONDITIONS) == {"prioritised", "rotation", "failure"}
    assert CollapseConfig().conditions == DEFAULT_CONDITIONS
    for condition in ACT_ONLY:
        with pytest.raises(ValueError, match="act level only"):
            CollapseConfig(level="text", conditions=("frozen", condition))
    with pytest.raises(ValueError, match="checkpoint pool"):
        CollapseConfig(conditions=("prioritised",), cotrain={"pool_size": 0, "pool_sample_prob": 0.0})
    with pytest.raises(ValueError, match="several simulators"):
        CoTrainConfig(draw_rule="prioritised")  # K = 1, no pool: nothing to choose among
    with pytest.raises(ValueError, match="draw_rule must be one of"):
        CoTrainConfig(draw_rule="uniform", population_size=2)


def test_prioritised_population_sends_more_dialogues_to_the_members_the_policy_loses_to():
    config = CollapseConfig(**TINY, conditions=("prioritised", "population"))
    env = make(config.env_id, **config.env_kwargs())
    assert condition_cotrain("prioritised", config.cotrain).draw_rule == "prioritised"
    assert condition_cotrain("population", config.cotrain).draw_rule == "weighted"
    trainer = build_trainer("prioritised", config, 0, env)
    assert isinstance(trainer, CoTrainer) and [s.name for s in trainer.simulators] == ["prioritised-0", "prioritised-1"]
    population = trainer.training_simulator
    assert isinstance(population, Population) and population.rule == "prioritised"
    before = population.probabilities()
    trainer.step()  # the members' failure rates now weigh their draws
    assert population.probabilities() != before
    assert build_trainer("population", config, 0, env).training_simulator.rule == "weighted"
    assert "failure-prioritised" in descriptions(config)["prioritised"]


def test_rotation_takes_the_fixed_simulators_in_turn():
    config = CollapseConfig(**TINY, conditions=("rotation",))
    env = make(config.env_id, **config.env_kwargs())
    assert list(simulator_specs("rotation", config)) == ["frozen-modal-greedy", "verbalized", "sampled"]
    trainer = build_trainer("rotation", config, 0, env)
    rotation = trainer.training_simulator
    assert rotation.rule == "rotate" and rotation.rotate_every == ROTATE_EVERY
    played = [trainer.step()["rotation_member"] for _ in range(ROTATE_EVERY + 1)]
    assert played == ["frozen-modal-greedy"] * ROTATE_EVERY + ["verbalized"]
    build_panel(config, env).check_disjoint(rotation, strict=True)


def test_failure_condition_is_the_failure_driven_pool():
    config = CollapseConfig(**TINY, conditions=("failure",))
    env = make(config.env_id, **config.env_kwargs())
    trainer = build_trainer("failure", config, 0, env)
    assert isinstance(trainer, AdaptivePoolTrainer) and trainer.grower is not None
    assert [m.name for m in trainer.training_simulator.members] == ["base"]
    assert "failure-driven pool" in descriptions(config)["failure"]


def test_every_run_records_its_cpu_cost_per_update(tmp_path):
    run_collapse(CollapseConfig(**TINY, conditions=("frozen", "rotation", "failure")), tmp_path, progress=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    for condition in ("frozen", "rotation", "failure"):
        assert summary["conditions"][condition]["metrics"]["cpu_s_per_update"]["mean"] > 0
    evals = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r["kind"] == "eval"]
    assert all(r["cpu_s_per_update"] != r["cpu_s_per_update"] for r in evals if r["step"] == 0)  # NaN: no update yet


def test_cost_excludes_evaluations_and_counts_updates():
    cost = Cost()
    cost.observe({"kind": "eval"})
    assert cost.resume()["cpu_s_per_update"] != cost.resume()["cpu_s_per_update"]  # NaN before an update
    sum(i * i for i in range(200_000))  # an update's CPU time
    cost.observe({"kind": "train"})
    cost.pause()
    spent = cost.spent
    sum(i * i for i in range(2_000_000))  # an evaluation's: not counted
    assert cost.resume()["cpu_s_per_update"] == pytest.approx(spent) and spent > 0


@pytest.mark.parametrize("command", [["train", "cotrain"], ["experiment", "collapse"]])
def test_the_draw_rule_flag_clashes_with_no_other_flag(command, capsys):
    from simpop.cli import main

    # CoTrainConfig's fields are flags of simpop train too, next to --population-rule (a simulator population's)
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0 and "draw-rule" in capsys.readouterr().out
