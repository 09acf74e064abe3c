"""All panel members in one wave (PanelWave): each member plays exactly as alone; LLM members on a vLLM server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simpop.agents.vllm_backend import ServedModels, VLLMBackend
from simpop.envs.registration import make
from simpop.rollout import Job, RolloutEngine
from simpop.seat import Player
from simpop.simulators.panel_wave import PanelWave
from simpop.simulators.registry import build_many

ENV = "simpop/PersuasionAct-v0"


class Greedy(Player):
    """A deterministic act-level policy (its choices do not depend on the rollout generator)."""

    def act_batch(self, observations, slots):
        return [int(np.argmax(np.asarray(o)[:len(o) // 2])) % 14 for o in observations]


def members():
    return build_many({"native": "persuadee", "held": "persuadee:heldout-1?temperature=1.3&personas=heldout",
                       "greedy": "persuadee?decoding=greedy"}, make(ENV))


@pytest.mark.parametrize("concurrent", [False, True])
def test_every_member_plays_as_alone(concurrent: bool) -> None:
    jobs = [Job(sid, g, 300 + g) for g, sid in enumerate(make(ENV).scenario_ids()[:5])]
    alone = {}
    for simulator in members():
        trajectories = RolloutEngine(ENV, Greedy(), simulator).run(jobs, np.random.default_rng(0))
        alone[simulator.name] = [(t.actions, t.total_reward, t.simulator) for t in trajectories]
    sims = members()
    wave = PanelWave(sims, concurrent=concurrent)
    wave.assign([m for m in range(len(sims)) for _ in jobs])
    together = RolloutEngine(ENV, Greedy(), wave).run([j for _ in sims for j in jobs], np.random.default_rng(0))
    for m, simulator in enumerate(sims):
        mine = together[m * len(jobs):(m + 1) * len(jobs)]
        assert [(t.actions, t.total_reward, t.simulator) for t in mine] == alone[simulator.name]


def test_one_wave_eval_writes_the_member_by_member_records(tmp_path) -> None:
    """``evaluate_panel(one_wave=True)``: the same records as member by member for a policy that draws nothing;
    a resume after a torn write completes them."""
    from simpop.evaluation.eval_records import EPISODES, read_records
    from simpop.evaluation.eval_run import evaluate_panel
    from simpop.simulators.population import Panel

    def run(out, one_wave, resume=False):
        return evaluate_panel(ENV, Greedy(), Panel(members()), episodes=7, seed=3, out=out, concurrency=3,
                              env_kwargs={"max_turns": 5}, one_wave=one_wave, resume=resume)

    alone, together = run(tmp_path / "alone", False), run(tmp_path / "together", True)
    lines = {d: (tmp_path / d / EPISODES).read_text().splitlines(keepends=True) for d in ("alone", "together")}
    assert sorted(lines["alone"]) == sorted(lines["together"]) and len(lines["alone"]) == 21
    assert lines["alone"] != lines["together"]  # written chunk by chunk across members
    assert together == alone
    (tmp_path / "together" / EPISODES).write_text("".join(lines["together"][:8]) + lines["together"][8][:40])
    assert run(tmp_path / "together", True, resume=True) == alone
    assert sorted(r.to_json() for r in read_records(tmp_path / "together" / EPISODES)) == sorted(
        x.strip() for x in lines["alone"])


def test_panel_wave_rejects_bad_use() -> None:
    sims = members()
    with pytest.raises(ValueError, match="at least one"):
        PanelWave([])
    with pytest.raises(ValueError, match="distinct"):
        PanelWave([sims[0], sims[0]])
    wave = PanelWave(sims)
    with pytest.raises(ValueError, match="member indices"):
        wave.assign([0, 3])
    wave.assign([0, 1])
    with pytest.raises(ValueError, match="assigned slots"):
        wave.reset_batch([None], [np.random.default_rng(0)])
    with pytest.raises(IndexError, match="not started"):
        wave.member(0)


def test_served_models_serve_local_models_only() -> None:
    served = ServedModels("launch")
    assert ServedModels.local_model("smollm2") == "smollm2"
    assert ServedModels.local_model("transformers:/models/x") == "/models/x"
    assert ServedModels.local_model("openai:http://h/v1#m") is None
    assert "smollm2" in served and "trainable:smollm2" not in served and "openai:http://h/v1#m" not in served
    with pytest.raises(KeyError):
        served["openai:http://h/v1#m"]
    with pytest.raises(ValueError, match="vllm:launch"):
        ServedModels("nonsense")


def test_a_launched_panel_server_serves_no_adapters(monkeypatch) -> None:
    import simpop.agents.vllm_backend as vllm_backend

    launched = []
    monkeypatch.setattr(vllm_backend, "load_vllm_backend", lambda model, **kw: launched.append((model, kw)) or model)
    served = ServedModels("launch")
    assert served["smollm2"] == "smollm2" and served["smollm2"] == "smollm2"  # one server per model, cached
    assert launched == [("smollm2", {"enable_lora": False})]


def test_cli_refuses_a_bad_sim_generator(tmp_path, capsys) -> None:
    from simpop.cli import main

    code = main(["eval", "--env", ENV, "--policy", "reference", "--panel", "p4g-act-v1", "--episodes", "1",
                 "--sim-generator", "tgi:launch", "--out", str(tmp_path / "x")])
    assert code == 2 and "--sim-generator must be" in capsys.readouterr().err


def test_eval_with_llm_members_on_a_vllm_server(vllm_server, tmp_path) -> None:
    """τ² mock with the gold agent: the scripted user and two SmolLM2 users (greedy and sampled) in one wave,
    the SmolLM2 users generating on one vLLM server (the session's), their calls of a tick sent together."""
    from simpop.cli import main
    from simpop.evaluation.eval_records import EPISODES, read_records

    panel = tmp_path / "panel.yaml"
    panel.write_text(json.dumps({"name": "mock-two-llms", "members": {
        "scripted": "native", "greedy": "frozen:smollm2?temperature=0.0&max_new_tokens=24",
        "sampled": "frozen:smollm2?temperature=1.0&max_new_tokens=24"}}))
    out = tmp_path / "eval"
    code = main(["eval", "--env", "simpop/Tau2-mock-v0", "--policy", "reference", "--panel", str(panel),
                 "--episodes", "1", "--env-arg", "max_steps=8", "--sim-generator", f"vllm:{vllm_server.base_url}",
                 "--no-progress", "--out", str(out)])
    assert code == 0
    records = read_records(out / EPISODES)
    assert len(records) == 3 and not any(r.error for r in records)
    llm = [r for r in records if r.member != "scripted"]
    assert all(any(t["seat"] != "agent" and t["text"] for t in r.transcript) for r in llm)
    # The members' backend was the server's.
    served = ServedModels(vllm_server.base_url)
    assert isinstance(served["smollm2"], VLLMBackend)


def test_eval_runs_one_wave_by_default_where_the_records_are_the_same(tmp_path) -> None:
    """``one_wave=None``: one wave for a policy that draws nothing from its generator (``rng_free``), member by
    member for one that samples (one wave would change its draws); the gold τ² agent and greedy text policies
    draw nothing."""
    from simpop.agents.base import SamplingParams
    from simpop.evaluation.eval_records import EPISODES
    from simpop.evaluation.eval_run import draws_nothing, evaluate_panel
    from simpop.envs.tau2.reference import GoldTau2Agent
    from simpop.evaluation.policies import TextPolicy
    from simpop.simulators.population import Panel

    class Free(Greedy):
        rng_free = True

    def order(policy, out):
        evaluate_panel(ENV, policy, Panel(members()), episodes=4, seed=3, out=out, concurrency=2,
                       env_kwargs={"max_turns": 4})
        return [json.loads(line)["member"] for line in (out / EPISODES).read_text().splitlines()]

    names = [name for name, _ in Panel(members())]
    assert order(Greedy(), tmp_path / "sampling") == [m for m in names for _ in range(4)]  # member by member
    assert order(Free(), tmp_path / "free") == [m for _ in range(2) for m in names for _ in range(2)]  # chunk by chunk
    assert draws_nothing(GoldTau2Agent()) and not draws_nothing(Greedy())
    assert draws_nothing(TextPolicy(None, SamplingParams(temperature=0.0)))
    assert not draws_nothing(TextPolicy(None, SamplingParams(temperature=1.0)))


def test_a_member_that_raises_in_a_wave_reruns_alone_episode_by_episode(tmp_path, caplog) -> None:
    """One member's simulator fails on one dialogue every time: the others rerun together and keep their records,
    the failing member runs episode by episode (two runs of its chunk, not three) and records that one error."""
    from simpop.envs.persuasion.simulators import ActPersuadee
    from simpop.evaluation.eval_records import EPISODES, read_records
    from simpop.evaluation.eval_run import evaluate_panel
    from simpop.simulators.population import Panel

    class FailsOn(ActPersuadee):
        """Raises whenever it replies in the dialogue of scenario ``bad``; counts the dialogues it starts."""

        bad, started = "", 0

        def reset_batch(self, scenarios, rngs):
            super().reset_batch(scenarios, rngs)
            self.scenario_ids = [s.id for s in scenarios]
            FailsOn.started += len(scenarios)

        def act_batch(self, observations, slots):
            if any(self.scenario_ids[s] == FailsOn.bad for s in slots):
                raise ValueError("no reply for this one")
            return super().act_batch(observations, slots)

    def run(out, one_wave):
        FailsOn.started = 0
        panel = Panel([*members(), FailsOn(temperature=0.9, name="fails")])
        evaluate_panel(ENV, Greedy(), panel, episodes=6, seed=3, out=out, concurrency=3, env_kwargs={"max_turns": 5},
                       one_wave=one_wave)
        return {r.key: r.to_json() for r in read_records(out / EPISODES)}, FailsOn.started

    alone, _ = run(tmp_path / "probe", False)
    FailsOn.bad = sorted(key for key in alone if key[0] == "fails")[1][1]  # one of its scenarios
    alone, _ = run(tmp_path / "alone", False)
    together, started = run(tmp_path / "together", True)
    assert together == alone and len(together) == 24
    errors = [json.loads(r) for r in together.values() if json.loads(r)["error"]]
    assert [(e["member"], e["scenario"], e["error"]) for e in errors] == [
        ("fails", FailsOn.bad, "ValueError: no reply for this one")]
    assert started == 3 + 3 + 3  # its failing chunk as a wave, then one by one; its other chunk once
    assert "the other members rerun as one wave, fails one episode at a time" in caplog.text
