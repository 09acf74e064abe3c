"""The collapse early warning (simpop.train.monitor): its rule, the loop hook and the TRL callback."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simpop.train import loop
from simpop.train.monitor import CollapseMonitor, MonitorRule, report_section


def collapsing(step: int) -> tuple[dict[str, float], dict[str, float]]:
    """A run that exploits its simulator: training success climbs to 1, groups go flat, entropy drains, and two
    probe members split (one stays, one falls)."""
    t = step / 100
    metrics = {"success": min(1.0, 0.4 + 0.6 * t), "zero_var_frac": min(1.0, 0.1 + 0.9 * t),
               "policy_entropy": 2.5 * np.exp(-3 * t)}
    return metrics, {"a": 0.4, "b": max(0.0, 0.4 - 0.3 * t)}


def healthy(step: int) -> tuple[dict[str, float], dict[str, float]]:
    """A run that learns what transfers: probe success rises with training success, groups keep their variance,
    entropy falls slowly."""
    t = step / 100
    metrics = {"success": 0.3 + 0.4 * t, "zero_var_frac": 0.1, "policy_entropy": 2.5 - 0.5 * t}
    return metrics, {"a": 0.28 + 0.4 * t, "b": 0.3 + 0.38 * t}


def drive(run, updates: int = 100, probe_every: int = 10, rng: np.random.Generator | None = None) -> CollapseMonitor:
    monitor = CollapseMonitor()
    for step in range(1, updates + 1):
        metrics, probe = run(step)
        if rng is not None:  # sampling noise of a 64-dialogue batch and a 32-dialogue probe
            metrics = {**metrics, "success": float(np.clip(metrics["success"] + rng.normal(0, 0.06), 0, 1))}
            probe = {k: float(np.clip(v + rng.normal(0, 0.08), 0, 1)) for k, v in probe.items()}
        monitor.observe_update(step, metrics)
        if step % probe_every == 0:
            monitor.observe_probe(step, probe)
    return monitor


def test_fires_on_a_collapsing_run_and_stays_silent_on_a_healthy_one():
    collapsed, fine = drive(collapsing), drive(healthy)
    assert collapsed.fired and 20 <= collapsed.fired_at <= 60
    assert not fine.fired
    assert all(h["collapse_warning"] == 0 for h in fine.history)


def test_the_verdicts_hold_under_sampling_noise():
    fired = [drive(collapsing, rng=np.random.default_rng(s)).fired for s in range(10)]
    silent = [not drive(healthy, rng=np.random.default_rng(s)).fired for s in range(10)]
    assert sum(fired) >= 9 and sum(silent) >= 9


def test_one_suspicious_probe_is_not_enough():
    monitor = CollapseMonitor(MonitorRule(persistence=2))
    for step in range(1, 11):
        monitor.observe_update(step, {"success": 0.9, "zero_var_frac": 0.9})
    first = monitor.observe_probe(10, {"a": 0.3})  # gap and zero-var hold
    assert first["suspicious"] == 1 and first["collapse_warning"] == 0
    for step in range(11, 21):
        monitor.observe_update(step, {"success": 0.5, "zero_var_frac": 0.1})
    assert monitor.observe_probe(20, {"a": 0.45})["suspicious"] == 0  # the streak breaks
    assert not monitor.fired


def test_entropy_ratio_and_slope_need_two_windows():
    monitor = CollapseMonitor(MonitorRule(window=5))
    for step in range(1, 10):
        monitor.observe_update(step, {"policy_entropy": 2.0})
    assert np.isnan(monitor.entropy_ratio())
    signals = monitor.observe_update(10, {"policy_entropy": 2.0})
    assert signals["monitor/entropy_ratio"] == pytest.approx(1.0)
    assert signals["monitor/entropy_slope"] == pytest.approx(0.0, abs=1e-12)


def test_state_dict_round_trip_continues_identically():
    a = drive(collapsing, updates=30)
    b = CollapseMonitor()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for step in range(31, 61):
        metrics, probe = collapsing(step)
        for m in (a, b):
            m.observe_update(step, metrics)
            if step % 10 == 0:
                m.observe_probe(step, probe)
    assert json.dumps(a.history) == json.dumps(b.history) and a.fired_at == b.fired_at  # nan-safe


def test_bad_rule_and_probe_raise():
    with pytest.raises(ValueError, match="min_indicators"):
        MonitorRule(min_indicators=0)
    with pytest.raises(ValueError, match="at least one member"):
        CollapseMonitor().observe_probe(1, {})


def test_report_section_names_the_firing_update():
    text = report_section(drive(collapsing))
    assert "Fired at update" in text and "| 0 |" in text
    assert "Did not fire" in report_section(drive(healthy))


# ------------------------------------------------------------------------------------------ the loop hook
class Scripted:
    """A Trainer replaying a scripted run's metrics; ``probe`` gives its probe success."""

    policy = None
    training_simulator = None

    def __init__(self, run) -> None:
        self.run, self.update_count = run, 0

    def step(self) -> dict[str, float]:
        self.update_count += 1
        return dict(self.run(self.update_count)[0])

    def probe(self, step: int) -> dict[str, float]:
        return self.run(step)[1]

    def state_dict(self) -> dict:
        return {"update_count": self.update_count}

    def load_state_dict(self, state: dict) -> None:
        self.update_count = state["update_count"]


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_loop_logs_probes_and_the_warning_and_stops_on_stop(tmp_path):
    trainer = Scripted(collapsing)
    config = loop.LoopConfig(save_every=100, monitor=True, probe_every=10, on_collapse="stop", report_to="none")
    history = loop.run(trainer, 100, tmp_path, config=config, probe=trainer.probe)
    records = _records(tmp_path)
    warning = [r for r in records if r["kind"] == "collapse_warning"]
    assert len(warning) == 1 and warning[0]["action"] == "stop"
    assert len(history) == warning[0]["step"] < 100  # stopped at the warning, checkpointed there
    assert [r["step"] for r in records if r["kind"] == "probe"] == list(range(10, warning[0]["step"] + 1, 10))
    assert "monitor/entropy_ratio" in records[-3]


