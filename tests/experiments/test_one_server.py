"""Text-level runs on one vLLM server: the policy, its simulators and the panels' LLM members generate there, and
the simulators still answer surveys by scoring in process."""

from __future__ import annotations

import pytest

from simpop.agents.vllm_backend import ServedGeneration, VLLMBackend, on_policy_server
from simpop.experiments.conditions import (CollapseConfig, build_panel, build_trainer, one_server, served_adapters,
                                           simulator_backends)


def _config(generator: str, conditions: tuple[str, ...] = ("frozen",), **settings) -> CollapseConfig:
    return CollapseConfig(level="text", conditions=conditions, updates=1, eval_every=1, eval_episodes=2, max_turns=1,
                          grpo={"group_size": 2, "scenarios_per_update": 2, "max_new_tokens": 4},
                          model={"generator": generator, "dtype": "float32", "lora_r": 4, "lora_alpha": 8}, **settings)


def test_one_server_is_launched_for_all_runs_and_stopped(monkeypatch):
    import simpop.agents.vllm_server as vllm_server

    events = []

    class Server:
        url = "http://127.0.0.1:1234"

        def __init__(self, model, **options):
            events.append(("init", model, options))

        def start(self):
            events.append("start")
            return self

        def stop(self):
            events.append("stop")

    monkeypatch.setattr(vllm_server, "VLLMServer", Server)
    config = _config("vllm:launch", ("frozen", "cotrain"))
    with one_server(config) as runs:
        assert runs.model.generator == "vllm:http://127.0.0.1:1234" and runs.conditions == config.conditions
        # The sims' rank 8 > the policy's 4; cotrain's run serves the policy and one simulator.
        assert events == [("init", "smollm2", {"max_loras": 2, "max_lora_rank": 8,
                                               "gpu_memory_utilization": vllm_server.TRAINER_GPU_SHARE}), "start"]
    assert events[-1] == "stop"
    with pytest.raises(RuntimeError, match="boom"), one_server(config):  # stopped when a run fails too
        raise RuntimeError("boom")
    assert events[-1] == "stop" and events.count("start") == 2
    for other in (_config(""), _config("vllm:http://h:1")):
        with one_server(other) as runs:
            assert runs is other
    assert events.count("start") == 2


def test_the_server_holds_every_adapter_of_the_runs_that_go_at_once():
    assert served_adapters(_config("vllm:launch", ("frozen", "verbalized"))) == 1  # the policy's
    # Population co-training: the policy, K = 3 simulators and a pool of 5 snapshots, per run.
    population = ("frozen", "cotrain", "population")
    assert served_adapters(_config("vllm:launch", population)) == 9
    assert served_adapters(_config("vllm:launch", population, seeds=2, workers=4)) == 4 * 9
    assert served_adapters(_config("vllm:launch", ("cotrain",), seeds=2, workers=4)) == 2 * 2  # two runs in all
    small = _config("vllm:launch", population, cotrain={"population_size": 2, "pool_size": 1})
    assert served_adapters(small) == 4


def test_without_a_server_the_simulators_generate_in_process():
    backends = {"smollm2": object()}
    assert on_policy_server(backends, policy=object()) is backends


def test_a_text_run_generates_on_the_policys_server_and_scores_surveys_in_process(vllm_server, monkeypatch):
    from simpop.envs.registration import make

    calls = []
    generate = VLLMBackend.generate

    def counted(self, chats, params):
        calls.append((self.model, len(chats)))
        return generate(self, chats, params)

    monkeypatch.setattr(VLLMBackend, "generate", counted)
    config = _config(f"vllm:{vllm_server.url}")
    env = make(config.env_id, **config.env_kwargs())
    backends = simulator_backends(config)
    trainer = build_trainer("frozen", config, 0, env, backends)
    sim = trainer.training_simulator
    assert isinstance(sim.backend, ServedGeneration) and sim.backend.local is backends["smollm2"]
    metrics = trainer.step()
    assert metrics["generator_version"] == 1  # the policy generated there too, and was synced
    assert calls and {model for model, _ in calls} == {"smollm2"}  # the base model: no adapter
    assert sum(n for _, n in calls) == sim.stats["replies"] > 0
    assert sim.stats["survey_scored"] == 4 and sim.stats["survey_unscored"] == sim.stats["survey_errors"] == 0

    panel = build_panel(config, env, on_policy_server(backends, trainer.policy))
    llm = [m for name, m in panel.members.items() if name.startswith("llm-")]
    assert llm and all(isinstance(m.backend, ServedGeneration) for m in llm)


def test_a_verbalized_simulator_states_its_candidates_on_the_policys_server(vllm_server):
    from simpop.envs.registration import make

    config = _config(f"vllm:{vllm_server.url}", ("verbalized",))
    env = make(config.env_id, **config.env_kwargs())
    trainer = build_trainer("verbalized", config, 0, env, simulator_backends(config))
    sim = trainer.training_simulator
    assert isinstance(sim.backend, ServedGeneration)
    trainer.step()
    # Its JSON is generated with the server's structured output (greedy): most calls parse.
    assert sim.stats["calls"] == 4 and sim.stats["fallbacks"] < sim.stats["calls"] / 2
