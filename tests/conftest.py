"""Session-wide fixtures shared by test folders."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the whole test session (starting one costs ~5 s): 2 logical CPUs, no
    dashboard; shut down at the end. Skips where Ray is not installed (``pip install simpop[ray]``)."""
    try:
        import ray
    except ImportError:
        pytest.skip("ray is not installed (pip install 'simpop[ray]'); Ray rollout workers cannot be tested")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """A Python with vLLM; skips only where none is found (``make vllm-env`` builds one; ``make test`` does it
    first)."""
    from simpop.agents.vllm_server import find_vllm_python

    python = find_vllm_python()
    if python is None:
        pytest.skip("no Python with vLLM found (run `make vllm-env`, or set SIMPOP_VLLM_PYTHON)")
    return python


@pytest.fixture(scope="session")
def vllm_server(vllm_python):
    """One vLLM OpenAI server for the whole test session (starting one costs ~40-100 s on 2 cores): the
    embedded SmolLM2 in float32, LoRA on (rank <= 8), prefix caching, dev endpoints."""
    from simpop.agents.vllm_server import VLLMServer

    with VLLMServer("smollm2", dtype="float32", max_lora_rank=8, max_model_len=2048) as server:
        yield server
