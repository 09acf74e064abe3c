"""``simpop fit-p4g``: one command remakes the shipped human-grounded P4G files from a corpus folder, and ``--check``
says whether they reproduce the shipped ones."""

from __future__ import annotations

import json


from simpop.cli import main
from simpop.evaluation import diversity
from simpop.evaluation.p4g_fit import COMMAND, differences, shipped_paths

from tests.envs.persuasion.p4g_fixture import write_p4g_corpus
from tests.evaluation.test_realism import embed


def test_differences_names_each_path():
    assert differences({"a": [1.0, 2.0], "b": "x"}, {"a": [1.0, 2.0 + 1e-12], "b": "x"}) == []
    assert differences({"a": [1.0, 2.0]}, {"a": [1.0, 2.5], "c": 1}) == ["/c: only in one", "/a[1]: 2.0 vs 2.5"]


def test_one_command_remakes_the_files_and_checks_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(diversity, "load_embedder", lambda: embed)  # the text statistics' embedder, not under test
    corpus = write_p4g_corpus(tmp_path / "p4g", n_dialogues=60, n_annotated=40, seed=5)
    argv = ["fit-p4g", "--corpus", str(corpus), "--resamples", "2"]
    assert main(argv + ["--out", str(tmp_path / "a")]) == 0
    assert main(argv + ["--out", str(tmp_path / "b"), "--check"]) == 1  # a fixture is not the public corpus
    assert "differences from the shipped file" in capsys.readouterr().out
    for name in shipped_paths():
        first, second = (json.loads((tmp_path / d / name).read_text()) for d in "ab")
        assert first == second and first["command"] == COMMAND  # the same corpus, the same numbers
    fit = json.loads((tmp_path / "a" / "p4g-fit-v1.json").read_text())
    assert len(fit["resamples"]) == 2 and fit["split"]["heldout"] == 12
    capsys.readouterr()
    assert main(["fit-p4g", "--corpus", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
