"""Generation on a transformers from before 5.24 (which named the KV cache ``past_key_values``, not ``cache``).

GPU images and vLLM 0.32's pin (``transformers<5.20``) have such versions, and on one (5.17, an H200) simpop's
generation failed. The vLLM environment (``make vllm-env``) holds a real one: the backend generates there, with
its prefix cache and without, on this checkout's sources.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


SRC = Path(__file__).resolve().parents[2] / "src"

CHILD = '''
import json, sys

sys.path.insert(0, sys.argv[1])
import transformers

from simpop.agents.base import SamplingParams
from simpop.agents.kv_buffer import cache_argument
from simpop.agents.transformers_backend import TransformersBackend

backend = TransformersBackend(sys.argv[2], dtype="float32", device="cpu", prefix_cache=True)
params = SamplingParams(max_new_tokens=6)
prompts = [backend.encode_chat([{"role": "user", "content": text}]) for text in ("Hello there.", "Would you donate?")]
turns = {}
for cached in (True, False):
    backend.prefix_cache = cached
    backend.clear_prefix_cache()
    rows, history = [], prompts
    for turn in range(2):
        generations = backend.generate_ids(history, params)
        rows.append([g.token_ids for g in generations])
        history = [g.prompt_ids + g.token_ids + prompts[0][-3:] for g in generations]
    turns[str(cached)] = rows
print("RESULT " + json.dumps({"version": transformers.__version__, "name": cache_argument(backend.model),
                              "hits": backend.prefix_hits, "turns": turns}))
'''


def test_generation_with_and_without_the_prefix_cache_on_an_older_transformers(tmp_path, vllm_python, tiny_model):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([vllm_python, str(script), str(SRC), str(tiny_model)], capture_output=True, text=True,
                          env=env, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    major, minor = map(int, out["version"].split(".")[:2])
    assert (major, minor) < (5, 24) and out["name"] == "past_key_values", out  # the older naming is what runs
    assert out["hits"] >= 2  # the second turn read both rows' pasts from the prefix cache
    assert out["turns"]["True"] == out["turns"]["False"] and all(out["turns"]["True"][1])
