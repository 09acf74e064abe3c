"""The one validator (``simpop.validation``, pydantic's TypeAdapter): the same rules for YAML and flags (see
test_input_validation.py), configs built in Python, env arguments and panel files, in one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

import simpop
from simpop.agents.policy import ModelConfig
from simpop.envs.cooperbench.sandbox import Limits
from simpop.experiments.conditions import CollapseConfig
from simpop.simulators.registry import load_panel
from simpop.train.grpo import GRPOConfig
from simpop.train.loop import LoopConfig
from simpop.validation import InvalidValue, check

ACT = "simpop/PersuasionAct-v0"


def _refused(call, *needles):
    with pytest.raises(InvalidValue) as error:
        call()
    text = str(error.value)
    assert "\n" not in text and all(n in text for n in needles), text
    return text


def test_configs_built_in_python_are_checked_like_yaml():
    _refused(lambda: GRPOConfig(group_size=4.7), "GRPOConfig: group_size must be an integer, got 4.7 (float)")
    _refused(lambda: LoopConfig(monitor="false"), "LoopConfig: monitor must be true or false, got 'false'",
             "without quotes")
    _refused(lambda: GRPOConfig(temperature=float("inf")), "temperature must be a finite number")
    _refused(lambda: GRPOConfig(seed=-2), "seed must be from 0 to 4294967295")
    _refused(lambda: ModelConfig(model=3), "ModelConfig: model must be a string, got 3 (int)")
    _refused(lambda: Limits(timeout_s=True), "Limits: timeout_s must be a number, got True")
    _refused(lambda: CollapseConfig(conditions=["frozen", 3]), "conditions[1] must be a string, got 3")
    # Lossless conversions, as from YAML: numbers written as text, lists for tuples.
    config = GRPOConfig(group_size="6", lr="1e-2")
    assert (config.group_size, config.lr) == (6, 0.01)
    assert isinstance(CollapseConfig(conditions=["frozen"], seeds=1).conditions, tuple)


def test_env_arguments_follow_the_same_rules():
    assert simpop.make(ACT, max_turns="4").max_turns == 4  # as a YAML or flag value is read
    _refused(lambda: simpop.make(ACT, max_turns=4.5), f"{ACT}: argument max_turns must be an integer, got 4.5")
    _refused(lambda: simpop.make(ACT, max_turns=True), "argument max_turns must be an integer, got True")
    with pytest.raises(TypeError, match="unknown argument"):
        simpop.make(ACT, maxturns=3)
    # A simulator fills the user seat of gymnasium.make's single-agent view; the two-seat env says where to go.
    with pytest.raises(TypeError, match=r"simpop.make builds the two-seat PettingZoo env.*gymnasium.make\("):
        simpop.make(ACT, simulator="persuadee")


def test_panel_files_are_checked(tmp_path):
    path = tmp_path / "panel.yaml"
    path.write_text("name: [a]\nmembers: [persuadee]\n")
    _refused(lambda: load_panel(path), f"panel {path}: name must be a string, got ['a'] (list)")
    path.write_text("members: {a: persuadee, b: 3}\n")
    _refused(lambda: load_panel(path), "members must be a list (each item a string) or a mapping")
    assert load_panel({"name": "p", "members": ["persuadee"]}, simpop.make(ACT)).name == "p"


def test_the_validator_describes_what_each_annotation_takes():
    _refused(lambda: check("X", "mode", Literal["a", "b"], "c"), "X: mode must be one of 'a', 'b', got 'c'")
    _refused(lambda: check("X", "n", int | None, "many"), "X: n must be an integer or null, got 'many'")
    _refused(lambda: check("X", "where", Path, 3), "X: where must be a path")
    assert check("X", "where", Path, "a/b") == Path("a/b")
    assert check("X", "anything", object, 5) == 5
