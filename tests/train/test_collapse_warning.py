"""A run with no gradient says so (issue 48): one warning line per episode of ``zero_var_frac`` 1.0 lasting
NO_GRADIENT_WINDOW updates, a record in metrics.jsonl, the line under ``simpop train``'s summary; resumes keep it."""

from __future__ import annotations

import json
import logging

import pytest

from simpop.cli import main
from simpop.train import cli as train_cli
from simpop.train import loop
from simpop.train.monitor import NO_GRADIENT_KIND, NO_GRADIENT_WINDOW, NoGradientWatch

W = NO_GRADIENT_WINDOW
#: zero_var_frac per update (1-based): signal at 1-2, none from 3 (warned at 3 + W - 1), signal at W + 6, none again
#: from W + 7 (warned at 2W + 6), signal from 2W + 9 on.
ZERO_VAR = [0.5, 0.5] + [1.0] * (W + 3) + [0.75] + [1.0] * (W + 2) + [0.25] * 4


class Schedule:
    """A real Trainer whose update k reports ``zero_var_frac`` = ``values[k - 1]`` (None: not reported, as PPO);
    the loop reads only the metrics. ``crash_at``: that update raises (a killed run)."""

    policy = None
    training_simulator = None

    def __init__(self, values=ZERO_VAR, crash_at: int | None = None) -> None:
        self.values, self.crash_at, self.update_count = list(values), crash_at, 0

    def step(self) -> dict[str, float]:
        if self.update_count + 1 == self.crash_at:
            raise RuntimeError("killed")
        self.update_count += 1
        value = self.values[self.update_count - 1]
        return {"success": 0.0, **({"zero_var_frac": value} if value is not None else {})}

    def state_dict(self) -> dict:
        return {"update_count": self.update_count}

    def load_state_dict(self, state: dict) -> None:
        self.update_count = state["update_count"]


def warnings(run_dir) -> list[tuple[int, int]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["since"]) for r in records if r["kind"] == NO_GRADIENT_KIND]


def warning_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "simpop.train.monitor" and "no gradient" in r.message]


EXPECTED = [(3 + W - 1, 3), (2 * W + 6, W + 7)]


def test_one_warning_line_and_record_per_episode(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    loop.run(Schedule(), len(ZERO_VAR), tmp_path, config=loop.LoopConfig(report_to="none"))
    assert warnings(tmp_path) == EXPECTED
    lines = warning_lines(caplog)
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[0].startswith(f"no gradient since update 3: every group's rewards were equal (zero_var_frac 1.0) "
                               f"for {W} updates in a row")
    assert "--group-size" in lines[0] and "--algorithm dapo" in lines[0] and "--kl-coef" in lines[0]


@pytest.mark.parametrize("values", [
    [1.0] * (W - 1) + [0.5] + [1.0] * (W - 1) + [0.9] * 3,  # never W updates in a row
    [None] * (2 * W + 2),  # a trainer without groups (PPO) reports no zero_var_frac
])
def test_a_healthy_run_and_a_groupless_trainer_never_warn(tmp_path, caplog, values):
    caplog.set_level(logging.WARNING)
    loop.run(Schedule(values), len(values), tmp_path, config=loop.LoopConfig(report_to="none"))
    assert warnings(tmp_path) == [] and warning_lines(caplog) == []


def test_resume_neither_repeats_nor_loses_the_warning(tmp_path):
    config = loop.LoopConfig(report_to="none")
    warned_at = EXPECTED[0][0]
    # Stopped right after the warning (checkpointed with it), then resumed: not repeated.
    loop.run(Schedule(), warned_at, tmp_path / "a", config=config)
    loop.run(Schedule(), len(ZERO_VAR), tmp_path / "a", config=config, resume=True)
    assert warnings(tmp_path / "a") == EXPECTED
    # Killed after the warning but before its checkpoint: the log is cut back to the checkpoint, the rerun warns.
    killed = loop.LoopConfig(report_to="none", save_every=10)
    with pytest.raises(RuntimeError, match="killed"):
        loop.run(Schedule(crash_at=warned_at + 1), len(ZERO_VAR), tmp_path / "b", config=killed)
    assert warnings(tmp_path / "b") == EXPECTED[:1]
    loop.run(Schedule(), len(ZERO_VAR), tmp_path / "b", config=killed, resume=True)
    assert warnings(tmp_path / "b") == EXPECTED


def test_watch_state_round_trips():
    watch = NoGradientWatch(window=2)
    assert watch.observe(1, {"zero_var_frac": 1.0}) is None
    copy = NoGradientWatch()
    copy.load_state_dict(watch.state_dict())
    assert copy == watch and copy.observe(2, {"zero_var_frac": 1.0}) == {"since": 1, "window": 2}


def build_schedule(env_id, env, spec, configs, kwargs):
    return Schedule()


def test_simpop_train_prints_it_under_the_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(train_cli.TRAINERS, "schedule", train_cli.TrainerEntry(
        "a zero_var_frac schedule", {"loop": "simpop.train.loop:LoopConfig"},
        "tests.train.test_collapse_warning:build_schedule", summary=("success", "zero_var_frac")))
    def train(out: str, updates: int, *extra: str) -> int:
        return main(["train", "schedule", "--env", "simpop/PersuasionAct-v0", "--out", str(tmp_path / out),
                     "--updates", str(updates), "--report-to", "none", "--no-export", "--no-progress", *extra])

    assert train("run", len(ZERO_VAR)) == 0
    note = [line for line in capsys.readouterr().out.splitlines() if "no gradient" in line]
    assert note == [f"{tmp_path / 'run'}: warning: no gradient (every group's rewards equal for {W}+ updates in a "
                    f"row) from update 3, {W + 7}; it recovered later; pass a larger batch (--group-size, "
                    f"--scenarios-per-update: some group then likely sees differing rewards), --algorithm dapo "
                    f"(refills such groups) or --kl-coef > 0 (pulls the policy back toward its start)"]
    assert train("run", len(ZERO_VAR), "--resume") == 0  # nothing left to do: still reported
    assert "no gradient" in capsys.readouterr().out
    assert train("ends", 2 * W + 6) == 0
    assert "still so at the last update" in capsys.readouterr().out
    assert train("fine", 2) == 0
    assert "no gradient" not in capsys.readouterr().out
