"""``simpop train grpo`` end to end at the act level: flags, YAML, run folder, resume, errors."""

from __future__ import annotations

import json

import yaml

from simpop.cli import main

ENV = ["--env", "simpop/PersuasionAct-v0", "--no-progress"]


def _steps(out) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_train_grpo_writes_run_folder_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    config = tmp_path / "grpo.yaml"
    config.write_text("group_size: 3\nscenarios_per_update: 2\nepochs: 3\n")
    def args(updates: str = "2", epochs: str = "2", env_args: tuple[str, ...] = ("--env-arg", "max_turns=4")):
        return ["train", "grpo", *ENV, "--updates", updates, "--out", str(out), "--config", str(config),
                "--epochs", epochs, *env_args]

    assert main(args()) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert (saved["group_size"], saved["scenarios_per_update"], saved["epochs"]) == (3, 2, 2)  # flags win
    assert json.loads((out / "run.json").read_text())["env_kwargs"] == {"max_turns": 4}
    assert _steps(out) == [1, 2] and (out / "checkpoints").is_dir() and (out / "tb").is_dir()
    assert "update 2/2" in capsys.readouterr().out

    assert main(args()) == 2  # the folder holds a run: refuse to overwrite it
    assert "pass --resume" in capsys.readouterr().err
    assert main(args("3", env_args=()) + ["--resume"]) == 2  # other env arguments than the saved run
    assert "different env/simulator" in capsys.readouterr().err
    assert main(args("3", epochs="4") + ["--resume"]) == 2
    assert "epochs: 2 -> 4" in capsys.readouterr().err
    assert main(args("4") + ["--resume"]) == 0
    assert _steps(out) == [1, 2, 3, 4]


def test_train_grpo_rejects_bad_settings(tmp_path, capsys):
    assert main(["train", "grpo", *ENV, "--updates", "1", "--out", str(tmp_path / "x"), "--clip-eps", "2"]) == 2
    assert "clip_eps must be in (0, 1)" in capsys.readouterr().err
    assert main(["train", "grpo", *ENV, "--updates", "1", "--out", str(tmp_path / "x"), "--env-arg", "oops"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
