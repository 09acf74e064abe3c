"""The evaluator's own environment: a symlinked interpreter grades correct work; a missing one is an error, never 0."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from simpop.envs.cooperbench.dataset import load_dataset
from simpop.envs.cooperbench.env import CooperBenchEnv
from simpop.envs.cooperbench.evaluator import Evaluator, EvaluatorError
from simpop.envs.cooperbench.simulators import ScriptedTeammate


@pytest.fixture(scope="module")
def textkit():
    return load_dataset("mini").tasks["textkit/task1"]


def _venv_prefix() -> Path:
    """This interpreter's environment folder (a venv, or the base installation)."""
    return Path(sys.executable).parent.parent


@pytest.fixture
def linked_python(tmp_path) -> str:
    """This interpreter reached through a symlinked environment folder, behind a relative link chain
    (``env`` -> ``hop`` -> the real folder), as a venv on another disk, pyenv or conda place it."""
    (tmp_path / "disks").mkdir()
    (tmp_path / "disks" / "hop").symlink_to(_venv_prefix())
    (tmp_path / "env").symlink_to(Path("disks") / "hop")
    python = tmp_path / "env" / "bin" / Path(sys.executable).name
    assert python.exists() and os.path.realpath(python) == os.path.realpath(sys.executable)
    return str(python)


def test_a_symlinked_interpreter_grades_correct_work(textkit, linked_python):
    result = Evaluator(python=linked_python).test_feature(textkit, 1, textkit.features[1].patch)
    assert result.passed and result.tests_passed == 5, result.summary() + result.output_tail
    assert not Evaluator(python=linked_python).test_feature(textkit, 1, "").passed  # and still fails the base


def test_an_episode_under_a_symlinked_interpreter_rewards_gold(linked_python):
    env = CooperBenchEnv("mini", python=linked_python)
    obs, _ = env.reset(seed=0, options={"scenario_id": "textkit/task1/f1-f3"})
    seats = {seat: ScriptedTeammate(seat=seat) for seat in ("agent1", "agent2")}
    for sim in seats.values():
        sim.reset(env.scenario, env.user_rng())
    while env.agents:
        step = env.step({env.to_act: seats[env.to_act].act(obs[env.to_act])})
        obs = step[0]
    assert step[1] == {"agent1": 1.0, "agent2": 1.0}, step[4]["agent1"]["cooperbench"]


def test_a_missing_interpreter_is_an_error_not_a_zero(textkit, tmp_path):
    missing = str(tmp_path / "gone" / "bin" / "python")
    with pytest.raises(EvaluatorError, match="does not exist"):
        Evaluator(python=missing).test_feature(textkit, 1, textkit.features[1].patch)
    # A symlinked environment whose target is gone (an unmounted disk): the same.
    (tmp_path / "env").symlink_to(tmp_path / "unmounted")
    with pytest.raises(EvaluatorError, match="does not exist"):
        Evaluator(python=str(tmp_path / "env" / "bin" / "python")).evaluate(
            textkit, 1, 3, textkit.features[1].patch, textkit.features[3].patch)
    env = CooperBenchEnv("mini", python=missing)
    obs, _ = env.reset(seed=0, options={"scenario_id": "textkit/task1/f1-f3"})
    seats = {seat: ScriptedTeammate(seat=seat) for seat in ("agent1", "agent2")}
    for sim in seats.values():
        sim.reset(env.scenario, env.user_rng())
    with pytest.raises(EvaluatorError):
        while env.agents:
            obs = env.step({env.to_act: seats[env.to_act].act(obs[env.to_act])})[0]


def test_an_interpreter_without_pytest_is_an_error(textkit, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    # An interpreter that runs but cannot import pytest (isolated mode: no site-packages of this venv).
    (bare / "python").write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    (bare / "python").chmod(0o755)
    with pytest.raises(EvaluatorError, match="cannot run pytest"):
        Evaluator(python=str(bare / "python")).test_feature(textkit, 1, textkit.features[1].patch)


def test_a_command_missing_from_the_sandbox_is_an_error(textkit):
    """The test script itself cannot find a tool it needs (exit 127, no pytest session): not the agents' fault."""
    script = textkit.tests.script.replace("python -m pytest", "simpop-no-such-tool && python -m pytest")
    broken = dataclasses.replace(textkit, tests=dataclasses.replace(textkit.tests, script=script))
    with pytest.raises(EvaluatorError, match="could not run a command"):
        Evaluator().test_feature(broken, 1, textkit.features[1].patch)
