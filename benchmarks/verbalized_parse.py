"""Grammar-constrained verbalized sampling with SmolLM2: which library, at what cost, how reliable?

Every engine constrains the same left-padded batched ``generate()`` call of the embedded SmolLM2-135M
(same prompts, same seeds) to two schemas: ``basic``, ``k`` objects ``{"text": 1..max_chars characters,
"probability": number in [0, 1]}``, and ``simpop``, what :class:`simpop.simulators.verbalized.VerbalizedSimulator`
sends (basic + ``TEXT_PATTERN`` on texts + ``multipleOf: 0.01`` on probabilities). The prompts are the
simulator's own: the P4G persona and scenario, the audit's dialogue histories and the Verbalized
Sampling instructions. Engines:

- ``none``: no constraint (the old prompt-and-parse path; also the model's own step time);
- ``llguidance``: simpop's processor (:class:`simpop.agents.json_mask.JSONSchemaMask`), the
  engine of vLLM's ``guidance`` structured-output backend;
- ``xgrammar``: xgrammar's own transformers processor (``xgrammar.contrib.hf``), vLLM's default backend;
- ``lm-format-enforcer``: its transformers ``prefix_allowed_tokens_fn`` (its transformers module imports
  a path transformers 5 removed; the benchmark aliases it, which is itself a finding);
- ``outlines``: outlines' own engine (``outlines_core`` regex index) through ``outlines.backends``.

Printed per engine and temperature: one-off setup (tokenizer/vocabulary tables) and per-schema compile
seconds, the processor's milliseconds per decoding step (timed around the processor alone) and its ratio
to the model's step, the answers that are valid JSON for the schema, that ended within the token budget,
that :func:`~simpop.simulators.verbalized.parse_verbalized` could not use (the simulator's parse-failure
rate) or had to repair, and the mean distinct candidates per answer; an engine that rejects a schema is
listed as such. Engines whose package is missing are skipped. xgrammar 0.2.9 ignores ``maxLength`` next
to a ``pattern`` and ignores ``multipleOf`` (vLLM's ``auto`` backend choice sends such schemas to guidance
for that reason); lm-format-enforcer 0.11.3 rejects a pattern next to a length. Runs in about five
minutes on two otherwise idle CPU cores (one torch thread: two threads thrash on a loaded machine).

    python benchmarks/verbalized_parse.py [--engines llguidance,xgrammar] [--k 5] [--max-new-tokens 256]
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

ENGINES = ("none", "llguidance", "xgrammar", "lm-format-enforcer", "outlines")


@dataclass
class Row:
    engine: str
    schema: str
    temperature: float
    setup_s: float = 0.0
    compile_s: float = 0.0
    steps: int = 0
    processor_s: float = 0.0
    wall_s: float = 0.0
    answers: list[str] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    error: str | None = None


class Timed:
    """Wraps a logits processor and adds up the time spent in it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seconds = inner, 0.0

    def __call__(self, input_ids, scores):
        start = time.perf_counter()
        out = self.inner(input_ids, scores)
        self.seconds += time.perf_counter() - start
        return out


def basic_schema(schema: dict) -> dict:
    """``schema`` without :data:`TEXT_PATTERN` and ``multipleOf``: the plain verbalized schema every engine takes."""
    basic = copy.deepcopy(schema)
    item = basic["properties"]["responses"]["items"]["properties"]
    del item["text"]["pattern"], item["probability"]["multipleOf"]
    return basic


