"""The README's tour is code users copy: it must run as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

README = Path(__file__).resolve().parents[1] / "README.md"
KIND_SPEC = re.compile(r"`((?:frozen|verbalized|trainable|native|persuadee)[:?][^`\s]*)`")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_blocks_run():
    from simpop.simulators.population import Population

    blocks = _blocks("python")
    assert blocks
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["single"].action_space.n == 14
    assert isinstance(namespace["users"], Population) and len(namespace["users"].members) == 3


def test_readme_shows_the_two_quickstart_commands():
    text = README.read_text()
    assert "make run" in text and "make test" in text


def test_readme_spec_strings_and_panels_build():
    import simpop
    from simpop.seat import SimulatorSpec
    from simpop.simulators.registry import build_simulator, load_panel

    specs = KIND_SPEC.findall(README.read_text())
    assert {"verbalized:persuadee", "trainable:persuadee", "frozen:smollm2"} <= set(specs)
    for spec in specs:
        SimulatorSpec.parse(spec)  # raises on an unknown kind or parameter
    act_env = simpop.make("simpop/PersuasionAct-v0")
    for spec in specs:
        if "smollm2" not in spec:  # LLM kinds would load the model
            sim = build_simulator(spec, env=act_env)
            assert SimulatorSpec.parse(str(sim.spec)) == sim.spec
    panels = _blocks("yaml")
    assert panels
    for block in panels:
        panel = load_panel(yaml.safe_load(block), env=act_env)
        assert len(panel) == len(yaml.safe_load(block)["members"])


def test_readme_train_commands_parse():
    from simpop.seat import SimulatorSpec
    from simpop.train.objectives import ALGORITHMS

    commands = [c for block in _blocks("bash") for c in block.replace("\\\n", " ").splitlines()
                if c.startswith("simpop train ")]
    assert {c.split()[2] for c in commands} == {"grpo", "cotrain"}
    for command in commands:
        argv = shlex.split(command.split("#")[0])
        flags = dict(zip(argv[3::2], argv[4::2]))
        SimulatorSpec.parse(flags["--simulator"])
        assert flags.get("--algorithm", "grpo") in ALGORITHMS
