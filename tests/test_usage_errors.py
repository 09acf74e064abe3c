"""Arguments that cannot be used as given are one line and exit status 2, before any work or file is done."""

from __future__ import annotations

import pytest

from simpop.cli import main

ACT = ["--env", "simpop/PersuasionAct-v0"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv, message", [
    (["--corpus", "x"], "--corpus is not used by the diversity audit (add --realism)"),
    (["--act-sim", "persuadee", "--act-episodes", "4"], "--act-sim, --act-episodes are not used by"),
    (["--realism", "--sim", "frozen:smollm2"], "--sim is not used by --realism"),
    (["--realism", "--env", "simpop/Tau2Airline-v0", "--n", "3"], "--n, --env are not used by --realism"),
])
def test_audit_refuses_flags_the_chosen_audit_would_ignore(tmp_path, capsys, argv, message):
    assert main(["audit", *argv, "--out", str(tmp_path / "out")]) == 2
    assert message in one_line(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (["--scenario", "nosuch"], "scenario 'nosuch': simpop/Persuasion-v1 has no such scenario"),
    (["--env", "simpop/PersuasionAct-v0"], "the audit replays P4G histories in a P4G text env"),
    (["--histories", "greeting,nope"], "--histories: unknown id(s) nope"),
])
def test_audit_names_a_bad_scenario_env_or_history_in_one_line(tmp_path, capsys, argv, message):
    assert main(["audit", "--sim", "persuadee", *argv, "--out", str(tmp_path / "out")]) == 2
    assert message in one_line(capsys)


def test_a_huge_turn_cap_or_seed_is_refused_before_any_allocation(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "selfplay", *ACT, "--env-arg", "max_turns=1000000000", "--updates", "1", "--out", out]) == 2
    assert "max_turns must be from 1 to 1000" in one_line(capsys)
    assert main(["train", "grpo", *ACT, "--seed", str(2**70), "--updates", "1", "--out", out]) == 2
    assert "seed must be from 0 to 4294967295" in one_line(capsys)
    assert not (tmp_path / "run").exists()
