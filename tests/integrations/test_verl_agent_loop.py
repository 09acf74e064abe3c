"""simpop's verl agent loop on verl's real ``AgentLoopBase`` (verl 0.9.1, installed with ``--no-deps``).

What runs here: verl's agent-loop class, its Continuous Token builder on SmolLM2's real tokenizer, ``DictConfigWrap``,
``AgentLoopOutput`` and ``TokenOutput``. What does not: verl's vLLM/SGLang server replicas (its GPU stack), so the
policy's token ids come from simpop's in-process SmolLM2 through the same ``generate`` call verl's
``LLMServerClient`` answers (``benchmarks/gpu_check.sh`` runs verl's own server).
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl", reason="verl is installed by `make setup` (pip install --no-deps verl==0.9.1 ...)")

from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from simpop.agents import SamplingParams, load_backend  # noqa: E402
from simpop.integrations.turns import KICKOFF  # noqa: E402
from simpop.integrations.verl_agent_loop import AGENT_NAME, SimpopAgentLoop, dataset_rows  # noqa: E402
from tests.integrations.conftest import doc_example  # noqa: E402


class SimpopServer:
    """Answers verl's ``server_manager.generate`` from an in-process simpop backend; records what it returned."""

    def __init__(self, backend):
        self.backend, self.outputs = backend, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        params = SamplingParams(max_new_tokens=sampling_params.get("max_tokens", 24),
                                temperature=sampling_params.get("temperature", 1.0), seed=len(self.outputs),
                                logprobs=True)
        (generation,) = self.backend.generate_ids([list(prompt_ids)], params)
        self.outputs.append(generation.token_ids)
        return TokenOutput(token_ids=generation.token_ids, log_probs=generation.logprobs)


@pytest.fixture(scope="module")
def backend():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_backend("smollm2")
    torch.set_num_threads(threads)


def play(backend, row, response_length=512):
    server = SimpopServer(backend)

    async def run():
        config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 4096,
                                                                     "response_length": response_length}}})
        loop = SimpopAgentLoop(DictConfigWrap(config), server, backend.tokenizer, None, RLHFDataset,
                               DictConfigWrap(OmegaConf.create({})))
        return await loop.run({"max_tokens": 24, "temperature": 1.0}, **row)

    return asyncio.run(run()), server


def spans(mask):
    """(start, end, value) runs of a 0/1 mask."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((start, i, mask[start]))
            start = i
    return runs


def test_a_p4g_dialogue_trains_only_the_policy_tokens(backend):
    (row,) = dataset_rows("simpop/Persuasion-v1", "persuadee", episodes=1, env_kwargs={"max_turns": 2})
    assert row["agent_name"] == AGENT_NAME
    out, server = play(backend, row)
    assert isinstance(out, AgentLoopOutput)
    info = out.extra_fields["simpop"]
    transcript = info["transcript"]
    assert [t["seat"] for t in transcript][:2] == ["persuader", "persuadee"] and not info["length_capped"]
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    # The policy's tokens are exactly what the server generated, mask 1; the user's words sit in mask-0 spans.
    runs = spans(out.response_mask)
    trained = [out.response_ids[s:e] for s, e, v in runs if v == 1]
    assert len(trained) == len(server.outputs) == sum(t["seat"] == "persuader" for t in transcript)
    for ids, generated in zip(trained, server.outputs, strict=True):
        assert ids[:len(generated)] == generated and len(ids) - len(generated) <= 2  # + the end-of-turn marker
    untrained = [backend.tokenizer.decode(out.response_ids[s:e]) for s, e, v in runs if v == 0]
    users = [t["text"] for t in transcript if t["seat"] == "persuadee"]
    assert runs[0][2] == 1 and all(any(u in text for text in untrained) for u in users[: len(untrained)])
    prompt = backend.tokenizer.decode(out.prompt_ids)
    assert "Save the Children" in prompt and KICKOFF in prompt
    assert out.reward_score == float(info["donated"]) and out.num_turns == len(transcript) + 1


def test_the_response_length_caps_a_dialogue(backend):
    (row,) = dataset_rows("simpop/Persuasion-v1", "persuadee", episodes=1, env_kwargs={"max_turns": 5})
    out, _ = play(backend, row, response_length=8)
    assert out.extra_fields["simpop"]["length_capped"] and len(out.response_mask) == 8


def test_dataset_rows_need_a_text_env():
    with pytest.raises(ValueError, match="not a text env"):
        dataset_rows("simpop/PersuasionAct-v0")
    rows = dataset_rows(episodes=3, seed=5)
    assert [r["extra_info"]["simpop"]["seed"] for r in rows] == [5, 6, 7]
    assert len({r["extra_info"]["simpop"]["scenario_id"] for r in rows}) == 3


def test_the_documented_dataset_example_writes_one_row_per_scenario(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.chdir(tmp_path)
    exec(doc_example("dataset_rows("), {})  # docs/integrations/verl.md's example, as written
    table = pd.read_parquet(tmp_path / "p4g.parquet")
    assert len(table) == 200 and set(table["agent_name"]) == {AGENT_NAME}
    assert table["extra_info"][0]["simpop"]["env_kwargs"] == {"max_turns": 5}


def test_the_documented_agent_loop_config_names_this_loop():
    from hydra.utils import get_class

    (entry,) = OmegaConf.create(doc_example("_target_:", language="yaml"))  # what verl's agent-loop worker loads
    assert entry.name == AGENT_NAME and get_class(entry._target_) is SimpopAgentLoop
