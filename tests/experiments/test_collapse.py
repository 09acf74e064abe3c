"""The collapse experiment end to end (tiny budget): outputs, schema, conditions, panel, resume."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from simpop.cli import main
from simpop.envs import make
from simpop.envs.persuasion.corpus import load_corpus
from simpop.envs.persuasion.personas import modal_persona
from simpop.envs.persuasion.simulators import ActPersuadee, TextPersuadee
from simpop.envs.persuasion.trainable import TrainableActPersuadee
from simpop.evaluation.metrics import WALL_CLOCK_KEYS
from simpop.experiments.collapse_report import SUMMARY_METRICS
from simpop.experiments.collapse import descriptions, run_collapse
from simpop.experiments.conditions import (DEFAULT_CONDITIONS, CORPUS_PANEL_TEMPERATURES, PANEL_TEMPERATURES,
                                           ROBUST_PANEL_TEMPERATURES, TEXT_PANEL_LLM_TEMPERATURES, CollapseConfig,
                                           build_panel, build_trainer, extra_panels, panel_specs, robust_panel_specs,
                                           shared_model_members, simulator_specs)
from simpop.seat import SimulatorSpec
from simpop.simulators.llm import LLMSimulator
from simpop.simulators.population import PanelOverlapError, leaf_simulators
from simpop.simulators.registry import build_many
from simpop.simulators.trainable import TrainableLLMSimulator
from simpop.simulators.verbalized import Renormalised, VerbalizedSimulator
from simpop.train.config import to_dict
from simpop.train.cotrain import CoTrainer
from tests.envs.persuasion.p4g_fixture import write_p4g_corpus
from tests.simulators.fakes import FakeBackend, FakeTrainableBackend

TINY = dict(seeds=2, updates=2, eval_every=1, eval_episodes=4, max_turns=4, heldout_personas=40, workers=1,
            grpo={"group_size": 2, "scenarios_per_update": 2},
            cotrain={"population_size": 2, "pool_size": 2, "snapshot_every": 1})


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("collapse")
    argv = ["experiment", "collapse", "--out", str(out), "--quiet"]
    for key, value in TINY.items():  # nested configs' fields are --grpo.group-size, --cotrain.pool-size, ...
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in items:
            argv += [f"--{key}.{sub.replace('_', '-')}" if sub else f"--{key.replace('_', '-')}", str(v)]
    assert main(argv) == 0
    return out


def test_outputs_and_schema(finished):
    names = {p.name for p in finished.iterdir()}
    assert {"metrics.jsonl", "summary.json", "report.md", "config.json", "heldout_success.png", "train_success.png",
            "policy_entropy.png", "zero_var_frac.png"} <= names
    summary = json.loads((finished / "summary.json").read_text())
    assert list(summary["conditions"]) == list(DEFAULT_CONDITIONS)
    for condition in summary["conditions"].values():
        assert condition["description"]
        assert set(condition["metrics"]) >= set(SUMMARY_METRICS) - {"corpus_success"}  # no corpus panel here
        for metric in condition["metrics"]:
            stat = condition["metrics"][metric]
            assert set(stat) == {"mean", "ci_low", "ci_high", "n", "per_seed", "unit"} and stat["n"] == 2
            assert stat["unit"] == "seed"
            assert stat["ci_low"] <= stat["mean"] <= stat["ci_high"]
    assert [c["claim"] for c in summary["claims"]] == ["a", "b", "c"]
    assert all(c["verdict"] in ("reproduced", "inconclusive", "not reproduced") for c in summary["claims"])
    records = [json.loads(line) for line in (finished / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(evals) == len(DEFAULT_CONDITIONS) * 2 * 3  # steps 0, 1, 2 for every (condition, seed)
    assert len([r for r in records if r["kind"] == "train"]) == len(DEFAULT_CONDITIONS) * 2 * 2
    assert all({"heldout_success", "train_success", "collapse_gap", "policy_entropy"} <= set(r) for r in evals)
    # Same seeds, same initial policy, same panel dialogues: every condition starts from the same point.
    start = {(r["seed"], r["heldout_success"]) for r in evals if r["step"] == 0}
    assert len(start) == 2
    report = (finished / "report.md").read_text()
    assert "| frozen |" in report and "Claim (a)" in report and "![heldout_success]" in report


def _without_timings(path):
    return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK_KEYS}
            for line in path.read_text().splitlines()]


def test_resume_completes_only_missing_work(finished, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(finished, out)
    before = (out / "runs" / "cotrain" / "seed1" / "metrics.jsonl").read_text()
    shutil.rmtree(out / "runs" / "frozen" / "seed0")  # as if that run had never started
    with pytest.raises(FileExistsError, match="--resume"):
        run_collapse(CollapseConfig(**TINY), out, resume=False, progress=False)
    run_collapse(CollapseConfig(**TINY), out, resume=True, progress=False)
    assert (out / "runs" / "cotrain" / "seed1" / "metrics.jsonl").read_text() == before  # untouched
    redone, original = (_without_timings(d / "runs" / "frozen" / "seed0" / "metrics.jsonl") for d in (out, finished))
    assert redone == original  # deterministic
    with pytest.raises(ValueError, match="different settings"):
        run_collapse(CollapseConfig(**{**TINY, "updates": 3}), out, resume=True, progress=False)


def test_condition_simulators_and_panel():
    config = CollapseConfig(**TINY)
    env = make(config.env_id, **config.env_kwargs())
    frozen = build_trainer("frozen", config, 0, env).training_simulator
    assert type(frozen) is ActPersuadee and frozen.decoding == "greedy" and frozen.personas == [modal_persona()]
    verbalized = build_trainer("verbalized", config, 0, env).training_simulator
    assert isinstance(verbalized, Renormalised) and type(verbalized.inner) is ActPersuadee
    assert (verbalized.floor, verbalized.tau) == (config.verbalized_floor, config.verbalized_tau)
    assert verbalized.inner.personas is None  # the training persona set: each scenario's own persona
    population = build_trainer("population", config, 0, env)
    assert isinstance(population, CoTrainer) and len(population.simulators) == config.cotrain.population_size
    assert all(type(s) is TrainableActPersuadee for s in population.simulators)
    panel = build_panel(config, env)
    panel.check_disjoint([population.training_simulator, frozen, verbalized], strict=True)  # raises if not held out
    personas = env.persona_set(f"heldout-{config.heldout_personas}-{config.heldout_seed}")
    assert modal_persona() not in personas and len(personas) > 30
    assert all(m.personas == list(personas) for _, m in panel)
    assert {m.temperature for _, m in panel} == set(PANEL_TEMPERATURES) == {0.8, 0.9, 1.2}
    assert len({m.model.params for _, m in panel}) == len(PANEL_TEMPERATURES)  # three held-out models


def _fake_text_backends(config):
    """Backends the text-level specs name, faked (building specs loads no model)."""
    model = config.sim_model or config.model.model
    return {model: FakeBackend(name=model), f"trainable:{model}": FakeTrainableBackend(name=model)}


@pytest.mark.parametrize("level", ["act", "text"])
def test_every_conditions_specs_build_simulators_held_out_from_the_panel(level):
    config = CollapseConfig(level=level, **TINY)
    env = make(config.env_id, **config.env_kwargs())
    backends = _fake_text_backends(config) if level == "text" else {}
    panel = build_panel(config, env, backends)
    assert list(panel.members) == list(panel_specs(config)) and panel.name == "p4g-heldout"
    shared = shared_model_members(config)
    assert all(type(m) is (LLMSimulator if name in shared else ActPersuadee if level == "act" else TextPersuadee)
               for name, m in panel)
    # Text level: native text persuadees plus LLM members on held-out personas at another temperature.
    assert shared == ([f"llm-heldout-T{t:g}" for t in TEXT_PANEL_LLM_TEMPERATURES] if level == "text" else [])
    kinds = {"act": {"frozen": ActPersuadee, "verbalized": Renormalised, "cotrain": TrainableActPersuadee,
                     "population": TrainableActPersuadee},
             "text": {"frozen": LLMSimulator, "verbalized": VerbalizedSimulator, "cotrain": TrainableLLMSimulator,
                      "population": TrainableLLMSimulator}}[level]
    for condition in DEFAULT_CONDITIONS:
        specs = simulator_specs(condition, config)
        assert len(specs) == (config.cotrain.population_size if condition == "population" else 1)
        simulators = build_many(specs, env, backends)
        assert [s.name for s in simulators] == list(specs)
        assert all(type(s) is kinds[condition] for s in simulators)
        for s in leaf_simulators(simulators) + [m for _, m in panel]:
            assert SimulatorSpec.parse(str(s.spec)) == s.spec
        panel.check_disjoint(simulators, shared_model=shared, strict=True)  # raises PanelOverlapError if any is not held out
        # ... which it would if training shared a panel member's model, decoding and personas.
        with pytest.raises(PanelOverlapError):
            panel.check_disjoint(simulators + build_many(list(panel_specs(config).values())[:1], env),
                                 shared_model=shared, strict=True)
        if shared and condition in ("frozen", "verbalized"):  # (trainable simulators' model is base + adapter)
            # the LLM members share the one LLM: held out by persona and decoding, and only when allowed
            with pytest.raises(PanelOverlapError, match="the model of every training simulator"):
                panel.check_disjoint(simulators, strict=True)


def test_config_validation():
    with pytest.raises(ValueError, match="conditions"):
        CollapseConfig(conditions=("frozen", "nope"))
    with pytest.raises(ValueError, match="grpo: GRPOConfig: group_size"):
        CollapseConfig(grpo={"group_size": 1})
    with pytest.raises(ValueError, match="unknown GRPOConfig fields"):
        CollapseConfig(grpo={"group_sise": 4})
    with pytest.raises(ValueError, match="population co-training needs a checkpoint pool"):
        CollapseConfig(cotrain={"pool_size": 0, "pool_sample_prob": 0.0})
    assert CollapseConfig().seeds >= 10 and CollapseConfig(level="text").seeds == 1


def test_nested_configs_take_level_defaults_and_partial_overrides(tmp_path):
    act, text = CollapseConfig(), CollapseConfig(level="text")
    assert (act.grpo.group_size, text.grpo.group_size, act.grpo.max_new_tokens) == (8, 4, 24)
    assert act.conditions == DEFAULT_CONDITIONS and text.conditions == ("frozen", "verbalized")
    assert text.env_id == "simpop/Persuasion-v1" and text.model.dtype in ("float32", "bfloat16")
    assert (act.cotrain.sim_lr, text.cotrain.sim_lr) == (0.05, 1e-4) and (act.model.lora, text.model.lora) == (False, True)
    config = CollapseConfig(grpo={"lr": 0.02}, cotrain={"population_size": 4})
    assert config.grpo.lr == 0.02 and config.grpo.group_size == 8 and config.cotrain.population_size == 4
    # YAML sections and --section.field flags reach the same nested config; flags win.
    import argparse

    from simpop.experiments.cli import configure
    from simpop.train.config import build

    (tmp_path / "c.yaml").write_text("grpo:\n  lr: 0.03\n  group_size: 4\ncotrain:\n  sim_lr: 0.2\n")
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["collapse", "--grpo.lr", "0.04", "--model.hidden-size", "16"])
    built = build(CollapseConfig, args, yaml_path=tmp_path / "c.yaml")
    assert (built.grpo.lr, built.grpo.group_size, built.cotrain.sim_lr, built.model.hidden_size) == (0.04, 4, 0.2, 16)


def test_objective_ablations_are_conditions():
    config = CollapseConfig(**{**TINY, "conditions": ("cotrain", "cotrain+persona", "population",
                                                      "population+diverse")})
    env = make(config.env_id, **config.env_kwargs())
    persona = build_trainer("cotrain+persona", config, 0, env)
    assert isinstance(persona, CoTrainer) and persona.config.objective == "persona"
    assert persona.config.population_size == 1 and persona.config.pool_size == 0
    assert [s.name for s in persona.simulators] == ["cotrain-0"]
    diverse = build_trainer("population+diverse", config, 0, env)
    assert (diverse.config.objective, diverse.config.population_size, diverse.config.pool_prune) == \
        ("diverse", 2, "redundant")
    assert "objective persona" in descriptions(config)["cotrain+persona"]
    assert "objective target" in descriptions(config)["cotrain"]
    for conditions, message in ((("cotrain+diverse",), "population\\+diverse"),
                                (("cotrain+realism",), "reference_data"),
                                (("frozen+persona",), "unknown"), (("cotrain+nope",), "unknown")):
        with pytest.raises(ValueError, match=message):
            CollapseConfig(**{**TINY, "conditions": conditions})


def test_robustness_panel_is_built_another_way_and_held_out():
    config = CollapseConfig(**TINY)
    assert config.robust_panel and not CollapseConfig(level="text").robust_panel
    env = make(config.env_id, **config.env_kwargs())
    robust, heldout = build_panel(config, env, name="robust"), build_panel(config, env)
    assert robust.name == "p4g-robust" and list(robust.members) == list(robust_panel_specs(config))
    assert {m.temperature for _, m in robust} == set(ROBUST_PANEL_TEMPERATURES)
    assert {m.model_name for _, m in robust} == {"shuffled-0", "shuffled-1", "shuffled-2"}
    personas = {p for _, m in robust for p in m.personas}
    assert personas.isdisjoint({p for _, m in heldout for p in m.personas})
    assert personas.isdisjoint(env.load_scenario(i).persona for i in env.scenario_ids())
    for condition in DEFAULT_CONDITIONS:
        robust.check_disjoint([build_trainer(condition, config, 0, env).training_simulator], strict=True)


def test_finished_run_reports_robustness_convergence_and_per_seed_curves(finished):
    records = [json.loads(line) for line in (finished / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert all(0 <= r["robust_success"] <= 1 and len(r["robust_outcomes"]) == 3 * TINY["eval_episodes"]
               for r in evals)
    assert {p.name for p in finished.iterdir()} >= {"robust_success.png", "heldout_success_per_seed.png",
                                                     "robust_success_per_seed.png"}
    report = (finished / "report.md").read_text()
    assert "robustness panel**: three native persuadee models whose persuasive strategies" in report
    assert "Convergence (training success over the last 10%" in report


def test_corpus_panel_fits_persuadees_to_a_corpus(tmp_path):
    corpus = write_p4g_corpus(tmp_path / "p4g", n_dialogues=40, n_annotated=20)
    config = CollapseConfig(**{**TINY, "corpus_panel": str(corpus)})
    env = make(config.env_id, **config.env_kwargs())
    panel = build_panel(config, env, name="corpus")
    assert panel.name == "p4g-corpus" and set(extra_panels(config)) == {"robust", "human", "corpus"}
    assert {m.model_name for _, m in panel} == {"fitted-0", "fitted-1", "fitted-2"}
    assert {m.temperature for _, m in panel} == set(CORPUS_PANEL_TEMPERATURES)
    assert all(m.personas == load_corpus(corpus).personas() for _, m in panel)  # the corpus's persuadees
    assert {m.spec.personas for _, m in panel} == {f"corpus:{corpus.resolve()}"}  # a persona set like any other
    assert len({m.model.params for _, m in panel}) == 3  # three resamples, three fits
    for condition in DEFAULT_CONDITIONS:
        panel.check_disjoint([build_trainer(condition, config, 0, env).training_simulator], strict=True)
    with pytest.raises(ValueError, match="corpus_panel .*: no such folder"):
        CollapseConfig(**{**TINY, "corpus_panel": str(tmp_path / "missing")})
    out = tmp_path / "run"
    run_collapse(dataclasses.replace(config, conditions=("frozen",), seeds=1, updates=1), out, progress=False)
    summary = json.loads((out / "summary.json").read_text())
    assert 0 <= summary["conditions"]["frozen"]["metrics"]["corpus_success"]["mean"] <= 1
    assert "corpus panel**: three native persuadee models fitted" in (out / "report.md").read_text()


def test_human_fitted_panel_is_the_default_third_panel_with_the_realism_index(finished):
    records = [json.loads(line) for line in (finished / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert all(0 <= r["human_success"] <= 1 and set(r) >= {"human/fitted-0-T0.9", "human/fitted-2-T1.3"}
               for r in evals)
    finals = [r for r in evals if r["step"] == TINY["updates"]]
    assert finals and all(0 < r["realism_index"] < 1 and r["realism_ci"][0] <= r["realism_index"] for r in finals)
    assert not any("realism_index" in r for r in evals if r["step"] < TINY["updates"])  # only after training
    summary = json.loads((finished / "summary.json").read_text())
    assert summary["setup"]["config"]["human_panel"] == "p4g-act-human-v1"
    report = (finished / "report.md").read_text()
    assert "human-fitted panel**: `p4g-act-human-v1`" in report and "## Simulator to people" in report
    older = CollapseConfig(**{**TINY, "human_panel": "none"})  # reports made before it was the default
    assert set(extra_panels(older)) == {"robust"}
    with pytest.raises(ValueError, match="human_panel: .*p4g-text-v1.* is for simpop/Persuasion-v1"):
        CollapseConfig(**{**TINY, "human_panel": "p4g-text-v1"})
    env = make(older.env_id, **older.env_kwargs())
    human = build_panel(CollapseConfig(**TINY), env, name="human")
    for condition in DEFAULT_CONDITIONS:
        human.check_disjoint([build_trainer(condition, CollapseConfig(**TINY), 0, env).training_simulator], strict=True)


def test_a_run_saved_before_the_human_panel_resumes_only_without_it(tmp_path):
    config = CollapseConfig(**TINY)
    saved = to_dict(config)
    del saved["human_panel"]  # a config.json written before the field existed
    (tmp_path / "runs").mkdir()
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"different settings \(human_panel\)"):
        run_collapse(config, tmp_path, resume=True, progress=False)
