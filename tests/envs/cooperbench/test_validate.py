"""The validation script on the mini set."""

from __future__ import annotations

import shutil

from simpop.envs.cooperbench import validate
from simpop.envs.cooperbench.dataset import MINI_DIR


def test_validation_of_the_mini_set(capsys):
    assert validate.main(["--dataset", "mini", "--jobs", "3"]) == 0
    table = capsys.readouterr().out
    assert "| textkit/task1 | 1 | FAIL 4/5 | pass 5/5 | pass 5/5 |" in table
    assert "| kvstore/task2 | 3 | FAIL 2/3 | pass 3/3 | pass 3/3 |" in table
    for task in ("textkit/task1", "kvstore/task2", "calc/task3"):
        for pair, status in (("f1-f2", "conflicts"), ("f3-f4", "conflicts"), ("f1-f3", "clean"), ("f2-f4", "clean")):
            assert f"| {task}/{pair} | {status} |" in table
    assert "12 features, 0 problems; 6/18 gold pairs do not merge cleanly" in table


def test_validation_reports_a_broken_feature(tmp_path, capsys):
    shutil.copytree(MINI_DIR / "calc_task", tmp_path / "calc_task")
    task = tmp_path / "calc_task" / "task3"
    for fid in (3, 4):
        shutil.rmtree(task / f"feature{fid}")
    (task / "feature1" / "feature.patch").write_text("")  # a gold patch that implements nothing
    assert validate.main(["--dataset", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "| calc/task3 | 1 | FAIL 1/2 | FAIL 1/2 | pass 2/2 |" in out.out
    assert "calc/task3 feature 1: the gold patch fails its tests" in out.err
