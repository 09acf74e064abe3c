"""Co-training behind the OpenEnv server: simulators learn from hosted episodes, versions, checkpoints, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("openenv", reason="the OpenEnv server needs pip install simpop[openenv]")

import simpop.envs  # noqa: E402,F401
from simpop.cli import main  # noqa: E402
from simpop.integrations.openenv_client import SimpopEnvClient  # noqa: E402
from simpop.integrations.openenv_cotrain import ServerCoTrainer  # noqa: E402
from simpop.integrations.openenv_server import UserSeatSource, make_server  # noqa: E402
from simpop.train.cotrain import CoTrainConfig  # noqa: E402

ACT = "simpop/PersuasionAct-v0"
POPULATION = ["trainable:persuadee", "trainable:persuadee?temperature=0.8"]


def play(url: str, episodes: int, seed: int = 0) -> list:
    """Episodes of uniformly random acts; the reset result of each."""
    rng, resets = np.random.default_rng(seed), []
    with SimpopEnvClient(base_url=url).sync() as env:
        for episode in range(episodes):
            result = env.reset(seed=seed * 1000 + episode)
            resets.append(result)
            while not result.done:
                result = env.step(int(rng.integers(14)))
    return resets


def test_server_cotrains_a_population_versions_it_and_resumes(tmp_path):
    source = UserSeatSource(ACT, POPULATION)
    cotrainer = ServerCoTrainer(source, CoTrainConfig(sim_lr=0.05), episodes_per_update=6, run_dir=tmp_path)
    base = {name: m.theta.detach().clone() for name, m in cotrainer.masters.items()}
    with make_server(source, port=0, environment=cotrainer.environment).start() as server:
        resets = play(server.url, 60)
        cotrainer.wait()
        settled = dict(cotrainer.versions)
        later = play(server.url, 2, seed=1)
    cotrainer.close()

    assert set(cotrainer.versions) == set(POPULATION) and all(v >= 1 for v in cotrainer.versions.values())
    for name, master in cotrainer.masters.items():  # the simulators moved away from their base
        assert float((master.theta - base[name]).abs().max()) > 1e-3
        assert torch.equal(cotrainer.published[name]["theta"], master.theta.detach())
    seen = [r.metadata["simulator_versions"] for r in resets]
    assert seen[0] == dict.fromkeys(POPULATION, 0) and seen == sorted(seen, key=lambda v: sum(v.values()))
    assert later[0].metadata["simulator_versions"] == settled  # a reset loads the newest weights
    updates = sum(cotrainer.versions.values())
    assert len(cotrainer.history) == updates and all(h["episodes"] == 6 for h in cotrainer.history)
    assert {"sim_loss", "sim_kl", "sim_success", "sim_objective"} <= set(cotrainer.history[-1])
    played = sum(h["episodes"] for h in cotrainer.history) + cotrainer.stale
    assert played + sum(map(len, cotrainer.queues.values())) == 62  # every episode used, queued or counted stale

    resumed = ServerCoTrainer(source, episodes_per_update=6, run_dir=tmp_path, resume=True)
    assert resumed.versions == cotrainer.versions and resumed.history == cotrainer.history
    for name, master in resumed.masters.items():
        assert torch.equal(master.theta.detach(), cotrainer.masters[name].theta.detach())
    resumed.close()


def test_cotraining_refuses_what_it_cannot_train():
    with pytest.raises(ValueError, match="not trainable: persuadee"):
        ServerCoTrainer(UserSeatSource(ACT, ["persuadee"]))
    with pytest.raises(ValueError, match="a panel is for evaluation"):
        ServerCoTrainer(UserSeatSource(ACT, panel="p4g-act-v1"))
    with pytest.raises(ValueError, match="episodes_per_update must be >= 2"):
        ServerCoTrainer(UserSeatSource(ACT, ["trainable:persuadee"]), episodes_per_update=1)


@pytest.mark.parametrize("argv, message", [
    (["--simulator", "persuadee", "--cotrain"], "not trainable: persuadee"),
    (["--simulator", "trainable:persuadee", "--resume"], "--resume and --cotrain-dir apply to --cotrain"),
    (["--simulator", "trainable:persuadee", "--cotrain", "--cotrain-objective", "nope"], "objective must be one of"),
])
def test_cotrain_cli_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["openenv", "serve", "--env", ACT, "--port", "0", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_heldout_example_reports_both_conditions(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "openenv_cotrain_heldout.py"
    spec = importlib.util.spec_from_file_location("openenv_cotrain_heldout", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--seeds", "1", "--train-episodes", "24", "--eval-episodes", "9",
                           "--episodes-per-update", "4"])
    frozen, cotrained = result["rows"]
    assert (frozen["cotrain"], cotrained["cotrain"]) == (False, True)
    assert frozen["simulator_moved"] == 0.0 and frozen["simulator_versions"] == {}  # no co-training: no versions
    assert cotrained["simulator_moved"] > 0 and cotrained["simulator_versions"]["trainable:persuadee"] >= 1
    assert set(cotrained["heldout_per_member"]) == {"heldout-0-T0.8", "heldout-1-T0.9", "heldout-2-T1.2"}
    assert result["summary"]["verdict"] == "no detectable difference at this size"  # one seed: no standard error


def test_persona_objective_trains_the_persona_sampler_the_sessions_draw_from():
    source = UserSeatSource(ACT, ["trainable:persuadee"])
    cotrainer = ServerCoTrainer(source, CoTrainConfig(objective="persona", sim_lr=0.5), episodes_per_update=6)
    master = cotrainer.masters["trainable:persuadee"]
    theta = master.theta.detach().clone()
    with make_server(source, port=0, environment=cotrainer.environment).start() as server:
        play(server.url, 30)
    cotrainer.close()
    assert cotrainer.versions["trainable:persuadee"] >= 1
    assert float(master.persona_logits.detach().abs().max()) > 0  # the sampler moved ...
    assert torch.equal(master.theta.detach(), theta)  # ... and the reply model did not


def test_server_cotrains_a_lora_simulator_and_resumes_it(tmp_path):
    """A LoRA (text) simulator behind the server: hosted episodes give it a gradient, its adapter moves, the
    version in metadata rises, and a resumed co-trainer holds the same adapter. Seeds 1 and 2 of this setting
    give successes (0, 1) on one and on two torch threads: mean 0.5, not the target 0.25, so the objective's
    advantages 2 (τ - p̄)(s - p̄) are not all zero (with p̄ = τ, or one outcome for all, the gradient is zero by
    design)."""
    source = UserSeatSource("simpop/Persuasion-v1", ["trainable:smollm2?max_new_tokens=8"], env_kwargs={"max_turns": 1})
    config = CoTrainConfig(sim_lr=1e-3, target_success=0.25)
    cotrainer = ServerCoTrainer(source, config, episodes_per_update=2, run_dir=tmp_path)
    (name, master), = cotrainer.masters.items()
    base = {k: v.detach().clone() for k, v in master.state_dict().items()}
    successes, versions = [], []
    with make_server(source, port=0, environment=cotrainer.environment).start() as server, \
            SimpopEnvClient(base_url=server.url).sync() as env:
        for seed in (1, 2):
            result = env.reset(seed=seed)
            versions.append(result.metadata["simulator_versions"][name])
            while not result.done:
                result = env.step("Imagine a hungry child. Would you like to donate to Save the Children?")
            successes.append(float(result.reward > 0))
        cotrainer.wait()
        versions.append(env.reset(seed=3).metadata["simulator_versions"][name])
    cotrainer.close()

    assert 0 < np.mean(successes) < 1 and np.mean(successes) != config.target_success, successes  # a signal
    assert versions == [0, 0, 1] and cotrainer.versions == {name: 1}
    (update,) = cotrainer.history
    assert update["sim_grad_norm"] > 0 and update["episodes"] == 2
    moved = {k: float((v - base[k]).abs().max()) for k, v in master.state_dict().items()}
    assert max(moved.values()) > 1e-4  # the adapter moved (LoRA B first: A's gradient is 0 while B is 0)
    assert all(torch.equal(cotrainer.published[name][k], v) for k, v in master.state_dict().items())

    resumed = ServerCoTrainer(source, config, episodes_per_update=2, run_dir=tmp_path, resume=True)
    assert resumed.versions == {name: 1} and resumed.history == cotrainer.history
    assert all(torch.equal(resumed.masters[name].state_dict()[k], v) for k, v in master.state_dict().items())
    resumed.close()
