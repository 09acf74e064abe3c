"""``simpop train`` exports the final policy to OUT/final, records the resolved panel, and survives failures."""

from __future__ import annotations

import json

import numpy as np
import torch
import yaml

from simpop.agents.export import load_exported, read_manifest
from simpop.agents.policy import ActPolicy
from simpop.cli import main
from simpop import checkpoint
from simpop.files import RUN_LOCK

ENV = ["--env", "simpop/PersuasionAct-v0", "--no-progress", "--threads", "1"]
SMALL = ["--group-size", "2", "--scenarios-per-update", "2", "--env-arg", "max_turns=4", "--hidden-size", "8"]
PPO = ["--n-envs", "2", "--n-steps", "8", "--minibatch-size", "8", "--epochs", "1", "--env-arg", "max_turns=4"]
PANEL = {"members": {"h0": "persuadee:heldout-0?temperature=0.8&personas=heldout-60-7"}}


def _final_checkpoint(out) -> dict:
    return checkpoint.load(checkpoint.latest(out), restore_rng=False)[1]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_grpo_exports_the_final_policy_and_reexports_on_resume(tmp_path, capsys):
    out = tmp_path / "run"

    def args(updates: str, *extra: str) -> list[str]:
        return ["train", "grpo", *ENV, *SMALL, "--updates", updates, "--out", str(out), *extra]

    assert main(args("2")) == 0
    printed = capsys.readouterr().out
    final = out / "final"
    assert f"exported the final policy (update 2) to {final.absolute()}: act-level MLP" in printed
    manifest = read_manifest(final)
    assert (manifest["kind"], manifest["step"], manifest["trainer"], manifest["env"]) == (
        "act-mlp", 2, "grpo", "simpop/PersuasionAct-v0")
    policy = load_exported(final)
    assert isinstance(policy, ActPolicy) and policy.net[0].out_features == 8
    assert _same(policy.state_dict(), _final_checkpoint(out)["policy"])  # the trained weights, not the initial ones
    assert not _same(policy.state_dict(), ActPolicy(policy.obs_dim, policy.n_actions, 8, seed=0).state_dict())

    stamp = (final / "policy.pt").stat().st_mtime_ns
    assert main(args("2", "--resume")) == 0  # nothing to do: the export is already there
    assert "nothing to do" in capsys.readouterr().out and (final / "policy.pt").stat().st_mtime_ns == stamp
    assert main(args("3", "--resume")) == 0  # one more update: the export follows it
    assert "exported the final policy (update 3)" in capsys.readouterr().out
    assert read_manifest(final)["step"] == 3 and _same(load_exported(final).state_dict(),
                                                       _final_checkpoint(out)["policy"])
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [RUN_LOCK]  # no temporary folders left


