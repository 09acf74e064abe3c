"""Export a trained policy as a folder other tools load: a standard HF model, a PEFT adapter, or torch weights.

:func:`export_policy` writes one folder per policy; :func:`load_exported` reads any of them back as a
simpop policy. Every folder holds ``simpop_export.json`` (what it is, what it came from, the training step).

================  ==============================================  =========================================
policy            folder                                          loads with
================  ==============================================  =========================================
LLMPolicy, LoRA,  merged HF model: ``config.json``,               ``AutoModelForCausalLM.from_pretrained``,
``merge=True``    ``model.safetensors``, generation config,       vLLM (``vllm serve DIR``),
                  tokenizer (with its chat template)              ``simpop serve transformers:DIR``
LLMPolicy, LoRA,  PEFT adapter: ``adapter_config.json`` (its      ``PeftModel.from_pretrained(base, DIR)``,
``merge=False``   ``base_model_name_or_path`` is the base         ``AutoModelForCausalLM.from_pretrained``
                  folder), ``adapter_model.safetensors``,         (with peft installed), vLLM
                  tokenizer; the manifest names the base          (``--enable-lora --lora-modules x=DIR``)
LLMPolicy, full   HF model of the fine-tuned weights + tokenizer  as the merged folder
fine-tuning
ActPolicy         ``policy.pt`` (``torch.save`` of the            :func:`load_exported` (not an HF model:
                  ``state_dict``); the manifest has ``obs_dim``,  an MLP over the act-level observation)
                  ``n_actions``, ``hidden_size``
other torch       ``policy.pt`` + the class path and, if given,   :func:`load_exported` when ``init_args``
``nn.Module``     its constructor's ``init_args``                 were given
(PPO's actor-
critic)
================  ==============================================  =========================================

A LoRA merge never touches the live model: a second copy of the base is loaded (on the CPU) from the
backend's folder, given the live base weights, wrapped with a copy of the adapter and merged there.

Writes are atomic: the folder is built next to ``out_dir`` under a temporary name and renamed into place,
so ``out_dir`` is either absent or complete (an existing ``out_dir`` is replaced only with
``overwrite=True``, and only once the new folder is complete).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simpop.files import atomic_folder

MANIFEST = "simpop_export.json"
#: Bumped when the folder layout changes; :func:`load_exported` refuses newer ones.
FORMAT_VERSION = 1
_WEIGHTS = "policy.pt"


def export_policy(policy: Any, out_dir: str | Path, *, merge: bool = True, step: int | None = None,
                  overwrite: bool = False, init_args: Mapping[str, Any] | None = None,
                  metadata: Mapping[str, Any] | None = None) -> Path:
    """Write ``policy`` to folder ``out_dir`` (the module docstring lists the layouts); returns its path.

    Args:
        policy: An :class:`~simpop.agents.policy.LLMPolicy`, an :class:`~simpop.agents.policy.ActPolicy`
            or another ``torch.nn.Module`` policy.
        out_dir: The folder to create.
        merge: LoRA policies: merge the adapter into the base weights (a standalone HF model); False writes
            the PEFT adapter folder with a reference to the base.
        step: The training step the weights are from (recorded in the manifest).
        overwrite: Replace an existing ``out_dir`` (only once the new folder is complete).
        init_args: Other torch modules: the constructor arguments that rebuild the module.
        metadata: Extra JSON-serialisable fields for the manifest (e.g. the run's env id).

    Raises:
        FileExistsError: ``out_dir`` exists and ``overwrite`` is False.
        TypeError: A policy of no kind above.
    """
    from torch import nn

    from simpop.agents.policy import ActPolicy, LLMPolicy

    out = Path(out_dir).expanduser().absolute()
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True to replace it, or export to another folder")
    if isinstance(policy, LLMPolicy):
        write = _llm_writer(policy, merge)
    elif isinstance(policy, ActPolicy):
        args = {"obs_dim": policy.obs_dim, "n_actions": policy.n_actions, "hidden_size": policy.net[0].out_features}
        write = _torch_writer(policy, "act-mlp", args)
    elif isinstance(policy, nn.Module):
        write = _torch_writer(policy, "torch-module", dict(init_args) if init_args is not None else None)
    else:
        raise TypeError(f"cannot export a {type(policy).__name__}: export_policy takes an LLMPolicy, an ActPolicy "
                        f"or a torch.nn.Module policy")
    manifest = {"format": "simpop-export", "format_version": FORMAT_VERSION, "step": step, **(metadata or {})}
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_folder(out, replace=overwrite) as tmp:
        manifest.update(write(tmp))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return out


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The ``simpop_export.json`` of an exported folder (ValueError if it is none)."""
    path = Path(folder).expanduser() / MANIFEST
    if not path.is_file():
        raise ValueError(f"{Path(folder)} is not a simpop export (no {MANIFEST}); export one with export_policy")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != "simpop-export" or int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise ValueError(f"{path}: format {manifest.get('format')!r} version {manifest.get('format_version')!r} "
                         f"is not one this simpop reads (simpop-export <= {FORMAT_VERSION}); upgrade simpop")
    return manifest


def load_exported(folder: str | Path, *, dtype: str | None = None, device: str | None = None) -> Any:
    """A policy from a folder written by :func:`export_policy`.

    LLM folders give an :class:`~simpop.agents.policy.LLMPolicy` with the exported sampling settings (an
    adapter folder loads its base and adds the adapter, so it stays trainable); ``act-mlp`` folders an
    :class:`~simpop.agents.policy.ActPolicy`; ``torch-module`` folders an instance of the recorded class.

    Args:
        folder: The exported folder.
        dtype: LLM weights dtype (default: the exported one).
        device: LLM torch device (default: the backend's choice).
    """
    import torch

    folder = Path(folder).expanduser()
    manifest = read_manifest(folder)
    kind = manifest["kind"]
    if kind in ("act-mlp", "torch-module"):
        if manifest.get("init_args") is None:
            raise ValueError(f"{folder}: the {manifest['class']} was exported without init_args; build it "
                             f"yourself and load_state_dict(torch.load({folder / _WEIGHTS}))")
        cls = _import(manifest["class"])
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise ValueError(f"{folder}: {manifest['class']} is not a torch module")
        module = cls(**manifest["init_args"])
        module.load_state_dict(torch.load(folder / _WEIGHTS, map_location="cpu", weights_only=True))
        return module.eval()
    from simpop.agents.base import SamplingParams
    from simpop.agents.policy import LLMPolicy
    from simpop.agents.transformers_backend import TransformersBackend

    sampling = SamplingParams(**{**manifest["sampling"], "stop": tuple(manifest["sampling"].get("stop", ()))})
    dtype = dtype or manifest.get("dtype", "float32")
    if kind in ("merged", "full"):
        return LLMPolicy(TransformersBackend(folder, dtype=dtype, device=device), sampling,
                         system_prompt=manifest.get("system_prompt"))
    if kind != "adapter":
        raise ValueError(f"{folder}: unknown export kind {kind!r}")
    import peft
    from safetensors.torch import load_file

    base = _base_to_load(manifest, folder)
    backend = TransformersBackend(base, dtype=dtype, device=device)
    config = peft.LoraConfig.from_pretrained(str(folder))
    name = manifest["adapter"]
    backend.add_adapter(name, config.r, config.lora_alpha, sorted(config.target_modules), config.lora_dropout)
    policy = LLMPolicy(backend, sampling, lora=True, lora_r=config.r, lora_alpha=config.lora_alpha, adapter=name,
                       system_prompt=manifest.get("system_prompt"))
    policy.load_state_dict(load_file(folder / "adapter_model.safetensors"))
    return policy


# ------------------------------------------------------------------------------------------ writers
def _llm_writer(policy: Any, merge: bool):
    backend = policy.backend
    for needed in ("model", "tokenizer", "path"):
        if not hasattr(backend, needed):
            raise TypeError(f"cannot export an LLMPolicy on a {type(backend).__name__}: it needs an in-process "
                            f"backend with .model, .tokenizer and .path (TransformersBackend)")
    manifest = {"policy": type(policy).__qualname__, "base_model": str(backend.path),
                "base_name": getattr(backend, "name", None), "dtype": getattr(backend, "dtype", None),
                "adapter": policy.adapter, "sampling": dataclasses.asdict(policy.sampling),
                "system_prompt": policy.fixed_system_prompt}

    def write(tmp: Path) -> dict[str, Any]:
        if policy.lora is None:
            _save_full(backend, tmp)
            return {**manifest, "kind": "full", "merged": False, "hf_model": True}
        if merge:
            merged = _merged_copy(backend, policy.lora.name)
            merged.save_pretrained(tmp)
            backend.tokenizer.save_pretrained(tmp)
            return {**manifest, "kind": "merged", "merged": True, "hf_model": True}
        _save_adapter(backend, policy.lora.name, tmp)
        return {**manifest, "kind": "adapter", "merged": False, "hf_model": False}

    return write


def _torch_writer(module: Any, kind: str, init_args: dict[str, Any] | None):
    import torch

    def write(tmp: Path) -> dict[str, Any]:
        state = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        torch.save(state, tmp / _WEIGHTS)
        cls = type(module)
        return {"kind": kind, "policy": cls.__qualname__, "class": f"{cls.__module__}:{cls.__qualname__}",
                "init_args": init_args, "weights": _WEIGHTS, "hf_model": False,
                "note": "not a Hugging Face model: torch.save of the module's state_dict; rebuild the class with "
                        "init_args and load_state_dict (simpop.agents.export.load_exported does both)"}

    return write


def _save_full(backend: Any, tmp: Path) -> None:
    """The live model as an HF folder; with (simulators') adapters on it, the base weights alone."""
    if _is_peft(backend.model):
        _fresh_base(backend).save_pretrained(tmp)
    else:
        backend.model.save_pretrained(tmp)  # reads the weights, changes nothing
    backend.tokenizer.save_pretrained(tmp)


def _merged_copy(backend: Any, adapter: str) -> Any:
    """A CPU copy of the base with ``adapter`` merged in; the live model is only read."""
    import peft

    config = copy.deepcopy(backend.model.peft_config[adapter])
    config.inference_mode = True
    wrapped = peft.get_peft_model(_fresh_base(backend), config, adapter_name=adapter)
    result = peft.set_peft_model_state_dict(wrapped, _adapter_state(backend, adapter), adapter_name=adapter)
    if result.unexpected_keys:
        raise ValueError(f"adapter {adapter!r} does not fit its base: {result.unexpected_keys[:3]}")
    return wrapped.merge_and_unload(safe_merge=True)


def _save_adapter(backend: Any, adapter: str, tmp: Path) -> None:
    """The PEFT adapter folder of ``adapter`` (what ``PeftModel.save_pretrained`` writes) plus the tokenizer."""
    from safetensors.torch import save_file

    config = copy.deepcopy(backend.model.peft_config[adapter])
    config.inference_mode = True
    config.base_model_name_or_path = str(Path(backend.path).absolute())
    config.save_pretrained(tmp)
    save_file({k: v.contiguous() for k, v in _adapter_state(backend, adapter).items()},
              tmp / "adapter_model.safetensors", metadata={"format": "pt"})
    backend.tokenizer.save_pretrained(tmp)


def _adapter_state(backend: Any, adapter: str) -> dict[str, Any]:
    import peft

    weights = peft.get_peft_model_state_dict(backend.model, adapter_name=adapter)
    return {k: v.detach().cpu().clone() for k, v in weights.items()}


def _fresh_base(backend: Any) -> Any:
    """A new CPU model from the backend's folder, holding the live model's base weights (adapters left out)."""
    import torch
    import transformers

    dtype = getattr(torch, getattr(backend, "dtype", "float32"))
    fresh = transformers.AutoModelForCausalLM.from_pretrained(backend.path, dtype=dtype)
    live = backend.model.get_base_model() if _is_peft(backend.model) else backend.model
    # LoRA layers wrap each adapted Linear as ``<name>.base_layer``; their ``lora_*`` weights are not the base.
    state = {k.replace(".base_layer.", "."): v for k, v in live.state_dict().items() if ".lora_" not in k}
    missing, unexpected = fresh.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"the live model's weights do not fit a fresh {backend.path}: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    return fresh.eval()


def _import(path: str) -> Any:
    """``"module:Qualified.name"`` -> the object."""
    import importlib

    module, _, qualname = path.partition(":")
    value = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _base_to_load(manifest: Mapping[str, Any], folder: Path) -> str:
    """The adapter's base: the recorded folder, else the embedded model of the same name."""
    from simpop.agents.embedded import EMBEDDED_MODELS

    base = Path(manifest["base_model"])
    if (base / "config.json").is_file():
        return str(base)
    if manifest.get("base_name") in EMBEDDED_MODELS:
        return manifest["base_name"]
    raise FileNotFoundError(f"{folder}: the adapter's base model {base} is not here; copy it there (or load "
                            f"the adapter onto it with PeftModel.from_pretrained)")

