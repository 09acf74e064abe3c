"""MkDocs hooks: pages say ``<!-- simpop:NAME ARG -->`` and the build writes that part from the library itself.

Tables of simulator kinds, env ids, shipped panels and GRPO variants come from their registries, and example
dialogues come from running the env (the benchmark's reference agent against its native simulator, through
:func:`simpop.evaluation.eval_run.evaluate_panel`), so no page can drift from the code or show an invented
dialogue. An unknown directive or a failing generator fails the build.
"""

from __future__ import annotations

import functools
import html
import json
import re
import tempfile
from typing import Any

MARKER = re.compile(r"<!--\s*simpop:(?P<name>[\w-]+)(?:\s+(?P<arg>[^\s>]+))?\s*-->")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def kinds(_: str | None) -> str:
    """Every registered simulator kind: name, what it is, its parameters and defaults."""
    import simpop.envs  # noqa: F401  (registers the benchmarks' native kinds)
    from simpop.seat import KINDS

    rows = ["| kind | what it is | needs a model | parameters (defaults) | trainable form | states a distribution |",
            "|---|---|---|---|---|---|"]
    for name, kind in KINDS.items():
        params = {**kind.decoding, **kind.extra}
        shown = ", ".join(f"`{k}={v!r}`" for k, v in params.items()) or "—"
        rows.append(f"| `{name}` | {_cell(kind.help)} | {'yes' if kind.needs_model else 'no'} | {shown} | "
                    f"{'yes' if kind.trainable else 'no'} | {'yes' if kind.distribution else 'no'} |")
    return "\n".join(rows)


def envs(prefix: str | None) -> str:
    """The registered env ids (those starting with ``prefix``) and their native simulators."""
    from simpop.envs import ids, spec

    rows = ["| env id | class | native simulator | arguments |", "|---|---|---|---|"]
    for env_id in ids():
        if prefix and not env_id.startswith(prefix):
            continue
        s = spec(env_id)
        rows.append(f"| `{env_id}` | `{s.entry_point}` | `{s.default_simulator}` | "
                    f"{_cell(', '.join(f'`{k}={v!r}`' for k, v in s.kwargs.items()) or '—')} |")
    return "\n".join(rows)


def panels(prefix: str | None) -> str:
    """The shipped panels whose name starts with ``prefix``: envs, description and members."""
    from simpop.evaluation.panels import named_panels, panel_definition

    out = []
    for name in named_panels():
        if prefix and not name.startswith(prefix):
            continue
        panel = panel_definition(name)
        out.append(f"**`{name}`** (for {', '.join(f'`{e}`' for e in panel.env)}): {panel.description}\n")
        out.append("| member | spec |\n|---|---|")
        out.extend(f"| `{member}` | `{spec}` |" for member, spec in panel.members.items())
        out.append("")
    if not out:
        raise ValueError(f"no shipped panel starts with {prefix!r}")
    return "\n".join(out)


def algorithms(_: str | None) -> str:
    """The GRPO-family variants of ``simpop.train.objectives.ALGORITHMS`` and their hook settings."""
    from dataclasses import fields

    from simpop.train.objectives import ALGORITHMS

    names = [f.name for f in fields(next(iter(ALGORITHMS.values())))]
    rows = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for algorithm in ALGORITHMS.values():
        rows.append("| " + " | ".join(f"`{getattr(algorithm, n)}`" for n in names) + " |")
    return "\n".join(rows)


@functools.lru_cache(maxsize=None)
def dialogue(env_id: str | None) -> str:
    """One dialogue of ``env_id``: its reference agent against its native simulator, run now (seed 0)."""
    import simpop
    from simpop.evaluation.eval_records import read_records
    from simpop.evaluation.eval_run import evaluate_panel
    from simpop.evaluation.policies import reference_policy
    from simpop.simulators.registry import load_panel

    if not env_id:
        raise ValueError("simpop:dialogue needs an env id")
    env = simpop.make(env_id)
    panel = load_panel({"name": "example", "members": {"native": "native"}}, env=env)
    with tempfile.TemporaryDirectory() as out:
        evaluate_panel(env_id, reference_policy(env), panel, episodes=1, seed=0, out=out,
                                 concurrency=1, policy_spec="reference")
        (record,) = read_records(f"{out}/episodes.jsonl")
    if record.error:
        raise RuntimeError(f"the example dialogue of {env_id} failed: {record.error}")
    lines = [f"Scenario `{record.scenario}`, seed {record.seed}: the reference agent (`--policy reference`) in "
             f"the policy seat, the native simulator (`native`) in the user seat. Outcome: reward "
             f"{record.reward:g}, success {record.success}, {record.turns} turns "
             f"({'terminated' if record.terminated else 'truncated'}).", ""]
    for turn in record.transcript:
        text = turn["text"]
        if len(text) > 600:
            text = text[:600] + " …"
        lines.append(f"> **{turn['seat']}**: {_quote(text)}\n>")
    outcome = {k: v for k, v in record.info.items() if k in ("donation", "donated", "outcome_source", "reward_info")}
    if outcome:
        lines += ["", "Final info (excerpt): `" + json.dumps(outcome, default=str)[:400] + "`"]
    return "\n".join(lines)


def _quote(text: str) -> str:
    """``text`` as literal Markdown inside a block quote (no emphasis, links or HTML from the dialogue)."""
    text = html.escape(text, quote=False)
    text = re.sub(r"([\\`*_\[\]{}#+!|~])", r"\\\1", text)
    return text.replace("\n", "  \n> ")


GENERATORS = {"kinds": kinds, "envs": envs, "panels": panels, "algorithms": algorithms, "dialogue": dialogue}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace every ``<!-- simpop:NAME ARG -->`` marker of the page with what its generator writes."""
    def render(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: unknown directive simpop:{name} (known: {sorted(GENERATORS)})")
        return GENERATORS[name](match["arg"])

    return MARKER.sub(render, markdown)