def test_loop_warn_runs_on_and_a_healthy_run_logs_no_warning(tmp_path):
    config = loop.LoopConfig(save_every=50, monitor=True, probe_every=10, report_to="none")
    collapsed = Scripted(collapsing)
    assert len(loop.run(collapsed, 100, tmp_path / "c", config=config, probe=collapsed.probe)) == 100
    assert any(r["kind"] == "collapse_warning" for r in _records(tmp_path / "c"))
    fine = Scripted(healthy)
    loop.run(fine, 100, tmp_path / "h", config=config, probe=fine.probe)
    assert not any(r["kind"] == "collapse_warning" for r in _records(tmp_path / "h"))


def test_loop_add_simulators_calls_grow_once(tmp_path):
    calls = []
    trainer = Scripted(collapsing)
    config = loop.LoopConfig(save_every=50, monitor=True, probe_every=10, on_collapse="add-simulators",
                             report_to="none")
    loop.run(trainer, 100, tmp_path, config=config, probe=trainer.probe,
             grow=lambda step, record: calls.append(step) or {"added": 2})
    assert len(calls) == 1
    assert [r["added"] for r in _records(tmp_path) if r["kind"] == "pool_growth"] == [2]


def test_resumed_monitor_fires_where_the_uninterrupted_one_does(tmp_path):
    config = loop.LoopConfig(save_every=10, monitor=True, probe_every=10, report_to="none")
    whole = Scripted(collapsing)
    loop.run(whole, 100, tmp_path / "whole", config=config, probe=whole.probe)
    part = Scripted(collapsing)
    loop.run(part, 30, tmp_path / "part", config=config, probe=part.probe)
    again = Scripted(collapsing)
    loop.run(again, 100, tmp_path / "part", config=config, probe=again.probe, resume=True)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "time"} for r in rs if r["kind"] != "train"]  # noqa: E731
    assert json.dumps(strip(_records(tmp_path / "part"))) == json.dumps(strip(_records(tmp_path / "whole")))


def test_loop_monitor_needs_a_probe_and_a_valid_action():
    with pytest.raises(ValueError, match="probe panel"):
        loop.run(Scripted(healthy), 1, None, config=loop.LoopConfig(monitor=True))
    with pytest.raises(ValueError, match="grow"):
        loop.run(Scripted(healthy), 1, None, config=loop.LoopConfig(monitor=True, on_collapse="add-simulators"),
                 probe=lambda step: {"a": 0.5})
    with pytest.raises(ValueError, match="on_collapse"):
        loop.LoopConfig(on_collapse="panic")


