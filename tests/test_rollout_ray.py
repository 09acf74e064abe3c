"""Ray rollout workers: the same trajectories and GRPO updates as the local engine, fallbacks, refusals, CLI."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import simpop
from simpop.agents.policy import ActPolicy
from simpop.rollout import Job, RolloutEngine, plan_waves
from simpop.simulators.registry import build_simulator
from simpop.seat import Player

ENV = "simpop/PersuasionAct-v0"
#: A population: each dialogue's member is drawn with its own generator, so it must match across workers too.
SPEC = ["persuadee?temperature=1.0", "persuadee:heldout-1?temperature=0.8"]


def _ray_engine(policy, n_envs=8, workers=2, spec=SPEC, **kwargs):
    from simpop.rollout_ray import RayConfig, RayRolloutEngine

    env = simpop.make(ENV, max_turns=6)
    return RayRolloutEngine(ENV, policy, build_simulator(spec, env), n_envs, {"max_turns": 6},
                            config=RayConfig(ray=True, ray_workers=workers, ray_worker_cpus=0.5),
                            simulator_spec=spec, **kwargs)


def _local_engine(policy, n_envs=8):
    env = simpop.make(ENV, max_turns=6)
    return RolloutEngine(ENV, policy, build_simulator(SPEC, env), n_envs, {"max_turns": 6})


def _key(trajectories):
    return [(t.scenario_id, t.group, t.seed, t.simulator, t.actions, t.rewards, t.total_reward, t.success,
             t.terminated, t.truncated) for t in trajectories]


def test_plan_waves_gives_each_of_several_waves_its_own_generator():
    jobs = [Job("s", g, g) for g in range(5)]
    rng = np.random.default_rng(3)
    (single, own), = plan_waves(jobs, rng, 8)
    assert single == jobs and own is rng  # one wave: the run's generator, as before waves existed
    waves = plan_waves(jobs, np.random.default_rng(3), 2)
    assert [len(w) for w, _ in waves] == [2, 2, 1]
    draws = [r.random() for _, r in waves]
    assert len(set(draws)) == 3 and draws == [r.random() for _, r in plan_waves(jobs, np.random.default_rng(3), 2)]


def test_act_level_trajectories_through_two_workers_equal_the_local_engine(ray_cluster):
    policy = ActPolicy.for_env(simpop.make(ENV), seed=4)
    local = _local_engine(policy).collect(6, group_size=4, seed=11)  # 24 dialogues: waves of 8, 8, 8
    engine = _ray_engine(policy)
    remote = engine.collect(6, group_size=4, seed=11)
    assert _key(remote) == _key(local)
    assert all(np.array_equal(np.asarray(a.observations[s]), np.asarray(b.observations[s]))
               for a, b in zip(remote, local) for s in (a.policy_seat, a.user_seat))
    assert len({t.simulator for t in remote}) == 2  # both population members played
    assert engine.stats.dialogues == 24 and engine.stats.policy_calls > 0 and engine.stats.env_steps > 0
    # New weights travel to the workers at every run: a changed policy changes the remote rollouts like the local.
    with torch.no_grad():
        policy.net[-1].bias[3] += 4.0
    assert _key(engine.collect(6, group_size=4, seed=11)) == _key(_local_engine(policy).collect(6, group_size=4,
                                                                                                  seed=11))
    # n_envs=None: one wave per worker, the local engine's result with waves of ceil(24 / 2).
    assert _key(_ray_engine(policy, n_envs=None).collect(6, group_size=4, seed=2)) == \
        _key(_local_engine(policy, n_envs=12).collect(6, group_size=4, seed=2))
    engine.close()


def test_grpo_updates_through_ray_give_the_local_metrics(ray_cluster, tmp_path, monkeypatch):
    from simpop.cli import main
    from simpop.rollout_ray import RayRolloutEngine

    ray_runs = []
    run = RayRolloutEngine.run
    monkeypatch.setattr(RayRolloutEngine, "run", lambda self, *a: ray_runs.append(len(a[0])) or run(self, *a))
    runs = {}
    for name, flags in (("local", []), ("ray", ["--ray", "--ray-workers", "2", "--ray-worker-cpus", "0.5"])):
        out = tmp_path / name
        assert main(["train", "grpo", "--env", ENV, "--no-progress", "--no-export", "--updates", "2", "--out", str(out),
                     "--group-size", "4", "--scenarios-per-update", "4", "--n-envs", "4", "--env-arg", "max_turns=6",
                     "--simulator", SPEC[0], "--simulator", SPEC[1], "--seed", "5", *flags]) == 0
        runs[name] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timing = {"rollout_s", "update_s", "steps_per_s", "time", "wall_s", "elapsed_s"}
    for local, remote in zip(runs["local"], runs["ray"], strict=True):
        same = {k: v for k, v in local.items() if k not in timing and not k.endswith("_s")}
        assert same and {k: remote[k] for k in same} == same
    assert runs["ray"][-1]["step"] == 2 and ray_runs == [16, 16]  # --ray rolled out both updates in the workers


def test_a_failed_worker_falls_back_to_the_driver_with_the_same_result(ray_cluster):
    policy = ActPolicy.for_env(simpop.make(ENV), seed=1)
    engine = _ray_engine(policy, n_envs=4)
    first = engine.collect(4, group_size=4, seed=3)
    ray_cluster.kill(engine._workers[1])  # the worker dies between updates
    again = engine.collect(4, group_size=4, seed=3)
    assert engine.fallbacks == {"ray_fallback_waves": 2} and _key(again) == _key(first)
    assert _key(engine.collect(4, group_size=4, seed=3)) == _key(first)  # the replacement worker serves again
    assert engine.fallbacks == {"ray_fallback_waves": 2}
    engine.close()


def test_a_simulator_set_without_spec_travels_pickled_and_trainable_ones_are_refused(ray_cluster):
    policy = ActPolicy.for_env(simpop.make(ENV), seed=2)
    engine = _ray_engine(policy, n_envs=4)
    env = simpop.make(ENV, max_turns=6)
    engine.simulator = build_simulator("persuadee:heldout-2?temperature=0.9", env)  # e.g. a co-trainer's swap
    local = RolloutEngine(ENV, policy, build_simulator("persuadee:heldout-2?temperature=0.9", env), 4,
                          {"max_turns": 6})
    assert _key(engine.collect(2, group_size=4, seed=9)) == _key(local.collect(2, group_size=4, seed=9))
    engine.simulator = build_simulator("trainable:persuadee", env)
    with pytest.raises(ValueError, match="trainable"):
        engine.collect(2, group_size=4, seed=9)
    engine.close()


def test_policies_over_in_process_models_are_refused(ray_cluster):
    from simpop.rollout_ray import RayConfig, RayRolloutEngine

    class InProcess(Player):  # the shape of LLMPolicy: a backend holding a language model (6.4 M parameters here)
        def __init__(self):
            self.backend = SimpleNamespace(model=torch.nn.Embedding(40_000, 160))

        def act_batch(self, observations, slots):
            return [0] * len(observations)

    with pytest.raises(ValueError, match="in-process language model"):
        RayRolloutEngine(ENV, InProcess(), build_simulator("native", simpop.make(ENV)), config=RayConfig(ray=True))
    engine = _ray_engine(ActPolicy.for_env(simpop.make(ENV)), n_envs=4)  # an act-level MLP is not one
    engine.simulator = SimpleNamespace(name="llm", backend=SimpleNamespace(model=torch.nn.Embedding(40_000, 160)))
    with pytest.raises(ValueError, match="in-process language model"):
        engine.collect(1, group_size=2, seed=0)
    engine.close()


def test_ray_config_validates():
    from simpop.rollout_ray import RayConfig

    for bad in ({"ray_workers": 0}, {"ray_worker_cpus": 0}, {"ray_address": " "}):
        with pytest.raises(ValueError, match="RayConfig"):
            RayConfig(**bad)


def test_simpop_eval_through_ray_writes_the_local_records(ray_cluster, tmp_path, monkeypatch):
    from simpop.cli import main
    from simpop.evaluation.eval_records import EPISODES
    from simpop.rollout_ray import RayRolloutEngine

    waves = []
    run_waves = RayRolloutEngine.run_waves
    monkeypatch.setattr(RayRolloutEngine, "run_waves", lambda self, w: waves.append(len(w)) or run_waves(self, w))

    common = ["eval", "--env", ENV, "--env-arg", "max_turns=6", "--no-progress", "--policy", "reference",
              "--panel", "p4g-act-v1", "--episodes", "12", "--concurrency", "4"]  # 3 chunks: 2 side by side, then 1
    assert main([*common, "--out", str(tmp_path / "local")]) == 0
    assert main([*common, "--out", str(tmp_path / "ray"), "--ray", "--ray-workers", "2",
                 "--ray-worker-cpus", "0.5"]) == 0
    local, remote = ((tmp_path / d / EPISODES).read_text().splitlines() for d in ("local", "ray"))
    assert len(local) == 12 * 3 and [json.loads(x) for x in remote] == [json.loads(x) for x in local]
    assert all(json.loads(x)["transcript"] for x in remote)  # the workers' transcripts came back
    assert waves == [2, 1] * 3  # per member: two chunks side by side, then the last one


def test_text_dialogues_through_ray_workers_call_the_shared_server(ray_cluster, tmp_path, monkeypatch):
    from simpop.serve.server import make_server
    from simpop.cli import main
    from simpop.evaluation.eval_records import EPISODES
    from tests.agents.fakes import EchoBackend

    backend = EchoBackend()
    panel = tmp_path / "panel.yaml"
    panel.write_text("name: two\nmembers:\n  a: persuadee?temperature=0.8\n  b: persuadee:heldout-1?temperature=1.2\n")
    with make_server(backend, port=0).start() as server:
        common = ["eval", "--env", "simpop/Persuasion-v0", "--env-arg", "max_turns=3", "--no-progress", "--policy",
                  f"openai:{server.url}#echo", "--panel", str(panel), "--episodes", "4", "--concurrency", "2"]
        assert main([*common, "--out", str(tmp_path / "local")]) == 0
        local_requests = server.stats()["requests"]
        assert main([*common, "--out", str(tmp_path / "ray"), "--ray", "--ray-worker-cpus", "0.5"]) == 0
        # The workers sent the same requests to the server (which batches concurrent greedy ones as it likes).
        assert server.stats()["requests"] - local_requests == local_requests > 0
    local, remote = ([json.loads(x) for x in (tmp_path / d / EPISODES).read_text().splitlines()] for d in ("local", "ray"))
    said = [t["text"] for r in remote for t in r["transcript"] if t["seat"] == "persuader"]
    # Locally the greedy policy runs every member in one wave, so records come chunk by chunk, not member by member.
    order = lambda r: (r["member"], r["index"])  # noqa: E731
    assert said and all(text.startswith("echo: ") for text in said) and sorted(remote, key=order) == sorted(local, key=order)


def test_ray_flags_without_ray_installed_say_how_to_install_it(tmp_path, monkeypatch, capsys):
    import sys

    from simpop.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    base = ["--env", ENV, "--no-progress", "--policy", "reference", "--panel", "p4g-act-v1", "--episodes", "2"]
    assert main(["eval", *base, "--out", str(tmp_path / "e"), "--ray"]) == 2
    assert "pip install 'simpop[ray]'" in capsys.readouterr().err
    assert main(["train", "grpo", "--env", ENV, "--no-progress", "--updates", "1", "--out", str(tmp_path / "t"),
                 "--ray"]) == 2
    assert "--ray: Ray rollout workers need Ray: pip install 'simpop[ray]'" in capsys.readouterr().err