def valid_answer(text: str, schema: dict) -> bool:
    """Whether ``text`` is a JSON document valid for ``schema`` (a :func:`verbalized_schema`, maybe
    :func:`basic_schema`), checked here rather than by any engine: ``k`` items with only the two keys, text
    length (and pattern), probability in [0, 1] (with at most two decimals under ``multipleOf``)."""
    responses = schema["properties"]["responses"]
    k, text_schema = responses["minItems"], responses["items"]["properties"]["text"]
    hundredths = "multipleOf" in responses["items"]["properties"]["probability"]
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if not isinstance(value, dict) or set(value) != {"responses"} or not isinstance(value["responses"], list):
        return False
    items = value["responses"]
    return len(items) == k and all(
        isinstance(item, dict) and set(item) == {"text", "probability"}
        and isinstance(item["text"], str) and 1 <= len(item["text"]) <= text_schema["maxLength"]
        and ("pattern" not in text_schema or re.fullmatch(text_schema["pattern"], item["text"]) is not None)
        and isinstance(item["probability"], (int, float)) and not isinstance(item["probability"], bool)
        and 0 <= item["probability"] <= 1
        and (not hundredths or abs(item["probability"] * 100 - round(item["probability"] * 100)) < 1e-6)
        for item in items)


class Engines:
    """Builds each engine's processor factory for a schema (one-off setup and per-schema compile timed apart)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def build(self, engine: str, schema: dict):
        """``(setup_s, compile_s, factory)``; ``factory(rows)`` returns a fresh processor (None: unconstrained)."""
        b = self.backend
        if engine == "none":
            return 0.0, 0.0, lambda rows: None
        if engine == "llguidance":
            import llguidance

            from simpop.agents.json_mask import _JSON_LAYOUT, JSONSchemaMask

            start = time.perf_counter()
            tokenizer = b._llg()
            setup = time.perf_counter() - start
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_LAYOUT)  # uncached
            if llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)[0]:
                raise ValueError("llguidance rejects the schema")
            return setup, time.perf_counter() - start - setup, \
                lambda rows: JSONSchemaMask(tokenizer, grammar, rows, b.vocab_size)
        if engine == "xgrammar":
            import xgrammar as xgr
            import xgrammar.contrib.hf

            start = time.perf_counter()
            info = xgr.TokenizerInfo.from_huggingface(b.tokenizer, vocab_size=b.vocab_size,
                                                      stop_token_ids=b.eos_token_ids)
            compiler = xgr.GrammarCompiler(info)
            setup = time.perf_counter() - start
            compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
            return setup, time.perf_counter() - start - setup, \
                lambda rows: xgrammar.contrib.hf.LogitsProcessor(compiled)
        if engine == "lm-format-enforcer":
            import transformers.tokenization_utils_base

            # lmformatenforcer.integrations.transformers imports transformers.tokenization_utils (gone in v5).
            sys.modules.setdefault("transformers.tokenization_utils", transformers.tokenization_utils_base)
            from lmformatenforcer import JsonSchemaParser
            from lmformatenforcer.integrations.transformers import (
                build_token_enforcer_tokenizer_data, build_transformers_prefix_allowed_tokens_fn)
            from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor

            start = time.perf_counter()
            data = build_token_enforcer_tokenizer_data(b.tokenizer, vocab_size=b.vocab_size)
            setup = time.perf_counter() - start
            JsonSchemaParser(schema)
            return setup, time.perf_counter() - start - setup, lambda rows: PrefixConstrainedLogitsProcessor(
                build_transformers_prefix_allowed_tokens_fn(data, JsonSchemaParser(schema)), 1)
        if engine == "outlines":
            import outlines
            from outlines.backends.outlines_core import OutlinesCoreBackend, OutlinesCoreLogitsProcessor

            start = time.perf_counter()
            backend = OutlinesCoreBackend(outlines.from_transformers(b.model, b.tokenizer))
            setup = time.perf_counter() - start
            index = backend.get_json_schema_logits_processor(json.dumps(schema), whitespace_pattern=r" ?").index
            return setup, time.perf_counter() - start - setup, \
                lambda rows: OutlinesCoreLogitsProcessor(index, "torch")
        raise ValueError(f"unknown engine {engine!r}; engines: {', '.join(ENGINES)}")


def prompts_for(backend: Any, k: int, max_new_tokens: int, n: int):
    """``n`` verbalized prompts (token ids) of the P4G persuadee at the audit's histories, and the simulator."""
    import numpy as np

    import simpop
    from simpop.agents.base import SamplingParams
    from simpop.evaluation.audit import HISTORIES, observation_for
    from simpop.simulators.verbalized import VerbalizedSimulator

    env = simpop.make("simpop/Persuasion-v0")
    scenario_id = env.scenario_ids()[0]
    histories = [HISTORIES[i % len(HISTORIES)] for i in range(n)]
    observations = [observation_for(env, h, scenario_id, seed=0) for h in histories]
    sim = VerbalizedSimulator(backend, k=k, params=SamplingParams(max_new_tokens=max_new_tokens))
    sim.reset_batch([env.scenario] * n, [np.random.default_rng(i) for i in range(n)])
    return [backend.encode_chat(sim.chat(obs, i, sim.suffix)) for i, obs in enumerate(observations)], sim


