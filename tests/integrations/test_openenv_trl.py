"""TRL's GRPOTrainer trains SmolLM2 through the OpenEnv server (examples/trl_openenv_grpo.py, 2 updates on CPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the OpenEnv server needs pip install simpop[openenv]")
pytest.importorskip("trl", reason="TRL is in simpop[trl]")

from tests.train.test_report_to import offline_wandb, wandb_runs  # noqa: F401  (a fixture)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_openenv_grpo.py"


def test_trl_grpo_trains_through_the_openenv_server_with_user_turns_masked(capsys, offline_wandb):  # noqa: F811
    spec = importlib.util.spec_from_file_location("trl_openenv_grpo", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with pytest.raises(SystemExit) as refused:  # --report-to takes TRL's names, checked before anything loads
        example.main(["--report-to", "mlflow"])
    assert refused.value.code == 2 and "unknown tracker 'mlflow'" in capsys.readouterr().err
    result = example.main(["--steps", "2", "--group", "2", "--max-new-tokens", "8", "--report-to", "wandb"])

    summary, logs, batches = result["summary"], result["logs"], result["batches"]
    assert summary["updates"] == 2 and len(logs) == len(batches) == 2
    assert set(summary["simulators"]) <= set(example.POPULATION)
    from simpop.agents.transformers_backend import TransformersBackend

    tokenizer = TransformersBackend("smollm2").tokenizer
    for batch, log in zip(batches, logs):
        for completion, mask, logprobs in zip(batch["completion_ids"], batch["env_mask"], batch["logprobs"]):
            assert len(completion) == len(mask) == len(logprobs)
            assert 0 < sum(mask) < len(completion)  # the user's reply is in the completion, masked out
            user_part = tokenizer.decode([t for t, m in zip(completion, mask) if m == 0])
            assert "user" in user_part and all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0)
            assert all(lp < 0.0 for lp, m in zip(logprobs, mask) if m == 1)
        # TRL counts (and trains on) the policy's tokens only: its completion length is the mask's sum.
        assert log["completions/mean_length"] == pytest.approx(sum(map(sum, batch["env_mask"])) / 2)
        assert log["reward"] == pytest.approx(sum(batch["env_reward"]) / 2)
    assert '"updates": 2' in capsys.readouterr().out
    # --report-to wandb is TRL's report_to=["wandb"]: TRL's own W&B run holds its logs, by global step.
    (run,) = wandb_runs(offline_wandb)
    logged = {row["train/global_step"]: row for row in run["history"] if "train/reward" in row}
    assert sorted(logged) == [log["step"] for log in logs] == [1, 2]
    assert all(logged[log["step"]]["train/reward"] == pytest.approx(log["reward"]) for log in logs)
    assert run["config"]["num_generations"] == 2 and run["config"]["report_to"] == ["wandb"]


def test_the_openenv_route_hands_trl_the_in_process_adapters_tokens(tiny_model):
    """Same seeds, same dialogues: played over OpenEnv sessions or in process, TRL gets identical ids and masks."""
    from types import SimpleNamespace

    import simpop
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.envs.persuasion.simulators import native_text
    from simpop.integrations import openenv_trl
    from simpop.integrations.openenv_server import UserSeatSource, make_server
    from simpop.train import trl_adapter

    env, kwargs = "simpop/Persuasion-v1", {"max_turns": 2}
    backend = TransformersBackend(tiny_model, trainable=True)  # plumbing: the one-layer model does
    # The two attributes of TRL's trainer a rollout_func reads, at global step 3.
    trainer = SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda model: model), model=backend.model,
                              args=SimpleNamespace(temperature=1.0, top_p=1.0), state=SimpleNamespace(global_step=3))
    ids = simpop.make(env, **kwargs).scenario_ids()[:2]
    prompts = [ids[0], ids[0], ids[1], ids[1]]
    local = trl_adapter.make_rollout_func(env, native_text(simpop.make(env, **kwargs)), backend, env_kwargs=kwargs,
                                          max_new_tokens=6, seed=5)(prompts, trainer)
    with make_server(UserSeatSource(env, ["persuadee"], env_kwargs=kwargs), port=0).start() as server:
        remote = openenv_trl.make_rollout_func(server.url, backend, max_new_tokens=6, seed=5)(prompts, trainer)
    for key in ("prompt_ids", "completion_ids", "env_mask", "logprobs", "env_reward", "success", "expected_success"):
        assert remote[key] == local[key], key
    assert any(0 in mask for mask in remote["env_mask"])
    assert all(0.0 < e < 1.0 for e in remote["expected_success"])  # the native persuadee knows its decision's odds


def test_a_server_tokenizer_gives_token_in_token_out_sessions():
    """Clients that send their generated ids get back exactly what to append: the client-side ledger's tokens."""
    import json

    from simpop.agents.base import SamplingParams
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.integrations.openenv_client import SimpopEnvClient
    from simpop.integrations.openenv_server import SimpopAction, UserSeatSource, make_server
    from simpop.agents.policy import ChatDelta, TokenLedger

    backend = TransformersBackend("smollm2")
    source = UserSeatSource("simpop/Persuasion-v1", ["persuadee"], env_kwargs={"max_turns": 2}, tokenizer=backend)
    delta, ledger = ChatDelta(backend), TokenLedger()
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0, logprobs=True)
    with make_server(source, port=0).start() as server, SimpopEnvClient(base_url=server.url).sync() as env:
        result, context, turns = env.reset(seed=11), [], 0
        with pytest.raises(RuntimeError, match="token_ids go with a text message"):  # an act index is no text
            env.step(SimpopAction(message=3, token_ids=[1, 2]))
        while not result.done:
            expected = ledger.extend(delta, json.loads(result.observation.text), lambda v: v.get("instructions"))
            context += result.observation.token_ids
            assert context == expected
            generation = backend.generate_ids([context], greedy)[0]
            ledger.add_generation(generation)
            context += generation.token_ids
            result = env.step(SimpopAction(token_ids=generation.token_ids))
            turns += 1
            said = [m["content"] for m in result.observation.messages if m["role"] == "assistant"][-1]
            assert said == backend.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
    assert turns >= 1 and len(context) > ledger.prompt_length
