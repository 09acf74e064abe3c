"""A simulated study end to end: panel members play the participants through the HTTP API; plan and report."""

from __future__ import annotations

import json
import statistics

from simpop.cli import main
from simpop.evaluation.metrics import pairs_needed
from simpop.study.storage import read_ledger


def test_a_simulated_study_of_two_policies_plans_and_reports_what_the_records_say(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["study", "simulate", "--env", "simpop/Persuasion-v1", "--env-arg", "max_turns=3",
                 "--policy", "A=reference", "--policy", "B=tests.study.policies:Asker",
                 "--simulator", "persuadee?personas=heldout&temperature=1.3", "--simulator", "persuadee?personas=heldout",
                 "--participants", "10", "--participant-mode", "self", "--questionnaire", "age", "sex",
                 "--attention-check", "--exclude", "attention=true", "--out", str(out)]) == 0
    # By hand, from the raw files: each participant's success under A and under B.
    by_person: dict[str, dict[str, float]] = {}
    for line in (out / "episodes.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["error"] is None and record["simulator"] == "human"
        by_person.setdefault(record["member"], {})[record["extra"]["study"]["policy"]] = float(record["success"])
    assert len(by_person) == 10 and all(set(p) == {"A", "B"} for p in by_person.values())
    diffs = [p["B"] - p["A"] for p in by_person.values()]
    assert sum(e["event"] == "completed" for e in read_ledger(out)) == 10
    assert main(["study", "report", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    paired = summary["paired"]["B - A"]["success"]
    assert paired["participants"] == 10 and paired["diff"] == statistics.mean(diffs)
    assert summary["exclusions"]["participants"] == 0 and summary["flow"]["completed"] == 10
    capsys.readouterr()
    assert main(["study", "plan", str(out), "--difference", "0.2"]) == 0
    needed = pairs_needed(0.2, statistics.stdev(diffs), 0.05, 0.8)
    assert f"sd {statistics.stdev(diffs):.3f}: {needed} participants needed" in capsys.readouterr().out


def test_plan_refuses_a_folder_without_pairs(tmp_path, capsys):
    assert main(["study", "plan", str(tmp_path / "none"), "--difference", "0.1"]) == 2
    assert "not a study folder" in capsys.readouterr().err
    assert main(["study", "plan", str(tmp_path), "--difference", "0"]) == 2
    assert "--difference" in capsys.readouterr().err