# ------------------------------------------------------------------------------------------ TRL
def test_trl_callback_feeds_the_monitor_and_stops_training():
    pytest.importorskip("transformers", reason="the TRL callback is a transformers TrainerCallback")
    from transformers import TrainerControl, TrainerState

    from simpop.train.trl_adapter import collapse_callback, monitor_metrics

    assert monitor_metrics({"reward": 0.5, "frac_reward_zero_std": 0.25, "entropy": 1.0, "loss": 3.0}) == {
        "success": 0.5, "zero_var_frac": 0.25, "policy_entropy": 1.0}
    callback = collapse_callback(lambda step: collapsing(step)[1], probe_every=10, on_collapse="stop")
    state, control = TrainerState(), TrainerControl()
    for step in range(1, 101):
        state.global_step = step
        metrics = collapsing(step)[0]
        logs = {"reward": metrics["success"], "frac_reward_zero_std": metrics["zero_var_frac"],
                "entropy": metrics["policy_entropy"]}
        callback.on_log(None, state, control, logs=logs)
        callback.on_step_end(None, state, control)
        if control.should_training_stop:
            break
    assert callback.monitor.fired and control.should_training_stop and state.global_step == callback.monitor.fired_at
    with pytest.raises(ValueError, match="grow"):
        collapse_callback(lambda step: {}, on_collapse="add-simulators")


# ------------------------------------------------------------------------------------------ simpop train flags
PROBE_YAML = """name: probe
members:
  probe-10: persuadee:heldout-10?temperature=1.1
  probe-11: persuadee:heldout-11?temperature=1.1
"""


def test_simpop_train_monitor_flags_probe_and_refuse_bad_setups(tmp_path, capsys):
    from simpop.cli import main

    probe = tmp_path / "probe.yaml"
    probe.write_text(PROBE_YAML)
    base = ["train", "grpo", "--env", "simpop/PersuasionAct-v0", "--updates", "4", "--no-progress", "--no-export",
            "--group-size", "2", "--scenarios-per-update", "2", "--env-arg", "max_turns=3", "--threads", "1"]
    assert main([*base, "--out", str(tmp_path / "run"), "--monitor", "--probe-panel", str(probe), "--probe-every", "2",
                 "--probe-episodes", "4", "--on-collapse", "add-simulators"]) == 0
    probes = [r for r in _records(tmp_path / "run") if r["kind"] == "probe"]
    assert [r["step"] for r in probes] == [2, 4] and set(probes[0]) >= {"probe/probe-10", "gap", "indicator/stall"}
    assert main([*base, "--out", str(tmp_path / "a"), "--monitor"]) == 2
    assert "--probe-panel" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "b"), "--monitor", "--probe-panel", "p4g-act-v1", "--panel",
                 "p4g-act-v1"]) == 2
    assert "must differ from --panel" in capsys.readouterr().err


def test_require_and_replay_reproduce_and_restrict_the_firing():
    from simpop.train.monitor import POST_HOC_REQUIRE, replay

    monitor = drive(collapsing)
    steps = list(range(10, 101, 10))
    assert replay(monitor.history, steps, MonitorRule()) == monitor.fired_at  # replay = the live rule
    gap_and_entropy = {**{f"indicator/{k}": 0 for k in ("gap", "zero_var", "entropy", "stall", "spread")},
                       "indicator/gap": 1, "indicator/entropy": 1}
    assert replay([gap_and_entropy] * 3, [10, 20, 30], MonitorRule()) == 20
    assert replay([gap_and_entropy] * 3, [10, 20, 30], MonitorRule(require=POST_HOC_REQUIRE)) is None
    with pytest.raises(ValueError, match="unknown indicators"):
        MonitorRule(require=("nope",))


def test_reply_diversity_reaches_the_probe_record_when_reported():
    monitor = CollapseMonitor()
    for step in range(1, 11):
        monitor.observe_update(step, {"success": 0.5, "reply_diversity": 0.2 if step <= 5 else 0.4})
    assert monitor.observe_probe(10, {"a": 0.5})["reply_diversity"] == pytest.approx(0.3)
    assert "reply_diversity" not in drive(healthy).history[0]
