"""``simpop demo`` runs P4G dialogues at both levels."""

from __future__ import annotations

import pytest

from simpop.cli import main


@pytest.mark.parametrize("level", ["text", "act"])
def test_demo_prints_dialogues_and_outcomes(capsys, level):
    assert main(["demo", "--episodes", "3", "--seed", "4", "--level", level]) == 0
    out = capsys.readouterr().out
    assert out.count("=== simpop/Persuasion") == 3 and "[persuader] (greeting)" in out and "[persuadee]" in out
    assert out.count("-> ") == 3 and "persuader success: " in out
    assert ("donated $" in out) or ("declined" in out)


def test_demo_rejects_bad_arguments(capsys):
    assert main(["demo", "--episodes", "0"]) == 2
    assert "--episodes: must be an integer from 1" in capsys.readouterr().err
    assert main(["demo", "--level", "speech"]) == 2