def test_no_export_and_a_failed_export(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    args = ["train", "grpo", *ENV, *SMALL, "--updates", "1", "--out", str(out)]
    assert main([*args, "--no-export"]) == 0
    assert not (out / "final").exists() and "exported" not in capsys.readouterr().out

    other = tmp_path / "other"
    import simpop.agents.export as export

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(export, "export_policy", broken)
    assert main(["train", "grpo", *ENV, *SMALL, "--updates", "1", "--out", str(other)]) == 1
    err = capsys.readouterr().err
    assert "exporting the final policy" in err and "disk full" in err and "with --resume to export again" in err
    assert checkpoint.latest(other) is not None and not (other / "final").exists()  # the run is kept
    monkeypatch.undo()
    assert main(["train", "grpo", *ENV, *SMALL, "--updates", "1", "--out", str(other), "--resume"]) == 0
    assert "nothing to do" in (printed := capsys.readouterr().out) and "exported the final policy (update 1)" in printed
    assert read_manifest(other / "final")["step"] == 1


def test_ppo_exports_its_actor_critic(tmp_path, capsys):
    from simpop.train.ppo import ActorCritic

    out = tmp_path / "ppo"
    assert main(["train", "ppo", *ENV, *PPO, "--updates", "2", "--out", str(out), "--hidden-size", "16"]) == 0
    assert "ActorCritic (policy.pt, not an HF model)" in capsys.readouterr().out
    manifest = read_manifest(out / "final")
    assert (manifest["kind"], manifest["class"], manifest["init_args"]["hidden_size"]) == (
        "torch-module", "simpop.train.ppo:ActorCritic", 16)
    model = load_exported(out / "final")
    assert isinstance(model, ActorCritic) and _same(model.state_dict(), _final_checkpoint(out)["model"])
    obs = np.zeros((3, manifest["init_args"]["obs_dim"]), dtype=np.float32)
    model.reset_batch([None] * 3, [np.random.default_rng(0)] * 3)
    assert len(model.act_batch(list(obs), [0, 1, 2])) == 3


def test_run_json_records_the_resolved_panel_and_eval_episodes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "panel.yaml").write_text(yaml.safe_dump(PANEL))
    out = tmp_path / "run"

    def args(*extra: str) -> list[str]:
        return ["train", "grpo", *ENV, *SMALL, "--updates", "1", "--out", str(out), "--eval-every", "5", *extra]

    assert main(args("--panel", "panel.yaml", "--eval-episodes", "2")) == 0  # a relative path
    info = json.loads((out / "run.json").read_text())
    assert (info["panel"], info["eval_episodes"]) == (str((tmp_path / "panel.yaml").resolve()), 2)
    capsys.readouterr()
    assert main(args("--panel", "panel.yaml", "--eval-episodes", "3", "--resume")) == 2
    assert "different env/simulator/panel" in capsys.readouterr().err
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(PANEL))
    assert main(args("--panel", str(other), "--eval-episodes", "2", "--resume")) == 2  # same content, other file
    assert "different env/simulator/panel" in capsys.readouterr().err
    assert main(args("--panel", str(tmp_path / "panel.yaml"), "--eval-episodes", "2", "--resume")) == 0

    # a run.json written before eval_episodes existed stored --panel as typed: it still resumes
    old = {k: v for k, v in info.items() if k != "eval_episodes"} | {"panel": "panel.yaml"}
    (out / "run.json").write_text(json.dumps(old))
    assert main(args("--panel", "panel.yaml", "--eval-episodes", "2", "--resume")) == 0


def test_named_panels_train_and_are_checked_against_the_env(tmp_path, capsys):
    out = tmp_path / "named"
    assert main(["train", "grpo", *ENV, *SMALL, "--updates", "1", "--out", str(out), "--panel", "p4g-act-v1",
                 "--eval-every", "1", "--eval-episodes", "2", "--no-export"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals and {"heldout/heldout-0-T0.8", "heldout/heldout-1-T0.9", "heldout/heldout-2-T1.2"} <= set(evals[0])
    assert json.loads((out / "run.json").read_text())["panel"] == "p4g-act-v1"
    capsys.readouterr()
    assert main(["train", "grpo", *ENV, "--updates", "1", "--out", str(tmp_path / "x"), "--panel", "tau2-mock-v1"]) == 2
    assert "'tau2-mock-v1' is for simpop/Tau2-mock-v0, not simpop/PersuasionAct-v0" in capsys.readouterr().err
    assert main(["train", "grpo", *ENV, "--updates", "1", "--out", str(tmp_path / "x"), "--panel", "p4g-act-v7"]) == 2
    err = capsys.readouterr().err
    assert "no such file, and not a named panel (cooperbench-mini-v1, " in err and " p4g-act-v1, " in err
    assert not (tmp_path / "x").exists()


def test_text_lora_run_exports_a_merged_hf_model(tmp_path, capsys, tiny_model):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "text"
    assert main(["train", "grpo", "--env", "simpop/Persuasion-v0", "--no-progress", "--model", str(tiny_model),
                 "--simulator", f"frozen:transformers:{tiny_model}",
                 "--updates", "1", "--out", str(out), "--env-arg", "max_turns=2", "--max-new-tokens", "8",
                 "--group-size", "2", "--scenarios-per-update", "1", "--lora", "--lora-r", "4"]) == 0
    assert "HF model (LoRA merged)" in capsys.readouterr().out
    manifest = read_manifest(out / "final")
    assert (manifest["kind"], manifest["adapter"], manifest["step"]) == ("merged", "policy", 1)
    model = AutoModelForCausalLM.from_pretrained(out / "final")
    assert not any("lora" in name for name, _ in model.named_parameters())
