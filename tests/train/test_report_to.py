"""``--report-to`` (TRL's tracker names): the flag, TensorBoard and Weights & Biases (offline) holding the same
metrics as ``metrics.jsonl``, the experiments' plots as images, and resumes that repeat no step."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from simpop import checkpoint
from simpop.cli import main
from simpop.evaluation.metrics import WALL_CLOCK_KEYS
from simpop.evaluation.trackers import tracked_values, trackers_named

ENV = ["--env", "simpop/PersuasionAct-v0", "--no-progress", "--no-export"]
SMALL = ["--group-size", "2", "--scenarios-per-update", "2", "--env-arg", "max_turns=4"]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B in its offline mode, its files in ``tmp_path/wandb-files`` (no network, no login)."""
    root = tmp_path / "wandb-files"
    root.mkdir()
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true",
                       "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    return root


def wandb_runs(root: Path) -> list[dict]:
    """Every offline W&B run under ``root``, read back with wandb's own reader (``wandb leet inspect --json``): its
    run record (id, name, group, config) and its history rows, in the order they were written."""
    run_dirs = sorted((root / "wandb").glob("offline-run-*"))
    readers = [subprocess.Popen([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
                                stdout=subprocess.PIPE, text=True) for run_dir in run_dirs]  # read side by side
    runs = []
    for run_dir, reader in zip(run_dirs, readers):
        listed, _ = reader.communicate(timeout=120)
        assert reader.returncode == 0, f"wandb leet inspect {run_dir} failed"
        records = [json.loads(line) for line in listed.splitlines() if line.strip()]
        run = next(r["run"] for r in records if r["type"] == "run")
        config = {}  # set at the start, updated later (TRL does)
        for update in [run["config"]] + [r["config"] for r in records if r["type"] == "config"]:
            config.update({k: v for k, v in update.get("update", {}).items() if k != "_wandb"})
        runs.append({"dir": run_dir, "id": run["run_id"], "name": run.get("display_name"),
                     "group": run.get("run_group"), "config": config,
                     "history": [r["history"]["item"] for r in records if r["type"] == "history"]})
    return runs


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _expected(records: list[dict]) -> dict[int, dict[str, float]]:
    """What a tracker must hold: per step, every record's numbers as ``kind/key``."""
    steps: dict[int, dict[str, float]] = {}
    for record in records:
        steps.setdefault(record["step"], {}).update(tracked_values(record))
    return steps


def _same(got, want, rel: float = 1e-12) -> bool:
    got = float(got)  # W&B writes NaN as "NaN"
    return (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=rel)


def assert_history_is_the_log(rows: list[dict], records: list[dict], timings: bool = True) -> None:
    """One W&B row per step of ``metrics.jsonl`` (no step twice), holding exactly that step's numbers (without
    ``timings``, wall-clock values may differ: a resumed run redid the steps that W&B holds from before)."""
    steps = [row["_step"] for row in rows]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    expected = _expected(records)
    assert sorted(steps) == sorted(expected)
    for row in rows:
        want = expected[row["_step"]]
        assert {k for k in row if not k.startswith("_")} == set(want)
        assert all(_same(row[k], v) for k, v in want.items()
                   if timings or k.split("/")[-1] not in WALL_CLOCK_KEYS), (row, want)


def tensorboard_events(tb: Path) -> list[tuple[str, int, float]]:
    """``(tag, step, value)`` of every scalar event under ``tb``, in every event file (none filtered)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util.tensor_util import make_ndarray

    return [(value.tag, event.step, make_ndarray(value.tensor).item()) for path in sorted(tb.rglob("events.out.*"))
            for event in EventFileLoader(str(path)).Load() for value in event.summary.value
            if value.metadata.plugin_data.plugin_name == "scalars"]


def _train(out: Path, updates: int, *extra: str) -> list[str]:
    return ["train", "grpo", *ENV, *SMALL, "--updates", str(updates), "--out", str(out), *extra]


# ------------------------------------------------------------------------------------------------- the flag
def test_the_flag_takes_trl_s_names():
    assert trackers_named("tensorboard") == ("tensorboard",)
    assert trackers_named("wandb, tensorboard") == ("wandb", "tensorboard")
    assert trackers_named("none") == ()
    assert trackers_named("all") == ("tensorboard", "wandb")  # every one installed, as TRL's "all"
    for bad, message in (("mlflow", "unknown tracker 'mlflow'"), ("", "unknown tracker ''"),
                         ("none,wandb", "'none' and 'all' stand alone"), ("tensorboard,", "unknown tracker ''")):
        with pytest.raises(ValueError, match=message):
            trackers_named(bad)


@pytest.mark.parametrize("argv", [
    ["train", "grpo", *ENV, "--updates", "1", "--out", "OUT", "--report-to", "mlflow"],
    ["train", "ppo", *ENV, "--updates", "1", "--out", "OUT", "--report-to", "none,wandb"],
    ["experiment", "collapse", "--out", "OUT", "--report-to", "comet"],
    ["experiment", "adaptive", "--out", "OUT", "--report-to", ""],
    ["experiment", "monitor", "--out", "OUT", "--report-to", "wandb,all"],
])
def test_bad_values_are_one_line_and_exit_2(argv, tmp_path, capsys):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "report" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_wandb_not_installed_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    assert main(_train(tmp_path / "run", 1, "--report-to", "wandb")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'simpop[wandb]'" in err, err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before the run started


# ------------------------------------------------------------------------------------------------- simpop train
def test_none_writes_no_tensorboard_events_and_the_default_writes_the_log(tmp_path):
    assert main(_train(tmp_path / "none", 2, "--report-to", "none")) == 0
    assert _records(tmp_path / "none") and not (tmp_path / "none" / "tb").exists()

    assert main(_train(tmp_path / "default", 2)) == 0  # TensorBoard stays the default
    events = tensorboard_events(tmp_path / "default" / "tb")
    expected = _expected(_records(tmp_path / "default"))
    assert sorted((tag, step) for tag, step, _ in events) == sorted((k, s) for s, v in expected.items() for k in v)
    assert all(_same(value, expected[step][tag], rel=1e-6) for tag, step, value in events)  # float32 events


def test_a_grpo_run_s_wandb_history_is_its_metrics_jsonl(tmp_path, offline_wandb):
    out = tmp_path / "run"
    assert main(_train(out, 3, "--report-to", "wandb", "--panel", "p4g-act-v1", "--eval-every", "2",
                       "--eval-episodes", "2")) == 0
    (run,) = wandb_runs(offline_wandb)
    records = _records(out)
    assert {r["kind"] for r in records} == {"train", "eval"}
    assert_history_is_the_log(run["history"], records)
    assert run["id"] == (out / "wandb-run-id").read_text().strip() and run["name"] == "run"
    assert run["config"]["grpo"]["group_size"] == 2 and run["config"]["loop"]["report_to"] == "wandb"
    assert run["config"]["run"]["env"] == "simpop/PersuasionAct-v0"
    assert not (out / "tb").exists()


@pytest.mark.parametrize("report_to", ["tensorboard", "wandb"])
def test_a_resumed_run_logs_no_step_twice(report_to, tmp_path, offline_wandb):
    out = tmp_path / "run"
    assert main(_train(out, 3, "--report-to", report_to, "--save-every", "2")) == 0
    # As if killed after logging update 3 but before its checkpoint: the resume redoes update 3.
    checkpoint.by_step(out)[3].unlink()
    assert main(_train(out, 4, "--report-to", report_to, "--save-every", "2", "--resume")) == 0
    records = _records(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    if report_to == "wandb":
        first, resumed = wandb_runs(offline_wandb)
        assert first["id"] == resumed["id"]  # the same W&B run, continued
        assert [row["_step"] for row in first["history"]] == [1, 2, 3]
        assert [row["_step"] for row in resumed["history"]] == [4]
        assert_history_is_the_log(first["history"] + resumed["history"], records, timings=False)
    else:
        events = tensorboard_events(out / "tb")
        keys = [(tag, step) for tag, step, _ in events]
        assert len(keys) == len(set(keys)) and {step for _, step in keys} == {1, 2, 3, 4}


# ------------------------------------------------------------------------------------------------- experiments
def test_an_experiment_logs_each_run_and_its_report_s_plots(tmp_path, offline_wandb):
    out = tmp_path / "collapse"
    assert main(["experiment", "collapse", "--out", str(out), "--quiet", "--report-to", "wandb",
                 "--conditions", "frozen", "--seeds", "1", "--updates", "2", "--eval-every", "1",
                 "--eval-episodes", "2", "--max-turns", "4", "--heldout-personas", "40", "--workers", "1",
                 "--grpo.group-size", "2", "--grpo.scenarios-per-update", "2"]) == 0
    runs = {run["name"]: run for run in wandb_runs(offline_wandb)}
    assert set(runs) == {"frozen/seed0", "report"} and {r["group"] for r in runs.values()} == {"collapse"}
    assert_history_is_the_log(runs["frozen/seed0"]["history"], _records(out / "runs" / "frozen" / "seed0"))
    assert runs["frozen/seed0"]["config"]["run"]["condition"] == "frozen"
    (row,) = runs["report"]["history"]
    plots = sorted(p.stem for p in out.glob("*.png"))
    assert plots and sorted({k.split(".")[0] for k in row if not k.startswith("_")}) == [f"plots/{p}" for p in plots]
    assert all(row[f"plots/{p}._type"] == "image-file" for p in plots)
    assert len(list(runs["report"]["dir"].glob("files/media/images/plots/*.png"))) == len(plots)
    assert runs["report"]["config"]["conditions"] == ["frozen"]