def run(backend: Any, prompts: list[list[int]], factory, temperature: float, max_new_tokens: int, seed: int,
        row: Row) -> None:
    """One left-padded batched ``generate()`` under ``factory``'s processor; fills ``row``."""
    import torch
    import transformers

    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), backend.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, prompt in enumerate(prompts):
        ids[r, width - len(prompt):] = torch.tensor(prompt)
        mask[r, width - len(prompt):] = 1
    sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature,
                                                              "top_p": 1.0, "top_k": 0}
    config = transformers.GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=backend.eos_token_ids,
                                           pad_token_id=backend.pad_token_id, return_dict_in_generate=True,
                                           **sampling)
    processor = factory(len(prompts))
    timed = Timed(processor) if processor is not None else None
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.no_grad():
        out = backend.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                     logits_processor=transformers.LogitsProcessorList([timed] if timed else []))
    row.wall_s += time.perf_counter() - start
    row.processor_s += timed.seconds if timed else 0.0
    row.steps += out.sequences.shape[1] - width
    for tokens in out.sequences[:, width:].tolist():
        ends = [i for i, t in enumerate(tokens) if t in backend.eos_token_ids]
        row.ended.append(bool(ends))
        row.answers.append(backend.tokenizer.decode(tokens[: ends[0]] if ends else tokens, skip_special_tokens=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, from: " + ", ".join(ENGINES))
    parser.add_argument("--k", type=int, default=5, help="candidates per answer (default 5, the simulator's)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="token budget (default 256, the simulator's)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts = batch rows (default 4)")
    parser.add_argument("--temperatures", default="0,1",
                        help="temperatures of the simulator's schema runs, comma-separated (default 0,1)")
    parser.add_argument("--basic-temperatures", default="1",
                        help="temperatures of the basic-schema runs and the unconstrained baseline (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()

    import importlib.util

    from simpop.agents.transformers_backend import TransformersBackend
    from simpop.simulators.verbalized import parse_verbalized

    backend = TransformersBackend("smollm2", threads=args.threads)
    prompts, sim = prompts_for(backend, args.k, args.max_new_tokens, args.prompts)
    schemas = {"basic": basic_schema(sim.schema), "simpop": sim.schema}
    max_chars = sim.schema["properties"]["responses"]["items"]["properties"]["text"]["maxLength"]
    print(f"SmolLM2-135M, {len(prompts)} P4G verbalized prompts ({min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens) in one batch, k={args.k}, text <= {max_chars} chars, max_new_tokens={args.max_new_tokens}, "
          f"{args.threads} torch thread(s). Schemas: basic = text length + probability range; simpop = basic + "
          f"text pattern + probability multipleOf 0.01 (what VerbalizedSimulator sends)")
    engines = Engines(backend)
    modules = {"llguidance": "llguidance", "xgrammar": "xgrammar", "lm-format-enforcer": "lmformatenforcer",
               "outlines": "outlines"}
    temperatures = {"basic": [float(t) for t in args.basic_temperatures.split(",")],
                    "simpop": [float(t) for t in args.temperatures.split(",")]}
    rows: list[Row] = []
    for engine in args.engines.split(","):
        if engine in modules and importlib.util.find_spec(modules[engine]) is None:
            print(f"{engine}: not installed, skipped")
            continue
        for name, schema in schemas.items():
            if engine == "none" and name != "basic":
                continue  # unconstrained: the schema plays no part
            for temperature in temperatures[name]:
                row = Row(engine, "-" if engine == "none" else name, temperature)
                try:
                    row.setup_s, row.compile_s, factory = engines.build(engine, schema)
                    run(backend, prompts, factory, temperature, args.max_new_tokens, seed=0, row=row)
                except Exception as error:  # an engine that rejects the schema is a result, not a crash
                    row.error = f"{type(error).__name__}: {str(error).splitlines()[0][:90]}"
                    print(f"  {engine} {name} T={temperature:g}: {row.error}", flush=True)
                else:
                    print(f"  {engine} {name} T={temperature:g}: {row.steps} steps in {row.wall_s:.1f} s", flush=True)
                rows.append(row)

    baseline = [row for row in rows if row.engine == "none" and row.steps]
    model_step = sum(r.wall_s for r in baseline) / sum(r.steps for r in baseline) if baseline else None
    header = (f"{'engine':19s} {'schema':6s} {'T':>3s} {'setup s':>7s} {'compile s':>9s} {'proc ms/step':>12s} "
              f"{'x model step':>12s} {'valid':>6s} {'ended':>6s} {'parse fail':>10s} {'fmt repair':>10s} "
              f"{'distinct':>8s}")
    print("\n" + header + "\n" + "-" * len(header))
    report = []
    for row in rows:
        if row.error:
            print(f"{row.engine:19s} {row.schema:6s} {row.temperature:3g}   rejected: {row.error}")
            report.append({"engine": row.engine, "schema": row.schema, "temperature": row.temperature,
                           "error": row.error})
            continue
        results = [parse_verbalized(a, args.k) for a in row.answers]
        n = len(row.answers)
        proc_ms = 1000 * row.processor_s / row.steps
        step = model_step or (row.wall_s - row.processor_s) / row.steps
        valid = sum(valid_answer(a, schemas["basic" if row.schema == "-" else row.schema]) for a in row.answers)
        failures = sum(not r.ok for r in results)
        repaired = sum(r.format_repairs > 0 for r in results if r.ok)
        distinct = sum(len(r.candidates) for r in results if r.ok) / max(1, n - failures)
        print(f"{row.engine:19s} {row.schema:6s} {row.temperature:3g} {row.setup_s:7.2f} {row.compile_s:9.3f} "
              f"{proc_ms:12.2f} {proc_ms / 1000 / step:12.3f} {valid:>3d}/{n:<2d} {sum(row.ended):>3d}/{n:<2d} "
              f"{failures / n:10.3f} {repaired:>7d}/{n:<2d} {distinct:8.2f}")
        report.append({"engine": row.engine, "schema": row.schema, "temperature": row.temperature,
                       "setup_s": row.setup_s, "compile_s": row.compile_s, "processor_ms_per_step": proc_ms,
                       "model_ms_per_step": 1000 * step, "valid": valid, "ended": sum(row.ended), "answers": n,
                       "parse_failure_rate": failures / n, "format_repaired": repaired, "texts": row.answers})
    print("\nproc ms/step: time inside the processor per decoding step (x model step: over the unconstrained "
          "step); valid: JSON valid for the schema (the unconstrained row: for the basic schema); ended: end-of-turn "
          "within max_new_tokens; parse fail: parse_verbalized found no usable candidate (the simulator falls "
          "back); fmt repair: usable only after a format repair; distinct: candidates left after merging "
          "duplicates (of k).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
