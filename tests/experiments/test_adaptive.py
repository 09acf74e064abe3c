"""``simpop experiment adaptive`` (fixed vs failure-driven pool vs population co-training) and ``monitor``."""

from __future__ import annotations

import json

import pytest

from simpop.cli import main
from simpop.experiments import adaptive
from simpop.experiments.adaptive import AdaptiveConfig

TINY = ["--seeds", "2", "--updates", "4", "--eval-every", "2", "--eval-episodes", "4", "--grow-every", "2",
        "--max-turns", "4", "--workers", "1", "--grpo.group-size", "2", "--grpo.scenarios-per-update", "4",
        "--pool.probe-episodes", "8", "--pool.cap", "2", "--cotrain.population-size", "2", "--cotrain.pool-size", "2",
        "--quiet"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("adaptive")
    assert main(["experiment", "adaptive", "--out", str(out), *TINY]) == 0
    return out


def test_runs_every_condition_and_seed_and_writes_the_report(finished):
    summary = json.loads((finished / "summary.json").read_text())
    assert set(summary["conditions"]) == {"fixed", "failure", "population"}
    for cond in summary["conditions"].values():
        assert len(cond["heldout_success"]["per_seed"]) == 2
        assert all(0 <= v <= 1 for v in cond["heldout_success"]["per_seed"])
    labels = [c["label"] for c in summary["comparisons"]]
    assert "held-out success: failure - fixed" in labels
    report = (finished / "report.md").read_text()
    assert "| failure |" in report and "Paired comparisons" in report
    assert all((finished / f"{p}.png").stat().st_size > 0 for p in ("heldout_success", "pool_size", "compute"))


def test_failure_pool_grows_from_probes_within_its_cap_and_counts_probe_compute(finished):
    records = [json.loads(line) for line in (finished / "metrics.jsonl").read_text().splitlines()]
    growth = [r for r in records if r["condition"] == "failure" and r["kind"] == "train" and "pool_added" in r]
    assert [r["step"] for r in growth if r["seed"] == 0] == [2, 4]
    assert all(1 <= r["pool_size"] <= 2 for r in growth)
    evals = {(r["condition"], r["seed"]): r for r in records if r["kind"] == "eval" and r["step"] == 4}
    assert evals[("failure", 0)]["probe_dialogues"] == 2 * 2 * 8  # 2 rounds x 2 probe members x 8 dialogues
    assert evals[("failure", 0)]["dialogues"] == evals[("fixed", 0)]["dialogues"] + 32
    assert evals[("fixed", 0)]["pool_size"] == 2  # base + one random region


def test_resume_skips_finished_runs_and_refuses_other_settings(finished, capsys):
    before = (finished / "runs" / "fixed" / "seed0" / "metrics.jsonl").read_text()
    assert main(["experiment", "adaptive", "--out", str(finished), "--resume", *TINY]) == 0
    assert (finished / "runs" / "fixed" / "seed0" / "metrics.jsonl").read_text() == before
    assert main(["experiment", "adaptive", "--out", str(finished), *TINY]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["experiment", "adaptive", "--out", str(finished), "--resume", *TINY, "--eval-episodes", "6"]) == 2
    err = capsys.readouterr().err
    assert "different settings (eval_episodes)" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_a_killed_failure_run_resumes_with_the_same_pool(tmp_path):
    config = AdaptiveConfig(seeds=1, conditions=("failure",), updates=4, eval_every=2, eval_episodes=4, grow_every=2,
                            max_turns=4, workers=1, grpo={"group_size": 2, "scenarios_per_update": 4},
                            pool={"probe_episodes": 8, "cap": 3})
    adaptive.run_adaptive(config, tmp_path / "whole", progress=False)
    short = AdaptiveConfig(**{**config.__dict__, "updates": 2})
    adaptive.run_one(short, "failure", 0, tmp_path / "cut", resume=False)
    adaptive.run_one(config, "failure", 0, tmp_path / "cut", resume=True)
    timing = ("time", "steps_per_s", "tokens_per_s")

    def strip(path):
        return [{k: v for k, v in json.loads(line).items() if not k.endswith("_s") and k not in timing}
                for line in path.read_text().splitlines()]

    whole = strip(tmp_path / "whole" / "runs" / "failure" / "seed0" / "metrics.jsonl")
    assert strip(tmp_path / "cut" / "runs" / "failure" / "seed0" / "metrics.jsonl") == whole


def test_random_regions_are_policy_blind_and_seeded():
    first = adaptive.random_region_specs(3, 0)
    assert first == adaptive.random_region_specs(3, 0) != adaptive.random_region_specs(3, 1)
    assert len(adaptive.random_region_specs(3, 0)) == 3


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="conditions"):
        AdaptiveConfig(conditions=("nope",))
    with pytest.raises(ValueError, match="pool"):
        AdaptiveConfig(pool={"cap": 0})


def test_monitor_calibration_reports_both_rules_and_resumes_from_the_run_folders(tmp_path, capsys):
    from simpop.experiments.monitor_calibration import MonitorCalibrationConfig, outcome

    argv = ["experiment", "monitor", "--out", str(tmp_path), "--seeds", "1", "--conditions", "frozen", "verbalized",
            "--updates", "10", "--eval-every", "5", "--eval-episodes", "4", "--probe-every", "5",
            "--probe-episodes", "4", "--workers", "1"]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["rules"]) == {"pre-registered", "post-hoc (require one of zero_var, stall)"}
    run = summary["runs"][0]
    assert run["condition"] == "frozen" and set(run["curve"]) == {"0", "5", "10"} and len(run["probes"]) == 2
    assert outcome(tmp_path / "runs" / "frozen" / "seed0", "frozen", 0) == run
    assert "Lead time" in (tmp_path / "report.md").read_text() or "fired on no frozen run" in (
        tmp_path / "report.md").read_text()
    before = (tmp_path / "runs" / "frozen" / "seed0" / "metrics.jsonl").read_text()
    assert main(argv) == 2 and "already holds a run" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0  # finished runs are read back, not rerun
    assert (tmp_path / "runs" / "frozen" / "seed0" / "metrics.jsonl").read_text() == before
    assert MonitorCalibrationConfig().conditions == ("frozen", "verbalized", "cotrain")


def test_reply_diversity_counts_distinct_user_replies():
    from types import SimpleNamespace

    from simpop.train.pool import reply_diversity

    batch = [SimpleNamespace(user_seat="u", actions={"u": [1, 2, 2], "p": [0]}),
             SimpleNamespace(user_seat="u", actions={"u": [2]})]
    assert reply_diversity(batch) == 0.5 and reply_diversity([]) != reply_diversity([])  # nan
