"""The embedded model's conversion cache: built once, atomically, under a lock."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from simpop.agents.base import SamplingParams
from simpop.agents.embedded import EMBEDDED_MODELS, _as_declared, _package_dir, cache_dir, cached_build, embedded_model_path

#: Text whose spaces only a byte-level decoder keeps (SmolLM2's JSON-schema mask needs them).
TEXT = ' {"name": "Save the Children", "amount": 0.5}'


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SIMPOP_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("SIMPOP_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "simpop"


def test_concurrent_builders_build_once(tmp_path):
    target = tmp_path / "model"
    builds = []

    def build(out: Path) -> None:
        builds.append(out)
        time.sleep(0.2)  # long enough for every other thread to reach the lock
        (out / "weights.bin").write_text("w")

    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(cached_build(target, build))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert results == [target] * 4
    assert (target / "weights.bin").read_text() == "w"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.lock"]  # no temporary folder left


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    target = tmp_path / "model"

    def build(out: Path) -> None:
        (out / "half-written").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        cached_build(target, build)
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["model.lock"]
    cached_build(target, lambda out: (out / "ok").write_text("y"))  # the next attempt builds it
    assert (target / "ok").is_file()


def test_unknown_embedded_model():
    with pytest.raises(ValueError, match="unknown embedded model 'gpt5'; available: \\['smollm2'\\]"):
        embedded_model_path("gpt5")


def test_conversion_into_a_fresh_cache(monkeypatch, tmp_path, one_torch_thread):
    from transformers import AutoTokenizer

    from simpop.agents.transformers_backend import TransformersBackend

    monkeypatch.setenv("SIMPOP_CACHE_DIR", str(tmp_path))
    path = embedded_model_path()
    assert path == tmp_path / "SmolLM2-135M-Instruct"
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in path.iterdir()
    }
    start = time.perf_counter()
    assert embedded_model_path() == path
    assert time.perf_counter() - start < 0.1  # a cache hit does no work

    tokenizer = AutoTokenizer.from_pretrained(path)
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_end|>")  # as the GGUF declares them
    assert tokenizer.decode(tokenizer.encode(TEXT, add_special_tokens=False)) == TEXT  # byte-level spaces kept

    params = SamplingParams(max_new_tokens=4)
    chat = [{"role": "user", "content": "Name a colour."}]
    fresh = TransformersBackend(path).generate([chat], params)[0]
    monkeypatch.delenv("SIMPOP_CACHE_DIR")  # the default cache, converted the same way
    assert fresh.token_ids == TransformersBackend().generate([chat], params)[0].token_ids


def test_a_tokenizer_read_as_sentencepiece_is_restored_to_the_gguf_declaration():
    """transformers 5.17 reads SmolLM2's byte-level BPE as SentencePiece and its eos from bos; the conversion undoes it."""
    from tokenizers import decoders
    from transformers import AutoTokenizer

    package, gguf_file, _ = EMBEDDED_MODELS["smollm2"]
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    backend = tokenizer.backend_tokenizer  # as 5.17 builds it
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), decoders.Replace("\u2581", " "),
                                         decoders.ByteLevel()])
    backend.model.byte_fallback, backend.model.fuse_unk, backend.model.unk_token = True, True, "<|endoftext|>"
    tokenizer.eos_token, tokenizer.pad_token = "<|im_start|>", None
    restored = _as_declared(tokenizer, _package_dir(package) / gguf_file)
    assert (restored.eos_token, restored.pad_token, restored.bos_token) == ("<|im_end|>", "<|im_end|>", "<|im_start|>")
    assert isinstance(restored.backend_tokenizer.decoder, decoders.ByteLevel)  # what llguidance's mask reads
    assert restored.encode(TEXT, add_special_tokens=False) == ids and restored.decode(ids) == TEXT
