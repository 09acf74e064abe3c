"""``simpop train cotrain`` and ``simpop train ppo`` end to end at the act level (tiny budgets)."""

from __future__ import annotations

import json

import yaml

from simpop.cli import main

ENV = ["--env", "simpop/PersuasionAct-v0", "--no-progress", "--threads", "1"]
COTRAIN = ["--group-size", "2", "--scenarios-per-update", "2", "--env-arg", "max_turns=4"]
PPO = ["--n-envs", "2", "--n-steps", "8", "--minibatch-size", "8", "--epochs", "1", "--env-arg", "max_turns=4"]


def _records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _mark_first_record(out) -> None:
    """Tag step 1's line: a resumed run keeps it (it precedes the checkpoint), a restarted one would not."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), "marker": 1})
    (out / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))


def test_train_cotrain_population_writes_both_configs_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    config = tmp_path / "cotrain.yaml"
    config.write_text(yaml.safe_dump({"cotrain": {"population_size": 2, "pool_size": 2, "pool_sample_prob": 0.25,
                                                  "sim_lr": 0.1},
                                      "grpo": {"group_size": 3}}))

    def args(updates: str, sim_lr: str = "0.2") -> list[str]:
        return ["train", "cotrain", *ENV, *COTRAIN, "--simulator", "trainable:persuadee", "--updates", updates,
                "--out", str(out), "--config", str(config), "--sim-lr", sim_lr, "--snapshot-every", "1"]

    assert main(args("2")) == 0
    assert "update 2/2" in capsys.readouterr().out
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert list(saved) == ["grpo", "cotrain", "model", "loop"]
    assert (saved["cotrain"]["population_size"], saved["cotrain"]["sim_lr"]) == (2, 0.2)  # YAML, then the flag wins
    assert saved["cotrain"]["snapshot_every"] == 1 and saved["grpo"]["group_size"] == 2
    assert json.loads((out / "run.json").read_text())["simulator"] == "trainable:persuadee"
    records = _records(out)
    assert [r["step"] for r in records] == [1, 2]
    assert {"reward_mean", "success", "loss", "sim_loss", "sim_kl", "sim_success", "pool_size"} <= set(records[0])
    assert records[0]["pool_size"] == 2  # the two base snapshots, then one per simulator per update (capacity 2)

    assert main(args("3", sim_lr="0.3") + ["--resume"]) == 2  # a CoTrainConfig field differs from the saved run
    assert "cotrain.sim_lr: 0.2 -> 0.3" in capsys.readouterr().err
    _mark_first_record(out)
    assert main(args("4") + ["--resume"]) == 0
    assert "update 4/4" in capsys.readouterr().out
    records = _records(out)
    assert [r["step"] for r in records] == [1, 2, 3, 4] and records[0]["marker"] == 1
    assert main(args("4") + ["--resume"]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_train_cotrain_default_simulator_dapo_and_panel(tmp_path, capsys):
    out = tmp_path / "co"
    panel = tmp_path / "panel.yaml"
    panel.write_text(yaml.safe_dump({"members": {"h0": "persuadee:heldout-0?temperature=0.8&personas=heldout-60-7"}}))
    assert main(["train", "cotrain", *ENV, *COTRAIN, "--algorithm", "dapo", "--updates", "2", "--out", str(out),
                 "--panel", str(panel), "--eval-every", "1", "--eval-episodes", "8"]) == 0
    assert "update 2/2" in capsys.readouterr().out
    assert json.loads((out / "run.json").read_text())["simulator"] == "trainable:persuadee"  # cotrain's default
    records = _records(out)
    assert [(r["step"], r["kind"]) for r in records] == [(0, "eval"), (1, "train"), (1, "eval"), (2, "train"),
                                                          (2, "eval")]
    train = [r for r in records if r["kind"] == "train"]
    assert all({"sim_loss", "sim_success", "refill_rounds", "refill_shortfall"} <= set(r) for r in train)
    assert all(0 <= r["heldout_success"] <= 1 and "heldout/h0" in r and "train_success" in r
               for r in records if r["kind"] == "eval")


def test_train_cotrain_rejects_bad_settings(tmp_path, capsys):
    def run(*extra: str, env: str = "simpop/PersuasionAct-v0") -> int:
        return main(["train", "cotrain", "--env", env, "--updates", "1", "--out", str(tmp_path / "x"), *extra])

    assert run("--target-success", "1.5") == 2
    assert "target_success must be in (0, 1)" in capsys.readouterr().err
    assert run("--group-size", "1") == 2
    assert "group_size must be >= 2" in capsys.readouterr().err
    for frozen in ("native", "persuadee?temperature=0.8"):  # act level: a frozen persuadee has nothing to train
        assert run("--simulator", frozen) == 2
        assert "trainable:persuadee on simpop/PersuasionAct-v0" in capsys.readouterr().err
    assert run("--simulator", "trainable:persuadee", "--simulator", "trainable:persuadee") == 2
    assert "cotrain takes one --simulator spec" in capsys.readouterr().err
    assert run(env="simpop/Persuasion-v0") == 2  # text level: the (act-level) default persuadee does not fit
    assert "trainable:MODEL?temperature=1.0" in capsys.readouterr().err
    assert run("--simulator", "trainable:smollm2?temperature=0", env="simpop/Persuasion-v0") == 2  # greedy: untrainable
    assert "trainable:smollm2?temperature=1.0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_train_ppo_writes_metrics_and_resumes(tmp_path, capsys):
    out = tmp_path / "ppo"

    def args(updates: str) -> list[str]:
        return ["train", "ppo", *ENV, *PPO, "--updates", updates, "--out", str(out)]

    assert main(args("2")) == 0
    assert "update 2/2" in capsys.readouterr().out
    records = _records(out)
    assert [r["step"] for r in records] == [1, 2]
    assert {"loss", "policy_loss", "value_loss", "entropy", "clip_frac", "episode_return"} <= set(records[0])
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert list(saved) == ["ppo", "loop"] and saved["ppo"]["n_steps"] == 8
    assert json.loads((out / "run.json").read_text())["trainer"] == "ppo"
    assert main(args("3") + ["--resume", "--n-steps", "16"]) == 2
    assert "ppo.n_steps: 8 -> 16" in capsys.readouterr().err
    _mark_first_record(out)
    assert main(args("3") + ["--resume"]) == 0
    records = _records(out)
    assert [r["step"] for r in records] == [1, 2, 3] and records[0]["marker"] == 1


def test_train_ppo_evaluates_a_heldout_panel(tmp_path, capsys):
    out = tmp_path / "ppo-panel"
    panel = tmp_path / "panel.yaml"
    panel.write_text(yaml.safe_dump({"members": {"h0": "persuadee:heldout-0?temperature=0.8&personas=heldout-60-7"}}))
    assert main(["train", "ppo", *ENV, *PPO, "--updates", "2", "--out", str(out), "--panel", str(panel),
                 "--eval-episodes", "4"]) == 0
    assert "update 2/2" in capsys.readouterr().out
    records = _records(out)
    assert [(r["step"], r["kind"]) for r in records] == [(0, "eval"), (1, "train"), (2, "train"), (2, "eval")]
    assert all(0 <= r["heldout_success"] <= 1 for r in records if r["kind"] == "eval")


def test_train_ppo_rejects_bad_settings(tmp_path, capsys):
    def run(*extra: str, env: str = "simpop/PersuasionAct-v0") -> int:
        return main(["train", "ppo", "--env", env, "--updates", "1", "--out", str(tmp_path / "x"), *extra])

    assert run("--clip-eps", "1.5") == 2
    assert "clip_eps must be in (0, 1)" in capsys.readouterr().err
    assert run(env="simpop/Persuasion-v0") == 2
    assert "text envs: use GRPO" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
