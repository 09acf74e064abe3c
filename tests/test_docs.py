"""The documentation site (mkdocs.yml, docs/): it builds strictly, its code runs, and its API reference is documented.

A page's ``python`` blocks run in order as one script in a fresh interpreter, in a temporary folder (a block
fenced ``python title="NAME.py"`` is written to that file instead, importable by the later blocks); a page's
``simpop ...`` command lines must parse with the real command-line parser.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SRC = ROOT / "src"
TUTORIALS = sorted((DOCS / "tutorials").glob("*.md"))
#: Pages whose Python blocks are not tutorials but still run (fast, in-process-sized examples).
PAGES_WITH_CODE = ["simulators.md", "panels.md", "evaluation.md"]
#: simpop modules that are not in the API reference, and why (the CLI modules are documented by --help).
NOT_IN_REFERENCE = {"simpop.cli": "the command", "simpop.evaluation.eval_cli": "`simpop eval`",
                    "simpop.envs.persuasion.demo": "`simpop demo`", "simpop.envs.persuasion": "its own page",
                    "simpop.envs.tau2": "its own page", "simpop.envs.cooperbench": "its own page",
                    "simpop.integrations.openenv_cli": "`simpop openenv`"}
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```", re.S | re.M)


def _blocks(page: Path, language: str) -> list[tuple[str | None, str]]:
    """``(file name or None, code)`` of every block of ``language`` on ``page``, in order."""
    out = []
    for match in FENCE.finditer(page.read_text()):
        info = match["info"].strip()
        if info.split(" ")[0] != language:
            continue
        title = re.search(r'title="([^"]+)"', info)
        out.append((title.group(1) if title else None, match["body"]))
    return out


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(SRC), env.get("PYTHONPATH", "")])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               LITELLM_LOCAL_MODEL_COST_MAP="True", TOKENIZERS_PARALLELISM="false", NO_MKDOCS_2_WARNING="1")
    return env


def run_page(page: Path, tmp_path: Path, timeout: float = 600) -> str:
    """Run ``page``'s Python blocks as the module docstring says; returns the output (fails with it)."""
    blocks = _blocks(page, "python")
    assert blocks, f"{page.name} has no python blocks"
    script = []
    for title, code in blocks:
        if title:
            (tmp_path / title).write_text(code)
        else:
            script.append(code)
    (tmp_path / "page.py").write_text("\n".join(script))
    done = subprocess.run([sys.executable, "page.py"], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{page.name}'s code failed:\n{output[-4000:]}"
    return output


@pytest.mark.parametrize("page", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(page, tmp_path):
    output = run_page(page, tmp_path)
    if page.stem == "train":
        assert "held-out success" in output and (tmp_path / "runs/population/metrics.jsonl").is_file()
    if page.stem == "evaluate":
        assert (tmp_path / "evals/my-agent/summary.json").is_file()


def test_the_tutorials_are_the_four_promised():
    assert {p.stem for p in TUTORIALS} == {"train", "evaluate", "simulator-kind", "benchmark"}


@pytest.mark.parametrize("name", PAGES_WITH_CODE)
def test_page_code_runs(name, tmp_path):
    run_page(DOCS / name, tmp_path, timeout=300)


def _commands() -> list[tuple[str, str]]:
    commands = []
    for page in sorted(DOCS.rglob("*.md")):
        for _, block in _blocks(page, "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip().removesuffix("&").strip()  # `simpop serve ... &` runs in the background
                if line.startswith("simpop "):
                    commands.append((str(page.relative_to(DOCS)), line))
    return commands


def test_every_documented_command_parses():
    from simpop.cli import build_parser

    commands = _commands()
    assert len(commands) > 20
    for page, line in commands:
        argv = shlex.split(line)[1:]
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as exit:  # --help exits 0
            if exit.code:
                pytest.fail(f"{page}: `{line}` does not parse")


def test_a_wrong_flag_in_a_documented_command_is_caught():
    from simpop.cli import build_parser

    argv = ["eval", "--env", "simpop/PersuasionAct-v0", "--policies", "reference"]
    with pytest.raises(SystemExit):
        build_parser(argv).parse_args(argv)


def _reference_modules() -> set[str]:
    pages = (DOCS / "api").glob("*.md")
    return {m for page in [*pages, *(DOCS / "envs").glob("*.md")]
            for m in re.findall(r"^::: (\S+)", page.read_text(), flags=re.M)}


def _simpop_modules() -> set[str]:
    modules = set()
    for path in (SRC / "simpop").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if "mini" in parts:  # CooperBench's packaged task repositories are data
            continue
        modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def test_every_module_is_in_the_api_reference():
    reference = _reference_modules()
    missing = sorted(m for m in _simpop_modules() - reference
                     if m not in NOT_IN_REFERENCE and not m.endswith(".cli"))
    assert not missing, f"modules missing from docs/api/*.md (add a `::: module` line): {missing}"
    assert not reference - _simpop_modules(), "docs/api names a module that does not exist"


def _undocumented(root: str, modules: set[str]) -> list[str]:
    """Public modules, classes, functions and methods of ``modules`` without a docstring (inherited ones
    count, as the site shows them: griffe-inherited-docstrings)."""
    import griffe

    loader = griffe.GriffeLoader(search_paths=[str(root)], docstring_parser=griffe.Parser.google,
                                 extensions=griffe.load_extensions("griffe_inherited_docstrings"))
    package = loader.load("simpop")
    loader.resolve_aliases(external=False, implicit=False)
    missing = []

    def visit(obj, shown: bool) -> None:
        for name, member in obj.members.items():
            if member.is_alias or name.startswith("_"):
                continue
            if member.is_module:
                if member.path in modules:
                    if not member.docstring:
                        missing.append(member.path)
                    visit(member, True)
                else:
                    visit(member, False)
            elif shown and (member.is_class or member.is_function):
                if not member.docstring:
                    missing.append(member.path)
                if member.is_class:
                    visit(member, True)

    visit(package, "simpop" in modules)
    return missing


def test_every_public_name_in_the_api_reference_has_a_docstring():
    missing = _undocumented(str(SRC), _reference_modules())
    assert not missing, f"{len(missing)} public names without a docstring: {missing}"


def test_the_docstring_check_finds_a_missing_docstring(tmp_path):
    package = tmp_path / "simpop"
    package.mkdir()
    (package / "__init__.py").write_text('"""A package."""\n')
    (package / "thing.py").write_text('"""A module."""\n\n\ndef documented():\n    """Yes."""\n\n\n'
                                      'class Bare:\n    def method(self):\n        pass\n')
    assert _undocumented(str(tmp_path), {"simpop", "simpop.thing"}) == ["simpop.thing.Bare",
                                                                         "simpop.thing.Bare.method"]


def test_the_site_builds_strictly_into_a_static_folder(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=900)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "WARNING" not in output, output[-6000:]
    # Static: links are files (no directory URLs), so the folder opens from disk.
    index = (site / "index.html").read_text()
    assert 'href="getting-started.html"' in index
    # Generated parts: the kind table from the registry, dialogues from running the envs.
    simulators = (site / "simulators.html").read_text()
    from simpop.seat import KINDS

    assert all(f"<code>{kind}</code>" in simulators for kind in KINDS)
    persuasion = (site / "envs" / "persuasion.html").read_text()
    assert persuasion.count("<strong>persuadee</strong>") >= 4
    assert "simpop.agents.base.Backend" in (site / "api" / "agents.html").read_text()


LINK = re.compile(r"\]\((?P<target>[^)#\s]+\.md)(?:#[^)\s]*)?\)")


def _nav_pages(nav: list) -> list[str]:
    """The page paths of a ``mkdocs.yml`` nav (nested sections flattened)."""
    pages = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def _unreachable(docs: Path, nav: list) -> set[str]:
    """Pages of ``docs`` that no chain of relative Markdown links reaches from a page in ``nav``."""
    seen, todo = set(), [docs / page for page in _nav_pages(nav)]
    while todo:
        page = todo.pop().resolve()
        if page in seen or not page.is_file():
            continue
        seen.add(page)
        todo.extend(page.parent / m["target"] for m in LINK.finditer(page.read_text()) if "://" not in m["target"])
    pages = {p.resolve() for p in docs.rglob("*.md") if "hooks" not in p.relative_to(docs).parts}
    return {str(p.relative_to(docs.resolve())) for p in pages - seen}


def test_every_page_is_reachable_from_the_site_navigation():
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    orphans = _unreachable(DOCS, nav)
    assert not orphans, f"pages neither in mkdocs.yml's nav nor linked from a page that is: {sorted(orphans)}"
    assert {"results/collapse.md", "results/integrations.md"} <= set(_nav_pages(nav))


def test_the_reachability_check_finds_an_orphan(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "index.md").write_text("[run](howto.md#run) and [the web](https://example.org/x.md)")
    (tmp_path / "howto.md").write_text("[measured](results/runs.md)")
    (tmp_path / "results" / "runs.md").write_text("[back](../index.md)")
    (tmp_path / "results" / "orphan.md").write_text("nobody links here")
    assert _unreachable(tmp_path, [{"Home": "index.md"}]) == {"results/orphan.md"}


def test_a_broken_cross_reference_fails_the_strict_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the thing][simpop.no_such_module.Thing].\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text("site_name: t\ndocs_dir: docs\nplugins:\n  - autorefs\n")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir",
                           str(tmp_path / "site")], cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and "simpop.no_such_module.Thing" in done.stdout + done.stderr
