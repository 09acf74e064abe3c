"""TRL's GRPOTrainer trains SmolLM2 through the OpenEnv server (examples/trl_openenv_grpo.py, 2 updates on CPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the OpenEnv server needs pip install simpop[openenv]")
pytest.importorskip("trl", reason="TRL is in simpop[trl]")

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_openenv_grpo.py"


def test_trl_grpo_trains_through_the_openenv_server_with_user_turns_masked(capsys):
    spec = importlib.util.spec_from_file_location("trl_openenv_grpo", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--steps", "2", "--group", "2", "--max-new-tokens", "8"])

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
