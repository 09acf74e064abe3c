"""``simpop train grpo`` end to end at the act level: flags, YAML, run folder, resume, panel, errors."""

from __future__ import annotations

import json

import yaml

from simpop.cli import main
from simpop import checkpoint

ENV = ["--env", "simpop/PersuasionAct-v0", "--no-progress"]
SMALL = ["--group-size", "2", "--scenarios-per-update", "2", "--env-arg", "max_turns=4"]
PANEL = {"name": "p4g-heldout", "members": {"h0": "persuadee:heldout-0?temperature=0.8&personas=heldout-60-7",
                                            "h1": "persuadee:heldout-1?temperature=0.9&personas=heldout-60-7"}}


def _records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _steps(out) -> list[int]:
    return [r["step"] for r in _records(out)]


def _checkpoints(out) -> list[int]:
    return sorted(int(p.stem.split("_")[1]) for p in checkpoint.checkpoint_dir(out).glob("step_*.pt"))


def test_train_grpo_writes_run_folder_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    config = tmp_path / "grpo.yaml"
    config.write_text("group_size: 3\nscenarios_per_update: 2\nepochs: 3\nhidden_size: 16\n")  # flat fields

    def args(updates: str = "2", epochs: str = "2", env_args: tuple[str, ...] = ("--env-arg", "max_turns=4")):
        return ["train", "grpo", *ENV, "--updates", updates, "--out", str(out), "--config", str(config),
                "--epochs", epochs, *env_args]

    assert main(args()) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert list(saved) == ["grpo", "model", "loop", "rollout"]  # by section
    assert (saved["grpo"]["group_size"], saved["grpo"]["scenarios_per_update"], saved["grpo"]["epochs"]) == (3, 2, 2)
    assert saved["model"]["hidden_size"] == 16 and saved["grpo"]["algorithm"] == "grpo"  # flags win over YAML
    assert json.loads((out / "run.json").read_text()) == {"trainer": "grpo", "env": "simpop/PersuasionAct-v0",
                                                          "simulator": "native", "env_kwargs": {"max_turns": 4},
                                                          "panel": "", "eval_episodes": 32}
    assert _steps(out) == [1, 2] and {r["kind"] for r in _records(out)} == {"train"}
    assert (out / "checkpoints").is_dir() and (out / "tb").is_dir()
    assert "update 2/2" in capsys.readouterr().out

    assert main(args()) == 2  # the folder holds a run: refuse to overwrite it
    assert "pass --resume" in capsys.readouterr().err
    assert main(args("3", env_args=()) + ["--resume"]) == 2  # other env arguments than the saved run
    assert "different env/simulator" in capsys.readouterr().err
    assert main(args("3", epochs="4") + ["--resume"]) == 2  # a GRPOConfig field differs
    assert "grpo.epochs: 2 -> 4" in capsys.readouterr().err
    assert main(args("3") + ["--resume", "--hidden-size", "32"]) == 2  # a ModelConfig field differs
    assert "model.hidden_size: 16 -> 32" in capsys.readouterr().err
    assert main(args("3") + ["--resume", "--keep-checkpoints", "5"]) == 2  # a LoopConfig field differs
    assert "loop.keep_checkpoints: 3 -> 5" in capsys.readouterr().err
    assert _steps(out) == [1, 2]  # refused resumes leave the run alone
    assert main(args("4") + ["--resume"]) == 0
    assert _steps(out) == [1, 2, 3, 4] and "update 4/4" in capsys.readouterr().out
    assert main(args("4") + ["--resume"]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_train_grpo_sectioned_config_and_dapo(tmp_path, capsys):
    out = tmp_path / "dapo"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"grpo": {"algorithm": "dapo", "group_size": 3, "max_refill_rounds": 2},
                                      "model": {"hidden_size": 8},
                                      "loop": {"save_every": 2, "report_to": "none"}}))
    assert main(["train", "grpo", *ENV, *SMALL, "--updates", "3", "--out", str(out), "--config", str(config)]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["grpo"]["algorithm"], saved["grpo"]["group_size"], saved["grpo"]["max_refill_rounds"]) == \
        ("dapo", 2, 2)  # --group-size 2 wins over the YAML's 3
    assert saved["model"]["hidden_size"] == 8
    assert {k: saved["loop"][k] for k in ("save_every", "keep_checkpoints", "eval_every", "report_to")} == \
        {"save_every": 2, "keep_checkpoints": 3, "eval_every": 10, "report_to": "none"}  # YAML, then defaults
    records = _records(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all({"refill_rounds", "refill_shortfall", "collected_zero_var_frac"} <= set(r) for r in records)
    assert _checkpoints(out) == [2, 3] and not (out / "tb").exists()
    assert "update 3/3" in capsys.readouterr().out
    # the saved config.yaml reproduces the run's settings: resuming with it alone is accepted
    assert main(["train", "grpo", *ENV, "--env-arg", "max_turns=4", "--updates", "4", "--out", str(out),
                 "--config", str(out / "config.yaml"), "--resume"]) == 0
    assert _steps(out) == [1, 2, 3, 4]


def test_train_grpo_evaluates_a_heldout_panel(tmp_path, capsys):
    out = tmp_path / "panel"
    panel = tmp_path / "panel.yaml"
    panel.write_text(yaml.safe_dump(PANEL))
    assert main(["train", "grpo", *ENV, *SMALL, "--updates", "3", "--out", str(out), "--panel", str(panel),
                 "--eval-every", "2", "--eval-episodes", "8", "--save-every", "10"]) == 0
    assert "update 3/3" in capsys.readouterr().out
    records = _records(out)
    assert [(r["step"], r["kind"]) for r in records] == [(0, "eval"), (1, "train"), (2, "train"), (2, "eval"),
                                                          (3, "train"), (3, "eval")]
    for r in (r for r in records if r["kind"] == "eval"):
        assert 0 <= r["heldout_success"] <= 1 and 0 <= r["train_success"] <= 1
        assert r["heldout_success"] == (r["heldout/h0"] + r["heldout/h1"]) / 2  # same episodes per member
        assert r["collapse_gap"] == r["train_success"] - r["heldout_success"] and r["policy_entropy"] > 0
    assert _checkpoints(out) == [0, 2, 3]  # evaluation steps are checkpointed
    assert json.loads((out / "run.json").read_text())["panel"] == str(panel)


def test_train_grpo_rejects_bad_settings(tmp_path, capsys):
    def run(*extra: str) -> int:
        return main(["train", "grpo", *ENV, "--updates", "1", "--out", str(tmp_path / "x"), *extra])

    assert run("--clip-eps", "2") == 2
    assert "clip_eps must be in (0, 1)" in capsys.readouterr().err
    assert run("--algorithm", "ppo") == 2
    assert "algorithm must be one of grpo, dr_grpo, dapo, reinforce_pp" in capsys.readouterr().err
    assert run("--env-arg", "oops") == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    (tmp_path / "flat.yaml").write_text("group_size: 3\nstepz: 1\n")
    assert run("--config", str(tmp_path / "flat.yaml")) == 2
    assert "unknown field 'stepz'" in capsys.readouterr().err
    (tmp_path / "sections.yaml").write_text("grpo: {group_size: 3, stepz: 1}\nmodel: {}\n")
    assert run("--config", str(tmp_path / "sections.yaml")) == 2
    assert "unknown grpo fields ['stepz']" in capsys.readouterr().err
    assert run("--panel", str(tmp_path / "missing.yaml")) == 2
    assert "missing.yaml" in capsys.readouterr().err
    (tmp_path / "overlap.yaml").write_text(yaml.safe_dump({"members": {"same": "persuadee"}}))
    assert run("--panel", str(tmp_path / "overlap.yaml")) == 2  # the training simulator is not held out
    assert "'same' is also a training simulator ('native')" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
