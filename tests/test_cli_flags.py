"""Every numeric flag of every command, found by walking the parsers (:mod:`tests.cli_flags`), refuses ``nan``,
``inf`` and values outside its range with one line and exit status 2."""

from __future__ import annotations

import argparse

import pytest

from simpop.cli import COMMANDS, build_parser
from simpop.user_input import Bounded
from tests.cli_flags import check, flags, is_numeric, standalone_mains, subparsers, walk_module
from tests.integrations.conftest import rllib_python, run_in, verifiers_python  # noqa: F401  (fixtures)

#: Standalone modules whose extra lives in its own environment, and the fixture of that environment's Python.
OWN_ENVIRONMENT = {"simpop.integrations.verifiers_env": "verifiers_python",
                   "simpop.integrations.rllib_marl": "rllib_python"}


def test_every_simpop_command_s_numeric_flags_refuse_nan_inf_and_out_of_range_values():
    walked, failures = set(), []
    for name in COMMANDS:
        top = build_parser([name])
        for argv, parser in subparsers(top, []):
            if argv[:1] == [name]:  # the other commands' parsers are empty until their command is given
                walked |= {(" ".join(argv), flag) for flag, action in flags(parser) if is_numeric(action.type)}
                failures += check("simpop", top, argv, parser)
    assert failures == []
    assert {("train grpo", "--seed"), ("train ppo", "--updates"), ("openenv serve", "--port"),
            ("audit", "--act-episodes"), ("eval", "--threads"), ("study serve", "--idle-timeout")} <= walked
    assert len(walked) > 150


def test_standalone_entry_points_refuse_them_too(verifiers_python, rllib_python):  # noqa: F811  (the fixtures)
    modules = standalone_mains()
    assert {"simpop.envs.cooperbench.validate", "simpop.experiments.selfplay"} | set(OWN_ENVIRONMENT) <= set(modules)
    pythons = {"verifiers_python": verifiers_python, "rllib_python": rllib_python}
    for module in modules:
        if module in OWN_ENVIRONMENT:
            run = run_in(pythons[OWN_ENVIRONMENT[module]], "-m", "tests.cli_flags", module, timeout=300)
            assert run.returncode == 0 and " 0 failures" in run.stdout, run.stdout + run.stderr[-2000:]
        else:
            total, failures = walk_module(module)
            assert failures == [] and total >= 1, module


def test_a_value_in_range_is_read_as_its_number():
    assert Bounded(int, 1, 10)("7") == 7 and Bounded(float, 0, 1, above=True)("0.5") == 0.5
    for bad in ("0", "11", "7.5", "nan", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="from 1 to 10"):
            Bounded(int, 1, 10)(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="> 0"):
        Bounded(float, 0, 1, above=True)("0")
